"""Request bounds as vLLM has them: stream_options needs stream, stop lists are bounded; an abandoned
non-streamed request is aborted quietly (no traceback in the log)."""

from __future__ import annotations

import logging

import httpx
import pytest

from twinserve.backends.real.serving.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS

from .conftest import FrozenCore, RunningServer, SlowStep, wait_for


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_stream_options_without_stream_is_400(server: RunningServer, path: str, body: dict) -> None:
    for stream in (False, None):
        extra = {} if stream is None else {"stream": stream}
        r = httpx.post(server.url + path, json={"model": "tiny", "max_tokens": 2, **body, **extra,
                                                "stream_options": {"include_usage": True}}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stream_options"
    r = httpx.post(server.url + path, json={"model": "tiny", "max_tokens": 2, **body, "stream": True,
                                            "stream_options": {"include_usage": True}}, timeout=60)
    assert r.status_code == 200 and '"usage"' in r.text


@pytest.mark.parametrize("stop,limit", [
    ([f"s{i}" for i in range(MAX_STOP_STRINGS + 1)], str(MAX_STOP_STRINGS)),
    (["x" * (MAX_STOP_CHARS // 2 + 1)] * 2, str(MAX_STOP_CHARS)),
    ("y" * (MAX_STOP_CHARS + 1), str(MAX_STOP_CHARS)),
])
def test_stop_lists_are_bounded(server: RunningServer, stop: list[str] | str, limit: str) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                         "stop": stop}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stop" and limit in err["message"]
    at_limit = [f"s{i}" for i in range(MAX_STOP_STRINGS)]
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                         "stop": at_limit}, timeout=60)
    assert r.status_code == 200, r.text


def test_an_abandoned_non_streamed_request_logs_no_traceback(make_server, caplog) -> None:
    server = make_server()
    SlowStep(server, 0.02)
    frozen = FrozenCore(server, 1.0)
    kv = server.engine.core.scheduler.kv
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 200, "ignore_eos": True}
    with caplog.at_level(logging.INFO):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
        frozen.join()
        wait_for(lambda: kv.num_free_blocks == kv.num_blocks and not server.engine.has_unfinished_requests(),
                 timeout=3.0)
        # The access log writes its line once the handler returns: wait for it.
        wait_for(lambda: any("499" in r.getMessage() for r in caplog.records), timeout=3.0)
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert noisy == [], [(r.name, r.getMessage()) for r in noisy]
    # The hang-up leaves one quiet line: the access log's 499, at info.
    (line,) = [r for r in caplog.records if r.name == "twinserve.access" and " 499 " in r.getMessage()]
    assert line.levelno == logging.INFO and "client closed the request" in line.getMessage()


class _Counting:
    """Wraps a callable attribute and counts its calls."""

    def __init__(self, obj, name: str) -> None:
        self.obj, self.name, self.inner, self.calls = obj, name, getattr(obj, name), 0
        setattr(obj, name, self)

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.inner(*a, **kw)

    def restore(self) -> None:
        setattr(self.obj, self.name, self.inner)


def test_a_batch_whose_first_prompt_cannot_fit_is_refused_before_the_rest_is_tokenized(server: RunningServer) -> None:
    limit = server.engine.max_model_len
    too_long = "ab cd " * (limit * 2)
    assert len(server.engine.tokenizer(too_long)["input_ids"]) > limit
    enc = _Counting(server.state.tokenizers, "encode")
    try:
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": [too_long] * 20,
                                                             "max_tokens": 1}, timeout=60)
    finally:
        enc.restore()
    assert r.status_code == 400, r.text
    assert "prompt[0]" in r.json()["error"]["message"]
    assert enc.calls == 1


def test_a_token_id_prompt_over_the_limit_is_refused_before_its_ids_are_checked(server: RunningServer) -> None:
    limit = server.engine.max_model_len
    check = _Counting(server.engine, "tokenize_prompt")
    try:
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": [5] * (limit * 50),
                                                             "max_tokens": 1}, timeout=60)
    finally:
        check.restore()
    assert r.status_code == 400, r.text
    assert check.calls == 0
    r = httpx.post(server.url + "/detokenize", json={"model": "tiny", "tokens": [5] * 5000 + [10 ** 9]}, timeout=60)
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/detokenize", json={"model": "tiny", "tokens": [5, 6, 7]}, timeout=60)
    assert r.status_code == 200 and isinstance(r.json()["prompt"], str)
