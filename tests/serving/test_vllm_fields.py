"""vLLM's request fields and server flags: each is honoured as vLLM defines it, or refused naming it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import RunningServer, SlowStep, start_server

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """A plain server: these fields are handled in the front end, whatever the core mode."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


def _post(s: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(s.url + path, json={"model": "tiny", **body}, timeout=60)


def _greedy(s: RunningServer, **kw: Any) -> dict[str, Any]:
    r = _post(s, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_include_stop_str_in_output_keeps_the_stop_string(srv: RunningServer) -> None:
    text = _greedy(srv)["choices"][0]["text"]
    stop = text[3:5]
    assert stop and stop not in text[:3]
    cut = _greedy(srv, stop=[stop])["choices"][0]
    kept = _greedy(srv, stop=[stop], include_stop_str_in_output=True)["choices"][0]
    assert cut["text"] == text[:3] and cut["finish_reason"] == "stop"
    assert kept["text"] == text[:5] and kept["finish_reason"] == "stop"


def test_allowed_token_ids_restricts_every_sampled_token(srv: RunningServer) -> None:
    allowed = [40, 41, 42]
    r = _post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "seed": 1,
                                       "allowed_token_ids": allowed, "logprobs": 0})
    assert r.status_code == 200, r.text
    texts = {srv.state.token_texts(t) for t in allowed}
    assert set(r.json()["choices"][0]["logprobs"]["tokens"]) <= texts
    bad = _post(srv, "/v1/completions", {"prompt": PROMPT, "allowed_token_ids": [10 ** 6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "allowed_token_ids"


def test_prompt_logprobs_in_vllms_shape(srv: RunningServer) -> None:
    ids = srv.engine.tokenizer(PROMPT)["input_ids"]
    body = _greedy(srv, prompt_logprobs=2)
    plp = body["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for tid, entry in zip(ids[1:], plp[1:]):
        assert str(tid) in entry and 2 <= len(entry) <= 3
        assert all({"logprob", "rank", "decoded_token"} == set(v) for v in entry.values())
    chat = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                "prompt_logprobs": 1})
    assert chat.status_code == 200 and chat.json()["prompt_logprobs"][0] is None
    streamed = _post(srv, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


def test_bad_words_is_refused_naming_the_field(srv: RunningServer) -> None:
    r = _post(srv, "/v1/completions", {"prompt": PROMPT, "bad_words": ["fox"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words"


# Each turn ends with a marker, so continuing the final message (no marker after it) shows.
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}<end>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_chat_template_flag_continue_final_message_add_generation_prompt_and_echo(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="inproc", config_kw={"chat_template": TEMPLATE})
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the quick"}]
    tok = s.engine.tokenizer

    def prompt_ids(**kw: Any) -> list[int]:
        r = _post(s, "/tokenize", {"messages": msgs, **kw})
        assert r.status_code == 200, r.text
        gen = _post(s, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "ignore_eos": True, **kw})
        assert gen.status_code == 200, gen.text
        assert gen.json()["usage"]["prompt_tokens"] == r.json()["count"]
        return r.json()["tokens"]

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    try:
        assert prompt_ids() == ids("<user>hi<end><assistant>the quick<end><assistant>")
        assert prompt_ids(add_generation_prompt=False) == ids("<user>hi<end><assistant>the quick<end>")
        assert prompt_ids(continue_final_message=True, add_generation_prompt=False) == \
            ids("<user>hi<end><assistant>the quick")
        both = _post(s, "/v1/chat/completions", {"messages": msgs, "continue_final_message": True})
        assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
        echoed = _post(s, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "ignore_eos": True,
                                                    "echo": True, "continue_final_message": True,
                                                    "add_generation_prompt": False, "temperature": 0})
        plain = _post(s, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "ignore_eos": True,
                                                   "continue_final_message": True,
                                                   "add_generation_prompt": False, "temperature": 0})
        assert echoed.json()["choices"][0]["message"]["content"] == \
            "the quick" + plain.json()["choices"][0]["message"]["content"]
    finally:
        s.stop()


def test_cache_salt_separates_prefix_cache_entries(srv: RunningServer) -> None:
    prompt = "a shared prefix " * 8

    def cached(**kw: Any) -> int:
        r = _post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 1, **kw})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached(cache_salt="alice")
    assert cached(cache_salt="alice") > 0
    assert cached(cache_salt="bob") == 0
    bad = _post(srv, "/v1/completions", {"prompt": prompt, "cache_salt": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_priority_needs_the_priority_policy(srv: RunningServer) -> None:
    r = _post(srv, "/v1/completions", {"prompt": PROMPT, "priority": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


def test_priority_orders_the_queue_under_the_priority_policy(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="inproc", policy="priority", max_num_seqs=1)
    slow = SlowStep(s, 0.02)
    done: list[str] = []

    def run(name: str, priority: int, max_tokens: int) -> None:
        r = _post(s, "/v1/completions", {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                                         "priority": priority})
        assert r.status_code == 200, r.text
        done.append(name)

    try:
        first = threading.Thread(target=run, args=("first", 0, 40))
        first.start()
        time.sleep(0.3)  # running; the next two queue behind it
        low = threading.Thread(target=run, args=("low", 10, 3))
        low.start()
        time.sleep(0.2)
        high = threading.Thread(target=run, args=("high", -5, 3))
        high.start()
        for t in (first, low, high):
            t.join(60)
    finally:
        slow.stop()
        s.stop()
    assert done == ["first", "high", "low"]


def test_max_logprobs_raises_the_cap(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="inproc", max_logprobs=30)
    try:
        ok = _post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                               "logprobs": True, "top_logprobs": 30})
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 30
        over = _post(s, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "logprobs": 31})
        assert over.status_code == 400 and over.json()["error"]["param"] == "logprobs"
    finally:
        s.stop()
