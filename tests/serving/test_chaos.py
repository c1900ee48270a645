"""Chaos: 100 concurrent streams, half of them hanging up midway, non-streamed requests abandoned,
and malformed requests interleaved. Afterwards /metrics shows nothing running and every KV block free,
and the engine still answers correctly."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx

from .conftest import RunningServer, wait_for

N_STREAMS = 100
MAX_TOKENS = 24

MALFORMED: list[tuple[str, bytes]] = [
    ("/v1/completions", b'{"model": "tiny", "prompt": '),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "top_k": 9223372036854775808}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "n": 0}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800", "stream": true}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [1, 2, -7], "echo": true, "logprobs": 1, "max_tokens": 0}'),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": []}'),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
                             b'"chat_template_kwargs": {"tokenize": false}}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "logit_bias": {"99999": 5}}'),
    ("/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": "hot"}'),
]


async def _stream(client: httpx.AsyncClient, url: str, i: int, hang_up: bool) -> int:
    body = {"model": "tiny", "prompt": f"the quick brown fox {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.8, "seed": i,
            "logprobs": 1 if i % 3 == 0 else None}
    chunks, tokens = 0, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            chunks += 1
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if hang_up and chunks >= 2:
                return -1  # leaving the block closes the connection mid-stream
    return tokens


async def _abandoned(client: httpx.AsyncClient, url: str, i: int) -> None:
    body = {"model": "tiny", "prompt": f"paged attention {i}", "max_tokens": 200, "ignore_eos": True}
    try:
        await asyncio.wait_for(client.post(url + "/v1/completions", json=body), timeout=0.3)
    except asyncio.TimeoutError:
        pass


async def _malformed(client: httpx.AsyncClient, url: str, k: int) -> int:
    path, raw = MALFORMED[k % len(MALFORMED)]
    r = await client.post(url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, (raw[:80], r.status_code, r.text[:300])
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    return r.status_code


async def _chaos(url: str) -> list[Any]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        jobs: list[Any] = []
        for i in range(N_STREAMS):
            jobs.append(_stream(client, url, i, hang_up=i % 2 == 1))
            if i % 4 == 0:
                jobs.append(_malformed(client, url, i // 4))
            if i % 10 == 0:
                jobs.append(_abandoned(client, url, i))
        return await asyncio.gather(*jobs)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^twinserve:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_chaos_leaves_nothing_running_and_every_block_free(make_server) -> None:
    server: RunningServer = make_server(max_num_seqs=32)
    results = asyncio.run(_chaos(server.url))
    streams = [r for r in results if isinstance(r, int) and r != 400]
    assert streams.count(-1) == N_STREAMS // 2
    assert streams.count(MAX_TOKENS) == N_STREAMS // 2  # every stream that stayed got all its tokens
    assert results.count(400) == N_STREAMS // 4
    engine = server.state.async_engine
    wait_for(lambda: engine.snapshot.num_unfinished == 0 and engine.num_unfinished == 0, timeout=60)
    # One more step's snapshot after the last abort, then the gauges must read empty.
    ok = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "the lazy dog", "max_tokens": 5,
                                                          "ignore_eos": True, "temperature": 0}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
    wait_for(lambda: engine.snapshot.num_unfinished == 0, timeout=30)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert _metric(text, "num_requests_running") == 0
    assert _metric(text, "num_requests_waiting") == 0
    assert _metric(text, "kv_cache_usage_perc") == 0
    assert _metric(text, "kv_cache_free_blocks") == server.engine.scheduler_config.num_blocks
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    again = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "the lazy dog", "max_tokens": 5,
                                                             "ignore_eos": True, "temperature": 0}, timeout=60)
    assert again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
