"""Large prompts never stall the server: tokenizing runs off the event loop, small jobs never queue
behind a large one, and a prompt that cannot fit max_model_len is refused before it is tokenized whole."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from twinserve.core.errors import PromptTooLongError

from .conftest import RunningServer, SlowStep, start_server, wait_for

TEN_MB = 10 * 1024 * 1024
WORDS = "the quick brown fox jumps over the lazy dog "


@pytest.fixture(scope="module")
def inproc_server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """One server for this module (the tokenizer path is the same whatever the core mode)."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


def _big_text() -> str:
    return (WORDS * (TEN_MB // len(WORDS) + 1))[:TEN_MB]


def _stream(url: str, gaps: list[float], done: threading.Event) -> None:
    body = {"model": "tiny", "prompt": "the quick brown", "max_tokens": 200, "ignore_eos": True, "stream": True}
    last = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            now = time.monotonic()
            if line.startswith("data: ") and last is not None:
                gaps.append(now - last)
            last = now
    done.set()


@pytest.mark.parametrize("path,body", [
    ("/tokenize", lambda t: {"model": "tiny", "prompt": t}),
    ("/v1/completions", lambda t: {"model": "tiny", "prompt": t, "max_tokens": 4}),
    ("/v1/chat/completions", lambda t: {"model": "tiny", "messages": [{"role": "user", "content": t}]}),
], ids=["tokenize", "completions", "chat"])
def test_a_10mb_body_stalls_no_stream_and_no_small_request(inproc_server: RunningServer, path: str,
                                                          body: Any) -> None:
    s = inproc_server
    raw = json.dumps(body(_big_text())).encode()
    assert len(raw) > TEN_MB
    slow = SlowStep(s, 0.02)  # 200 tokens then take >= 4 s: the big body lands mid-stream
    try:
        gaps: list[list[float]] = [[] for _ in range(4)]
        ends = [threading.Event() for _ in range(4)]
        threads = [threading.Thread(target=_stream, args=(s.url, g, e)) for g, e in zip(gaps, ends)]
        for t in threads:
            t.start()
        wait_for(lambda: all(len(g) >= 5 for g in gaps), timeout=60)
        big: dict[str, Any] = {}

        def send_big() -> None:
            big["r"] = httpx.post(s.url + path, content=raw, headers={"content-type": "application/json"},
                                  timeout=120)

        bt = threading.Thread(target=send_big)
        bt.start()
        time.sleep(0.3)  # the body is uploaded and being worked on
        t0 = time.monotonic()
        small = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                           timeout=60)
        small_s = time.monotonic() - t0
        t0 = time.monotonic()
        small_tok = httpx.post(s.url + "/tokenize", json={"model": "tiny", "prompt": "hi"}, timeout=60)
        small_tok_s = time.monotonic() - t0
        bt.join(120)
        for t in threads:
            t.join(120)
    finally:
        slow.stop()
    assert small.status_code == 200 and small_tok.status_code == 200
    assert small_s < 2.0 and small_tok_s < 2.0, (small_s, small_tok_s)
    assert all(e.is_set() for e in ends)
    worst = max(max(g) for g in gaps)
    assert worst < 1.0, f"a stream stalled for {worst:.2f} s"
    r = big["r"]
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] in ("prompt", "messages")


class _Recording:
    """A tokenizer wrapper that records the length of every text it is asked to tokenize."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lengths = inner, []

    def __call__(self, text: str, **kw: Any) -> Any:
        self.lengths.append(len(text))
        return self.inner(text, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_over_long_prompt_is_refused_after_tokenizing_a_bounded_prefix(inproc_server: RunningServer) -> None:
    from twinserve.backends.real.serving.tokenize_pool import TokenizerPool

    tok = inproc_server.engine.tokenizer
    pool = TokenizerPool(tok, 256)
    try:
        rec = _Recording(tok)
        text = WORDS * 100_000
        with pytest.raises(PromptTooLongError) as err:
            pool.encode(rec, text)
        assert err.value.num_tokens > 256 and err.value.limit == 256
        assert max(rec.lengths) <= pool.char_bound < len(text) // 100
        # A text that fits is tokenized whole, exactly as the tokenizer does.
        fits = WORDS * 5
        assert pool.encode(rec, fits) == list(tok(fits)["input_ids"])
        # truncate_prompt_tokens keeps the last N tokens, from a bounded tail.
        rec.lengths.clear()
        assert pool.encode(rec, text, add_special_tokens=False, truncate=10) == \
            list(tok(WORDS * 10, add_special_tokens=False)["input_ids"])[-10:]
        assert max(rec.lengths) <= pool.char_bound
    finally:
        pool.shutdown()


def test_truncate_prompt_tokens_keeps_the_prompt_tail(inproc_server: RunningServer) -> None:
    s = inproc_server
    long_prompt = WORDS * 400  # far over max_model_len (256)
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": long_prompt, "max_tokens": 2,
                                                    "truncate_prompt_tokens": 50, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 50
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": list(range(1, 300)),
                                                    "max_tokens": 2, "truncate_prompt_tokens": 20}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 20
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "truncate_prompt_tokens": 999},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
