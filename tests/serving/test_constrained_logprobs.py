"""Logprobs under a constraint: masked tokens' -inf is clamped to -9999.0 (as vLLM), in strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import RunningServer, start_server

CLAMP = -9999.0
CONSTRAINTS = [
    ("chat", {"guided_choice": ["yes", "no"]}),
    ("chat", {"response_format": {"type": "json_object"}}),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}],
        "tool_choice": "required"}),
    ("completions", {"guided_choice": ["yes", "no"]}),
]


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """Constraints and logprobs are formatted in the front end: one core mode suffices."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


def _strict(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, as strict parsers (and browsers' JSON.parse) do."""
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _numbers(obj: Any) -> list[float]:
    if isinstance(obj, float):
        return [obj]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    return []


def _body(kind: str, extra: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any]]:
    if kind == "chat":
        return "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "pick"}],
                                        "max_tokens": 6, "logprobs": True, "top_logprobs": 5,
                                        "stream": stream, **extra}
    return "/v1/completions", {"model": "tiny", "prompt": "pick", "max_tokens": 6, "logprobs": 5,
                               "stream": stream, **extra}


# Streamed tool calls are refused (400) before any logprob is computed: tools are tried unstreamed.
CASES = [(kind, extra, stream) for kind, extra in CONSTRAINTS for stream in (False, True)
         if not (stream and "tools" in extra)]


@pytest.mark.parametrize("kind,extra,stream", CASES)
def test_logprobs_under_a_constraint_are_finite_json(srv: RunningServer, kind: str, extra: dict[str, Any],
                                                     stream: bool) -> None:
    path, body = _body(kind, extra, stream)
    r = httpx.post(srv.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    if stream:
        events = [_strict(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    else:
        events = [_strict(r.text)]
    values = [x for e in events for c in e["choices"] for x in _numbers(c.get("logprobs"))]
    assert values, "no logprobs came back"
    assert all(math.isfinite(x) and x >= CLAMP for x in values)
    # A 5-wide top list under a 2-way choice must hold masked tokens: they read as the clamp.
    assert CLAMP in values


def test_openai_client_keeps_its_connection_after_constrained_logprobs(srv: RunningServer) -> None:
    client = srv.client()
    for _ in range(2):  # the second call reuses the first one's connection
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "pick"}],
                                           max_tokens=4, logprobs=True, top_logprobs=5,
                                           extra_body={"guided_choice": ["yes", "no"]})
        tops = [t.logprob for c in r.choices[0].logprobs.content for t in c.top_logprobs]
        assert CLAMP in tops and all(math.isfinite(x) for x in tops)
        assert r.choices[0].message.content in ("yes", "no")
