"""Structured output over HTTP: response_format, vLLM's guided fields and forced tool calls."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from .conftest import RunningServer

# Finite by construction, so the constraint alone guarantees a complete, valid answer from the random model.
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "population_millions": {"type": "integer", "enum": [1, 2, 3]},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "capital"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "describe a city as JSON"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                     "days": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["unit", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
    "additionalProperties": False}}}


def test_response_format_json_schema_through_the_openai_client(server: RunningServer) -> None:
    c = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=150, n=3, temperature=1.0,
                                  seed=4, response_format=fmt)
    for choice in r.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"
    # The same schema again is a cache hit, and a streamed answer rebuilds into valid JSON too.
    hits = server.engine.grammar_compiler.hits
    chunks = list(c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=150, temperature=0.9,
                                            seed=5, response_format=fmt, stream=True))
    assert server.engine.grammar_compiler.hits > hits
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_vllm_guided_fields_on_completions_with_a_batch_of_prompts(server: RunningServer) -> None:
    c = server.client()
    prompts = ["pick one:", "another:", "third:"]
    r = c.completions.create(model="tiny", prompt=prompts, max_tokens=20, temperature=1.0, seed=1,
                             extra_body={"guided_choice": ["north", "south", "east west"]})
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    assert all(ch.text in ("north", "south", "east west") for ch in r.choices)
    r = c.completions.create(model="tiny", prompt=prompts[0], max_tokens=20, temperature=1.0, seed=2,
                             extra_body={"guided_regex": r"\d{3}-[xyz]{2}"})
    assert re.fullmatch(r"\d{3}-[xyz]{2}", r.choices[0].text)
    r = c.completions.create(model="tiny", prompt=prompts[0], max_tokens=150, temperature=1.0, seed=3,
                             extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    r = c.completions.create(model="tiny", prompt=prompts[0], max_tokens=20, temperature=1.0, seed=3,
                             extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].text in ("yes", "no")


def test_named_and_required_tool_calls(server: RunningServer) -> None:
    c = server.client()
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=100, temperature=1.0, seed=0,
                                  tools=[WEATHER, TIME],
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=200, temperature=1.0, seed=1,
                                  tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1
    for call in calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("extra,param", [
    ({"tools": [WEATHER]}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "stream": True}, "stream"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos"),
])
def test_bad_constraints_are_400s_naming_the_field(server: RunningServer, extra: dict, param: str) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert server.engine.get_num_unfinished_requests() == 0


def test_tool_choice_none_ignores_tools_and_text_is_unconstrained(server: RunningServer) -> None:
    plain = server.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    r = server.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                                tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.content == plain.choices[0].message.content
    assert not r.choices[0].message.tool_calls


def test_openai_client_parse_helper_returns_a_validated_object(server: RunningServer) -> None:
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    class City(pydantic.BaseModel):
        city: Literal["Paris", "Rome", "Oslo"]
        capital: bool

    try:
        parse = server.client().chat.completions.parse
    except AttributeError:
        parse = server.client().beta.chat.completions.parse
    try:
        r = parse(model="tiny", messages=MESSAGES, max_tokens=60, temperature=1.0, seed=9, response_format=City)
    except openai.LengthFinishReasonError:
        pytest.fail("the constrained answer did not finish within max_tokens")
    assert isinstance(r.choices[0].message.parsed, City)


def test_grammars_compile_off_the_event_loop_and_off_the_engine_thread(server: RunningServer) -> None:
    import threading

    compiler = server.engine.grammar_compiler
    seen: list[str] = []
    inner = compiler.compile

    def spy(spec):
        seen.append(threading.current_thread().name)
        return inner(spec)

    compiler.compile = spy
    try:
        r = server.client().completions.create(model="tiny", prompt="x", max_tokens=10, temperature=0,
                                               extra_body={"guided_regex": "[ab]{4}"})
    finally:
        del compiler.compile
    assert re.fullmatch("[ab]{4}", r.choices[0].text)
    assert seen and all(name not in ("twinserve-engine", "MainThread") for name in seen), seen
    assert all(name != server.thread.name for name in seen), seen
