"""Every field of vLLM's completion and chat request models is ours too: honoured, or refused naming it.

The names below are data, read from vLLM's CompletionRequest, ChatCompletionRequest and StreamOptions
(vllm-project/vllm, vllm/entrypoints/openai/protocol.py at 0052bed36509c7a5a2d8e48265334e40cf2f5a0e).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from twinserve.backends.real.serving.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from twinserve.backends.real.serving.request_fields import REFUSED

from .conftest import RunningServer, start_server

_SAMPLING = ("use_beam_search top_k min_p repetition_penalty length_penalty stop_token_ids "
             "include_stop_str_in_output ignore_eos min_tokens skip_special_tokens spaces_between_special_tokens "
             "truncate_prompt_tokens allowed_token_ids prompt_logprobs").split()
_EXTRA = ("guided_json guided_regex guided_choice guided_grammar guided_decoding_backend guided_whitespace_pattern "
          "priority request_id logits_processors return_tokens_as_token_ids cache_salt kv_transfer_params "
          "vllm_xargs add_special_tokens response_format").split()
VLLM_COMPLETION = set(("model prompt prompt_embeds best_of echo frequency_penalty logit_bias logprobs max_tokens n "
                       "presence_penalty seed stop stream stream_options suffix temperature top_p user").split()
                      + _SAMPLING + _EXTRA)
VLLM_CHAT = set(("messages model frequency_penalty logit_bias logprobs top_logprobs max_tokens max_completion_tokens "
                 "n presence_penalty response_format seed stop stream stream_options temperature top_p tools "
                 "tool_choice reasoning_effort include_reasoning parallel_tool_calls user best_of bad_words echo "
                 "add_generation_prompt continue_final_message documents chat_template chat_template_kwargs "
                 "mm_processor_kwargs structural_tag").split() + _SAMPLING + _EXTRA)
VLLM_STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """Fields are handled in the front end: one core mode suffices."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


@pytest.mark.parametrize("ours,theirs", [(CompletionRequest, VLLM_COMPLETION), (ChatCompletionRequest, VLLM_CHAT),
                                         (StreamOptions, VLLM_STREAM_OPTIONS)], ids=["completion", "chat", "stream"])
def test_every_vllm_field_is_declared(ours: Any, theirs: set[str]) -> None:
    assert sorted(theirs - set(ours.model_fields)) == []


_NOT_NEUTRAL = {"use_beam_search": True, "length_penalty": 0.5, "spaces_between_special_tokens": False,
                "include_reasoning": False, "logits_processors": ["m.P"], "prompt_embeds": "AAAA",
                "mm_processor_kwargs": {}, "kv_transfer_params": {}, "vllm_xargs": {}, "request_id": "r1",
                "reasoning_effort": "low", "structural_tag": "{}", "guided_whitespace_pattern": " ",
                "guided_decoding_backend": "outlines"}


@pytest.mark.parametrize("name", sorted([*REFUSED, "guided_decoding_backend"]))
def test_a_field_this_server_cannot_honour_is_a_400_naming_it(srv: RunningServer, name: str) -> None:
    chat_only = name in VLLM_CHAT - VLLM_COMPLETION
    path, body = ("/v1/chat/completions", CHAT) if chat_only else ("/v1/completions", {"prompt": "hi"})
    r = httpx.post(srv.url + path, json={"model": "tiny", "max_tokens": 2, **body, name: _NOT_NEUTRAL[name]},
                   timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name
    # Its neutral value changes nothing and is taken.
    neutral = {name: REFUSED[name][0][-1]} if name in REFUSED else {name: "xgrammar"}
    r = httpx.post(srv.url + path, json={"model": "tiny", "max_tokens": 2, **body, **neutral}, timeout=60)
    assert r.status_code == 200, r.text


def test_per_request_chat_template_and_documents_reach_the_template(srv: RunningServer) -> None:
    template = ("{% for d in documents %}DOC:{{ d.title }} {% endfor %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    r = httpx.post(srv.url + "/tokenize", json={"model": "tiny", **CHAT}, timeout=60)
    plain = r.json()["count"] if r.status_code == 200 else None
    body = {"model": "tiny", **CHAT, "max_tokens": 1, "chat_template": template,
            "documents": [{"title": "alpha", "text": "x"}], "echo": False}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    want = len(srv.engine.tokenizer("DOC:alpha hi", add_special_tokens=False)["input_ids"])
    assert r.json()["usage"]["prompt_tokens"] == want != plain


def test_add_special_tokens_is_honoured(srv: RunningServer) -> None:
    tok = srv.engine.tokenizer
    counts = {}
    for flag in (True, False):
        r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "hello there", "max_tokens": 1,
                                                          "add_special_tokens": flag}, timeout=60)
        assert r.status_code == 200, r.text
        counts[flag] = r.json()["usage"]["prompt_tokens"]
    assert counts[False] == len(tok("hello there", add_special_tokens=False)["input_ids"])
    assert counts[True] == len(tok("hello there", add_special_tokens=True)["input_ids"])


def test_return_tokens_as_token_ids(srv: RunningServer) -> None:
    r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3,
                                                      "logprobs": 2, "return_tokens_as_token_ids": True,
                                                      "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] and all(t.startswith("token_id:") and t[9:].isdigit() for t in lp["tokens"])
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)


def test_continuous_usage_stats_puts_usage_in_every_chunk(srv: RunningServer) -> None:
    import json

    r = httpx.post(srv.url + "/v1/completions", json={
        "model": "tiny", "prompt": "hello", "max_tokens": 6, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, timeout=60)
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    text_chunks = [c for c in chunks if c["choices"]]
    assert text_chunks and all(c["usage"] is not None for c in text_chunks)
    done = [c["usage"]["completion_tokens"] for c in text_chunks]
    assert done == sorted(done) and done[-1] == 6 == chunks[-1]["usage"]["completion_tokens"]
