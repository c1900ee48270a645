"""Hostile and careless clients: each mistake is a 4xx in OpenAI's shape, and the engine keeps serving."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from .conftest import RunningServer, wait_for

GOOD = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 3, "ignore_eos": True}


def _post(server: RunningServer, path: str, body: Any = None, content: bytes | None = None,
          headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(server.url + path, json=body if content is None else None, content=content,
                      headers=headers or {"content-type": "application/json"}, timeout=60)


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def _alive(server: RunningServer) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    r = _post(server, "/v1/completions", GOOD)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "the quick brown fox"}]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {**GOOD, "top_k": 2 ** 63}, "top_k"),
    ("/v1/completions", {**GOOD, "seed": 2 ** 64 + 1}, "seed"),
    ("/v1/completions", {**GOOD, "temperature": 1e39}, "temperature"),
    ("/v1/completions", {**GOOD, "stop_token_ids": [2 ** 63]}, "stop_token_ids"),
    ("/v1/completions", {**GOOD, "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {**GOOD, "logit_bias": {"99999": 1}}, "logit_bias"),
    ("/v1/completions", {**GOOD, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {**GOOD, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {**GOOD, "n": 3000}, "n"),
    (CHAT, {"model": "tiny", "messages": []}, "messages"),
    (CHAT, {"model": "tiny", "messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs"),
    (CHAT, {"model": "tiny", "messages": MSG, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    (CHAT, {"model": "tiny", "messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"model": "tiny", "messages": MSG, "logprobs": True, "top_logprobs": 30}, "top_logprobs"),
])
def test_client_errors_are_400_and_the_engine_lives(server: RunningServer, path: str, body: Any,
                                                    param: str) -> None:
    _error(_post(server, path, body), 400, param)
    _alive(server)


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 2}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "x\\udfffy"}]}',
    b'{"model": "tiny", "prompt": "x", "stop": ["\\ud800"]}',
    b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "tiny", "messages": [{"role": "user", "content": "x", "extra": ' + b"[" * 500 + b"]" * 500 + b"}]}",
])
def test_malformed_text_and_nesting_are_400(server: RunningServer, raw: bytes) -> None:
    path = CHAT if b"messages" in raw else "/v1/completions"
    _error(_post(server, path, content=raw), 400)
    _alive(server)


def test_body_limit_is_413_with_or_without_content_length(make_server) -> None:
    s = make_server(config_kw={"max_request_body_bytes": 4096})
    big = {**GOOD, "prompt": "fox " * 2000}
    _error(_post(s, "/v1/completions", big), 413)

    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(100):
            yield b"fox " * 50
        yield b'"}'
    r = httpx.post(s.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    _error(r, 413)
    _alive(s)


def test_tokenization_runs_off_the_event_loop(make_server) -> None:
    s = make_server()
    engine = s.engine
    inner = engine.tokenize_prompt
    entered = threading.Event()

    def slow(prompt: Any) -> Any:
        entered.set()
        time.sleep(3.0)  # a huge prompt's tokenization, stood in for by a sleep
        return inner(prompt)

    engine.tokenize_prompt = slow
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.setdefault("r", _post(s, "/v1/completions", GOOD)))
    t.start()
    assert entered.wait(10)
    t0 = time.monotonic()
    assert httpx.get(s.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - t0 < 1.5  # answered while the tokenizer was still busy
    t.join(30)
    assert result["r"].status_code == 200


def test_tiny_temperature_is_greedy_over_http(server: RunningServer) -> None:
    base = {**GOOD, "max_tokens": 8}
    greedy = _post(server, "/v1/completions", {**base, "temperature": 0}).json()["choices"][0]["text"]
    tiny = _post(server, "/v1/completions", {**base, "temperature": 1e-45, "seed": 3}).json()["choices"][0]["text"]
    assert tiny == greedy


def test_logit_bias_through_the_openai_client(server: RunningServer) -> None:
    client = server.client()
    tok = server.engine.tokenizer
    target = tok("fox")["input_ids"][0]
    out = client.completions.create(model="tiny", prompt="the lazy dog", max_tokens=4, temperature=0,
                                    logit_bias={str(target): 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text == tok.decode([target] * 4)
    chat = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3, temperature=0.9, seed=2,
                                          logit_bias={str(target): 100}, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == tok.decode([target] * 3)
