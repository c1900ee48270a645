"""32 concurrent streaming clients, a quarter hanging up midway: nothing lost, every block freed."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import FrozenCore, RunningServer, SlowStep, wait_for

NUM_CLIENTS = 32
NUM_DISCONNECT = NUM_CLIENTS // 4
MAX_TOKENS = 24
LONG = 200  # tokens asked by the clients that hang up; they never get that far
HANG_UP_AFTER = 3  # chunks


def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics as name{labels} -> value (labels sorted, model_name left out)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _prompt(i: int) -> str:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "paged", "blocks"]
    return " ".join(words[(i + k) % len(words)] for k in range(3 + i % 5))


async def _client(c: openai.AsyncOpenAI, i: int) -> tuple[int, str, str | None, int | None, int]:
    """One streaming client; the first NUM_DISCONNECT hang up after a few chunks."""
    hang_up = i < NUM_DISCONNECT
    stream = await c.completions.create(model="tiny", prompt=_prompt(i), max_tokens=LONG if hang_up else MAX_TOKENS,
                                        temperature=0, stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True})
    text, finish, tokens, chunks = "", None, None, 0
    async for ch in stream:
        chunks += 1
        if ch.choices:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        if ch.usage is not None:
            tokens = ch.usage.completion_tokens
        if hang_up and chunks >= HANG_UP_AFTER:
            await stream.close()
            break
    return i, text, finish, tokens, chunks


async def _run_all(url: str) -> list[tuple[int, str, str | None, int | None, int]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 4)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120,
                                  http_client=httpx.AsyncClient(limits=limits, timeout=120)) as c:
        return list(await asyncio.gather(*(_client(c, i) for i in range(NUM_CLIENTS))))


def _wait_idle(server: RunningServer, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = server.state.async_engine.snapshot
        if snap.num_unfinished == 0 and snap.num_running == 0 and snap.num_waiting == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine still busy after {timeout} s: {server.state.async_engine.snapshot}")


def test_32_streams_quarter_disconnect_nothing_lost_all_blocks_free(make_server) -> None:
    server = make_server(max_num_seqs=64, num_gpu_blocks_override=512)
    kv = server.engine.core.scheduler.kv
    before = scrape(server.url)
    t0 = time.monotonic()
    results = asyncio.run(_run_all(server.url))
    elapsed = time.monotonic() - t0
    _wait_idle(server)

    completed = [r for r in results if r[0] >= NUM_DISCONNECT]
    assert len(completed) == NUM_CLIENTS - NUM_DISCONNECT
    for i, text, finish, tokens, _ in completed:
        assert finish == "length", (i, finish)
        assert tokens == MAX_TOKENS, (i, tokens)
    # Nothing lost or garbled under load: each stream equals the same request made alone afterwards.
    c = server.client()
    for i, text, *_ in completed[::6]:
        alone = c.completions.create(model="tiny", prompt=_prompt(i), max_tokens=MAX_TOKENS, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
        assert text == alone, i
    for i, _, finish, _, chunks in results[:NUM_DISCONNECT]:
        assert chunks == HANG_UP_AFTER and finish is None

    # Every KV block is free again (cached prefix blocks count as free), and /metrics says so.
    _wait_idle(server)
    assert kv.num_free_blocks == kv.num_blocks
    assert not server.engine.has_unfinished_requests()
    after = scrape(server.url)
    assert after["twinserve:num_requests_running{}"] == 0
    assert after["twinserve:num_requests_waiting{}"] == 0
    assert after["twinserve:kv_cache_usage_perc{}"] == 0.0
    assert after["twinserve:kv_cache_free_blocks{}"] == kv.num_blocks

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    n_alone = len(completed[::6])
    assert delta("twinserve:request_success_total{finished_reason=length}") == len(completed) + n_alone
    # The hung-up requests were aborted, not run to their 200 tokens.
    assert delta("twinserve:request_success_total{finished_reason=abort}") == NUM_DISCONNECT
    assert delta("twinserve:e2e_request_latency_seconds_count{}") == NUM_CLIENTS + n_alone
    gen = delta("twinserve:generation_tokens_total{}")
    ok_tokens = (len(completed) + n_alone) * MAX_TOKENS
    assert ok_tokens + NUM_DISCONNECT * HANG_UP_AFTER <= gen < ok_tokens + NUM_DISCONNECT * LONG
    print(f"32 streams (8 hung up) in {elapsed:.2f} s, torch threads 1")


def test_a_client_hanging_up_mid_stream_frees_its_blocks_at_once(make_server) -> None:
    server = make_server()
    SlowStep(server, 0.02)  # 200 tokens would take ~4 s
    kv = server.engine.core.scheduler.kv
    engine = server.state.async_engine
    body = {"model": "tiny", "prompt": _prompt(1), "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert kv.num_free_blocks < kv.num_blocks  # the request holds blocks while it streams
    assert all(g.startswith("data: ") or g == "" for g in got)
    freed_in = wait_for(lambda: kv.num_free_blocks == kv.num_blocks and engine.snapshot.num_running == 0,
                        timeout=2.0)
    assert freed_in < 1.0
    assert not server.engine.has_unfinished_requests()
    print(f"blocks freed {freed_in * 1e3:.0f} ms after the hang-up (step 20 ms + compute), torch threads 1")


def test_a_non_streamed_client_that_gives_up_is_aborted(make_server) -> None:
    server = make_server()
    SlowStep(server, 0.02)
    frozen = FrozenCore(server, 1.0)  # with the core in a process: held past the client's timeout
    kv = server.engine.core.scheduler.kv
    body = {"model": "tiny", "prompt": _prompt(2), "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    frozen.join()
    wait_for(lambda: kv.num_free_blocks == kv.num_blocks and not server.engine.has_unfinished_requests(),
             timeout=2.0)
    assert scrape(server.url)["twinserve:request_success_total{finished_reason=abort}"] == 1
