"""Every field of vLLM's completion and chat request models is ours too: honoured, or refused naming it.

The field names below are data, read from vLLM's request models in vllm/entrypoints/openai/protocol.py
(vllm-project/vllm) at two commits of main: 0052bed36509c7a5a2d8e48265334e40cf2f5a0e (the v0.10-era API with
guided_* fields; it holds PR #23126's openai>=1.100 import shim, merged 2025-08-18, and not PR #22587's
return_token_ids) and ec3b890c14b00f6670515d9df8d503b5270e95ca (later: structured_outputs and return_token_ids
in, guided_* and chat's best_of out). Neither commit could be matched to a release tag from here, and vLLM
cannot be installed here, so the lists are recorded, not imported.
test_every_vllm_field_is_honoured_or_refused sends each one through the API: there is no third, silent class.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from twinserve.backends.real.serving.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from twinserve.backends.real.serving.request_fields import REFUSED

from .conftest import RunningServer, start_server

_OPENAI_COMPLETION = ("model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n presence_penalty "
                      "seed stop stream stream_options suffix temperature top_p user").split()
_OPENAI_CHAT = ("messages model frequency_penalty logit_bias logprobs top_logprobs max_tokens max_completion_tokens n "
                "presence_penalty response_format seed stop stream stream_options temperature top_p tools "
                "tool_choice reasoning_effort include_reasoning parallel_tool_calls user").split()
_SAMPLING = ("use_beam_search top_k min_p repetition_penalty length_penalty stop_token_ids "
             "include_stop_str_in_output ignore_eos min_tokens skip_special_tokens spaces_between_special_tokens "
             "truncate_prompt_tokens allowed_token_ids prompt_logprobs").split()
_COMMON_EXTRA = ("priority request_id logits_processors return_tokens_as_token_ids cache_salt kv_transfer_params "
                 "vllm_xargs").split()
_GUIDED = ("guided_json guided_regex guided_choice guided_grammar guided_decoding_backend "
           "guided_whitespace_pattern").split()
_CHAT_EXTRA = ("echo add_generation_prompt continue_final_message add_special_tokens documents chat_template "
               "chat_template_kwargs mm_processor_kwargs").split()

# At 0052bed.
VLLM_COMPLETION_0052 = {*_OPENAI_COMPLETION, "prompt_embeds", *_SAMPLING, "add_special_tokens", "response_format",
                        *_GUIDED, *_COMMON_EXTRA}
VLLM_CHAT_0052 = {*_OPENAI_CHAT, "best_of", *_SAMPLING, "bad_words", *_CHAT_EXTRA, *_GUIDED, "structural_tag",
                  *_COMMON_EXTRA}
# At ec3b890: guided_* folded into structured_outputs; return_token_ids added; chat has no best_of.
VLLM_COMPLETION_EC3B = ({*_OPENAI_COMPLETION, "prompt_embeds", *_SAMPLING, "add_special_tokens", "response_format",
                         "structured_outputs", "return_token_ids", *_COMMON_EXTRA})
VLLM_CHAT_EC3B = {*_OPENAI_CHAT, *_SAMPLING, "bad_words", *_CHAT_EXTRA, "structured_outputs", "return_token_ids",
                  *_COMMON_EXTRA}
VLLM_STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}  # the same at both commits

VLLM_COMPLETION = VLLM_COMPLETION_0052 | VLLM_COMPLETION_EC3B
VLLM_CHAT = VLLM_CHAT_0052 | VLLM_CHAT_EC3B

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Fields are handled in the front end: one core mode suffices. The tokenizer adds a BOS (its EOS token,
    as GPT-2-style tokenizers do), so add_special_tokens has something to add."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from tests.real.conftest import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path_factory.mktemp("bos_tiny"))
    tok = AutoTokenizer.from_pretrained(str(folder))
    eos = tok.eos_token
    tok._tokenizer.post_processor = TemplateProcessing(single=f"{eos} $A", pair=f"{eos} $A $B",
                                                       special_tokens=[(eos, tok.eos_token_id)])
    tok.save_pretrained(str(folder))
    s = start_server(folder, engine_core_mode="inproc")
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


def _text_of(tok: Any, ids: list[int]) -> str:
    """The text the server gives for these ids (special tokens skipped, a cut character's tail dropped)."""
    return tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": ["hello there", "bye"], "n": 2}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})],
                         ids=["completion", "chat"])
