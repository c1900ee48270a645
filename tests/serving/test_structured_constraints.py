"""Structured output keeps its own constraint: schema order, json_object, impossible constraints, min_tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import RunningServer, start_server


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """Grammars are compiled and applied the same way in either core mode; one server suffices."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


def _post(s: RunningServer, body: dict[str, Any], path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(s.url + path, json={"model": "tiny", "prompt": "answer:", **body}, timeout=60)


REASON_FIRST = {"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 4},
                                                 "answer": {"type": "integer"}},
                "required": ["reasoning", "answer"], "additionalProperties": False}


def test_json_schema_keeps_the_schemas_property_order(srv: RunningServer) -> None:
    r = _post(srv, {"guided_json": REASON_FIRST, "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith('{"reasoning"')
    # The same schema again is a cache hit; the same properties in another order are another grammar.
    cache = srv.engine.grammar_compiler
    hits, misses = cache.hits, cache.misses
    _post(srv, {"guided_json": REASON_FIRST, "max_tokens": 1})
    assert (cache.hits, cache.misses) == (hits + 1, misses)
    swapped = {**REASON_FIRST, "properties": dict(reversed(list(REASON_FIRST["properties"].items())))}
    r = _post(srv, {"guided_json": swapped, "max_tokens": 40, "temperature": 0})
    assert cache.misses == misses + 1
    assert r.json()["choices"][0]["text"].startswith('{"answer"')


def test_json_object_is_always_an_object(srv: RunningServer) -> None:
    # A bias that makes an array (or a string) the model's first choice: the grammar must still say no.
    tok = srv.engine.tokenizer
    for first in ("[", '"', "1"):
        (tid,) = tok(first, add_special_tokens=False)["input_ids"]
        r = httpx.post(srv.url + "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "json please"}], "max_tokens": 12,
            "temperature": 0, "logit_bias": {str(tid): 100}, "response_format": {"type": "json_object"}},
            timeout=60)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
        assert text.startswith("{"), (first, text)


@pytest.mark.parametrize("regex", ["[^\\s\\S]", "[^\\s\\S]+x"])
def test_a_regex_that_can_never_match_is_a_400(srv: RunningServer, regex: str) -> None:
    r = _post(srv, {"guided_regex": regex, "max_tokens": 5})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "guided_regex" and "never" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_past_a_finished_constraint_ends_clearly_never_with_garbage(srv: RunningServer,
                                                                              stream: bool) -> None:
    body = {"guided_choice": ["yes"], "min_tokens": 8, "max_tokens": 16, "stream": stream}
    r = _post(srv, body)
    if not stream:
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "min_tokens" and err["code"] == "no_token_allowed", err
        return
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["text"] for e in events for c in e.get("choices", []))
    assert text in ("", "y", "ye", "yes"), text  # never a token past what the constraint allows
    assert events[-1]["error"]["code"] == "no_token_allowed"
    # The engine keeps serving.
    ok = _post(srv, {"guided_choice": ["yes"], "max_tokens": 8})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "yes"


def test_a_row_with_every_token_masked_is_never_sampled() -> None:
    import torch

    from twinserve.backends.real.sampler import NoTokenAllowedError, Sampler, SamplingRow
    from twinserve.core.sampling_params import SamplingParams

    logits = torch.full((2, 8), float("-inf"))
    logits[0, 3] = 1.0
    logits[1, 7] = 1.0  # row 1 allows only its stop token, which min_tokens masks
    rows = [SamplingRow(SamplingParams(temperature=0), [1], 1, 0, [7]),
            SamplingRow(SamplingParams(temperature=1.0, min_tokens=4, seed=1), [1], 1, 0, [7])]
    with pytest.raises(NoTokenAllowedError, match="min_tokens=4"):
        Sampler(torch.device("cpu"))(logits, rows)
    toks, _ = Sampler(torch.device("cpu"))(logits[:1], rows[:1])
    assert toks == [3]