def test_return_token_ids_in_vllms_shape(srv: RunningServer, path: str, body: dict[str, Any]) -> None:
    chat = "messages" in body
    body = {"model": "tiny", "max_tokens": 5, "ignore_eos": True, "temperature": 0, "return_token_ids": True, **body}
    full = httpx.post(srv.url + path, json=body, timeout=60).json()
    choices = full["choices"]
    assert all(len(c["token_ids"]) == 5 for c in choices)
    assert full["usage"]["completion_tokens"] == 5 * len(choices)
    tok = srv.engine.tokenizer
    if chat:
        assert len(full["prompt_token_ids"]) == full["usage"]["prompt_tokens"]
        assert _text_of(tok, choices[0]["token_ids"]) == choices[0]["message"]["content"]
    else:
        want = [tok(p)["input_ids"] for p in body["prompt"]]
        assert [c["prompt_token_ids"] for c in choices] == [want[c["index"] // 2] for c in choices]
        assert [_text_of(tok, c["token_ids"]) for c in choices] == [c["text"] for c in choices]
    # Streamed: prompt_token_ids once (chat: on the first chunk; completions: each choice's first chunk),
    # token_ids per chunk, adding up to the same ids.
    r = httpx.post(srv.url + path, json={**body, "stream": True}, timeout=60)
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    streamed: dict[int, list[int]] = {}
    prompt_ids: dict[int, list[list[int]]] = {}
    for ch in chunks:
        for c in ch["choices"]:
            streamed.setdefault(c["index"], []).extend(c["token_ids"])
            if "prompt_token_ids" in c:
                prompt_ids.setdefault(c["index"], []).append(c["prompt_token_ids"])
    assert streamed == {c["index"]: c["token_ids"] for c in choices}
    if chat:
        assert [ch["prompt_token_ids"] for ch in chunks if "prompt_token_ids" in ch] == [full["prompt_token_ids"]]
    else:
        assert prompt_ids == {c["index"]: [c["prompt_token_ids"]] for c in choices}


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


# ---- The walk: every vLLM field sent through the API, with a value that is not its default ----

# A template that shows what a chat request hands it: documents, tools, a chat_template_kwargs variable,
# every message with an end mark (continue_final_message cuts the last one), and the generation prompt.
_TEMPLATE = ("{% for d in documents or [] %}[{{ d.title }}]{% endfor %}"
             "{% for t in tools or [] %}({{ t.function.name }}){% endfor %}{{ flavour or '' }}"
             "{% for m in messages %}<{{ m.role }}>{{ m.content }}<end>{% endfor %}"
             "{% if add_generation_prompt %}<bot>{% endif %}")
_TOOLS = [{"type": "function", "function": {"name": "get_w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
_PREFILL = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
            "add_generation_prompt": False, "continue_final_message": True, "chat_template": _TEMPLATE}

# field -> (what must happen, the value sent, what the baseline request holds besides the endpoint's own).
# "honoured": a 200 whose answer, the engine's inputs (prompt ids, SamplingParams, priority, cache salt) or the
# access-log line differ from the baseline's. "refused": a 4xx whose error names the field.
_H, _R = "honoured", "refused"
_CASES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    # OpenAI's own
    "model": (_R, "no-such-model", {}),  # a name this server does not serve is a 404 naming `model`
    "prompt": (_H, "bye now", {}),
    "messages": (_H, [{"role": "user", "content": "bye now"}], {}),
    "best_of": (_R, 2, {}),
    "echo": (_H, True, {}),
    "frequency_penalty": (_H, 0.5, {}),
    "presence_penalty": (_H, 0.5, {}),
    "logit_bias": (_H, {"5": 2.0}, {}),
    "max_tokens": (_H, 2, {}),
    "max_completion_tokens": (_H, 2, {}),
    "n": (_H, 2, {}),
    "seed": (_H, 7, {}),
    "stop": (_H, ["zz"], {}),
    "stream": (_H, True, {}),
    "stream_options": (_H, {"include_usage": True}, {"stream": True}),
    "suffix": (_R, "tail", {}),
    "temperature": (_H, 0.7, {}),
    "top_p": (_H, 0.5, {}),
    "user": (_H, "alice", {}),  # named on the access-log line
    "response_format": (_H, {"type": "json_object"}, {}),
    "tools": (_H, _TOOLS, {"tool_choice": "none", "chat_template": _TEMPLATE}),
    "tool_choice": (_H, "required", {"tools": _TOOLS, "tool_choice": "none"}),
    "parallel_tool_calls": (_H, False, {"tools": _TOOLS, "tool_choice": "required"}),
    "reasoning_effort": (_R, "low", {}),
    "include_reasoning": (_R, False, {}),
    # vLLM's sampling extras
    "use_beam_search": (_R, True, {}),
    "top_k": (_H, 5, {}),
    "min_p": (_H, 0.1, {}),
    "repetition_penalty": (_H, 1.3, {}),
    "length_penalty": (_R, 0.5, {}),
    "stop_token_ids": (_H, [5], {}),
    "include_stop_str_in_output": (_H, True, {}),
    "ignore_eos": (_H, True, {}),
    "min_tokens": (_H, 2, {}),
    "skip_special_tokens": (_H, False, {}),
    "spaces_between_special_tokens": (_R, False, {}),
    "truncate_prompt_tokens": (_H, 2, {}),
    "allowed_token_ids": (_H, [5, 6, 7], {}),
    "prompt_logprobs": (_H, 1, {}),
    "bad_words": (_R, ["x"], {}),
    # vLLM's other extras
    "add_special_tokens": (_H, None, {}),  # the value: the opposite of the endpoint's default
    "echo@chat": (_H, True, _PREFILL),
    "add_generation_prompt": (_H, False, {"chat_template": _TEMPLATE}),
    "continue_final_message": (_H, True, {**_PREFILL, "continue_final_message": False}),
    "documents": (_H, [{"title": "alpha", "text": "x"}], {"chat_template": _TEMPLATE}),
    "chat_template": (_H, _TEMPLATE, {}),
    "chat_template_kwargs": (_H, {"flavour": "spicy"}, {"chat_template": _TEMPLATE}),
    "mm_processor_kwargs": (_R, {"num_crops": 4}, {}),
    "prompt_embeds": (_R, "AAAA", {}),
    "guided_json": (_H, {"type": "object"}, {}),
    "guided_regex": (_H, "a+", {}),
    "guided_choice": (_H, ["yes", "no"], {}),
    "guided_grammar": (_H, 'root ::= "a" | "b"', {}),
    "guided_decoding_backend": (_R, "outlines", {}),
    "guided_whitespace_pattern": (_R, " ", {}),
    "structural_tag": (_R, "{}", {}),
    "structured_outputs": (_H, {"choice": ["yes", "no"]}, {}),
    "priority": (_R, 1, {}),  # this server runs --policy fcfs: a priority it would ignore is refused (as vLLM)
    "request_id": (_R, "r1", {}),
    "logits_processors": (_R, ["my.Proc"], {}),
    "return_tokens_as_token_ids": (_H, True, {"logprobs": 1}),
    "return_token_ids": (_H, True, {}),
    "cache_salt": (_H, "salt-1", {}),
    "kv_transfer_params": (_R, {"do_remote_prefill": True}, {}),
    "vllm_xargs": (_R, {"k": 1}, {}),
    # chat's logprobs are a flag with top_logprobs next to it
    "logprobs@chat": (_H, True, {}),
    "top_logprobs": (_H, 2, {"logprobs": True}),
    "logprobs": (_H, 2, {}),
    # stream_options' own fields (the baseline streams with an empty stream_options)
    "stream_options.include_usage": (_H, False, {"stream": True, "stream_options": {}}),
    "stream_options.continuous_usage_stats": (_H, True, {"stream": True, "stream_options": {}}),
}

_ENDPOINTS = {"completion": ("/v1/completions", {"prompt": "hello there"}),
              "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}]})}


def _case(endpoint: str, name: str) -> tuple[str, Any, dict[str, Any]]:
    return _CASES.get(f"{name}@{endpoint}") or _CASES[name]


def _walked() -> list[tuple[str, str]]:
    fields = [("completion", f) for f in sorted(VLLM_COMPLETION)] + [("chat", f) for f in sorted(VLLM_CHAT)]
    fields += [(ep, f"stream_options.{f}") for ep in _ENDPOINTS for f in sorted(VLLM_STREAM_OPTIONS)]
    return fields


class _Recorder:
    """Wraps the async engine's add_request: what each request handed the engine."""

    def __init__(self, srv: RunningServer) -> None:
        self.engine = srv.state.async_engine
        self.inner = self.engine.add_request
        self.calls: list[Any] = []
        self.engine.add_request = self

    async def __call__(self, request_id: str, ids: list[int], params: Any, *a: Any, **kw: Any) -> Any:
        self.calls.append((list(ids), repr(dataclasses.replace(params)), kw.get("priority"), kw.get("cache_salt")))
        return await self.inner(request_id, ids, params, *a, **kw)

    def restore(self) -> None:
        del self.engine.add_request


def _normalized(r: httpx.Response) -> Any:
    """The answer less what changes between identical requests (ids, times, cache hits, timings)."""
    def clean(d: Any) -> Any:
        if isinstance(d, dict):
            return {k: clean(v) for k, v in d.items()
                    if k not in ("id", "created", "prompt_tokens_details", "metrics", "system_fingerprint")}
        if isinstance(d, list):
            return [clean(v) for v in d]
        return d

    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return ["stream"] + [clean(json.loads(x[6:])) for x in r.text.splitlines() if x.startswith("data: {")]
    return clean(r.json())


def _access_extras(caplog: pytest.LogCaptureFixture) -> list[str]:
    """key=value parts of the access-log lines, less the per-request id."""
    out = []
    for rec in caplog.records:
        if rec.name == "twinserve.access":
            out += [p for p in rec.getMessage().split() if "=" in p and not p.startswith("request_id=")]
    return out


def _send(srv: RunningServer, rec: _Recorder, caplog: pytest.LogCaptureFixture, path: str,
          body: dict[str, Any]) -> tuple[int, Any]:
    from .conftest import wait_for

    rec.calls.clear()
    caplog.clear()
    r = httpx.post(srv.url + path, json=body, timeout=120)
    wait_for(lambda: any(x.name == "twinserve.access" for x in caplog.records), timeout=10)
    if r.status_code >= 400:
        return r.status_code, r.json()["error"].get("param")
    return r.status_code, (_normalized(r), list(rec.calls), _access_extras(caplog))


def test_the_walk_has_a_case_for_every_vllm_field() -> None:
    missing = [f"{ep}:{f}" for ep, f in _walked() if f"{f}@{ep}" not in _CASES and f not in _CASES]
    assert missing == []


@pytest.mark.parametrize("endpoint", ["completion", "chat"])
def test_every_vllm_field_is_honoured_or_refused(srv: RunningServer, endpoint: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="twinserve.access")
    path, own = _ENDPOINTS[endpoint]
    defaults = {"model": "tiny", "max_tokens": 3, "temperature": 0, **own}
    rec = _Recorder(srv)
    silent, wrong = [], []
    baselines: dict[str, Any] = {}
    try:
        for ep, name in _walked():
            if ep != endpoint:
                continue
            expect, value, base_extra = _case(endpoint, name)
            base = {**defaults, **base_extra}
            key = json.dumps(base, sort_keys=True)
            if key not in baselines:
                first = _send(srv, rec, caplog, path, base)
                assert first[0] == 200, (name, first)
                assert _send(srv, rec, caplog, path, base) == first, name  # the baseline is reproducible
                baselines[key] = first
            if name.startswith("stream_options."):
                body = {**base, "stream_options": {**base["stream_options"], name.split(".", 1)[1]: value}}
            elif name == "add_special_tokens":
                body = {**base, name: endpoint == "chat"}  # completions add them by default, chat does not
            else:
                body = {**base, name: value}
            got = _send(srv, rec, caplog, path, body)
            if expect == _R:
                if not (400 <= got[0] < 500 and got[1] == name):
                    wrong.append((name, "expected a 4xx naming it", got[0], got[1]))
            elif got[0] != 200:
                wrong.append((name, "expected it honoured", got[0], got[1]))
            elif got == baselines[key]:
                silent.append(name)
    finally:
        rec.restore()
    assert silent == [], f"accepted and changed nothing: {silent}"
    assert wrong == []


def test_an_unknown_field_is_ignored_with_a_warning_naming_it_once(srv: RunningServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Not a field of vLLM's nor ours: taken, as vLLM takes it, but never without a word (vLLM logs it too).
    caplog.set_level(logging.WARNING, logger="twinserve.serve")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "frobnicate_walk_field": 1}
    for _ in range(2):
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    said = [x.getMessage() for x in caplog.records if x.name == "twinserve.serve" and "frobnicate_walk_field" in
            x.getMessage()]
    assert len(said) == 1 and "ignored" in said[0]  # once per field name, not once per request


# Fields vLLM's request models type Optional (null read as the field's default; SamplingParams.from_optional
# turns n=None into 1), at both commits above: chat's `n: int | None = 1`, `stream: bool | None = False`,
# `logprobs: bool | None = False`; completions' `stream: bool | None = False`, `echo: bool | None = False`.
VLLM_NULL_IS_DEFAULT = {"chat": {"n": 1, "stream": False, "logprobs": False},
                        "completion": {"stream": False, "echo": False}}
# And those vLLM types without None, so null is a 400 there too: completions' `n: int = 1`, chat's `echo: bool`.
VLLM_NULL_IS_REFUSED = {"chat": ["echo"], "completion": ["n"]}


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_null_on_a_field_vllm_types_optional_is_its_default(srv: RunningServer, endpoint: str) -> None:
    path, body = ("/v1/chat/completions", CHAT) if endpoint == "chat" else ("/v1/completions", {"prompt": "hi"})
    base = {"model": "tiny", "max_tokens": 2, "temperature": 0.0, **body}
    want = httpx.post(srv.url + path, json=base, timeout=60)
    assert want.status_code == 200, want.text
    nulls = {name: None for name in VLLM_NULL_IS_DEFAULT[endpoint]}
    r = httpx.post(srv.url + path, json={**base, **nulls}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert r.headers["content-type"].startswith("application/json")  # stream null: not a stream
    assert len(got["choices"]) == 1  # n null: one choice
    assert got["choices"][0].get("logprobs") is None  # logprobs null: none asked
    assert [c.get("text", c.get("message")) for c in got["choices"]] == \
        [c.get("text", c.get("message")) for c in want.json()["choices"]]  # echo null: no prompt echoed
    for name in VLLM_NULL_IS_REFUSED[endpoint]:
        r = httpx.post(srv.url + path, json={**base, name: None}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, r.text)


@pytest.mark.parametrize("field,value", [("stream", "maybe"), ("stream_options", 5), ("structured_outputs", 5),
                                         ("n", "x")])
def test_a_bad_value_is_a_400_naming_its_field_even_when_the_name_starts_like_a_type(field: str,
                                                                                    value: Any) -> None:
    # The error's loc mixes field names with pydantic's union tags ("str", "list[int]"); "stream" and
    # "structured_outputs" start with "str" and were dropped with them, leaving param null.
    from twinserve.backends.real.serving.protocol import APIError, parse_model
    body = {"prompt": "hi", "stream": True, field: value}
    with pytest.raises(APIError) as e:
        parse_model(CompletionRequest, body)
    assert e.value.param == field and str(e.value).startswith(f"{field}: ")
