"""Request fields that constrain the output, as OpenAI and vLLM spell them, turned into one spec.

OpenAI: `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}), and `tools` with `tool_choice` "required" or a named function. vLLM:
`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and their newer spelling
`structured_outputs` ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from twinserve.core.structured_output import StructuredOutputSpec
from twinserve.backends.real.serving.errors import bad_request

_GUIDED = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
           ("guided_grammar", "grammar"))
_STRUCTURED_KEYS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar",
                    "json_object": "json_object"}


@dataclass(slots=True)
class ToolMode:
    """How a constrained output becomes tool calls: one named function, or a required list of calls."""

    name: str | None  # the forced function's name; None for "required" (the output names each call)


def structured_spec(req: Any) -> StructuredOutputSpec | None:
    """The single output constraint a request asks for (400 if it asks for two or a malformed one)."""
    found: list[StructuredOutputSpec] = []
    rf = getattr(req, "response_format", None)
    if rf is not None:
        spec = _response_format(rf)
        if spec is not None:
            found.append(spec)
    for field, kind in _GUIDED:
        value = getattr(req, field, None)
        if value is not None:
            found.append(_make(kind, value, field))
    so = getattr(req, "structured_outputs", None)
    if so:
        keys = [k for k in _STRUCTURED_KEYS if so.get(k) not in (None, False)]
        if len(keys) != 1:
            raise bad_request("structured_outputs: give exactly one of json, regex, choice, grammar, json_object",
                              "structured_outputs", "invalid_value")
        found.append(_make(_STRUCTURED_KEYS[keys[0]], so[keys[0]], f"structured_outputs.{keys[0]}"))
    tool = tool_spec(req)
    if tool is not None:
        found.append(tool[0])
    if len(found) > 1:
        raise bad_request(f"only one output constraint per request: got {', '.join(s.param for s in found)}",
                          found[1].param, "invalid_value")
    return found[0] if found else None


def _make(kind: str, value: Any, param: str) -> StructuredOutputSpec:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise bad_request(f"{param}: not valid JSON: {e}", param, "invalid_value") from None
        if not isinstance(value, dict):
            raise bad_request(f"{param}: a JSON schema must be an object", param, "invalid_value")
        # The schema's own property order: it is the order the output's keys come in (as OpenAI and vLLM
        # keep it). The same schema sent again dumps to the same string, so the grammar cache still hits.
        return StructuredOutputSpec("json", json.dumps(value, separators=(",", ":")), param)
    if kind == "json_object":
        return StructuredOutputSpec("json_object", "", param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise bad_request(f"{param}: a non-empty list of non-empty strings", param, "invalid_value")
        return StructuredOutputSpec("choice", list(value), param)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param}: a non-empty string", param, "invalid_value")
    return StructuredOutputSpec(kind, value, param)


def _response_format(rf: Any) -> StructuredOutputSpec | None:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise bad_request("response_format: an object with a type", "response_format", "invalid_value")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputSpec("json_object", "", "response_format")
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema", js.get("json_schema")) if isinstance(js, dict) else None
        if schema is None:
            raise bad_request("response_format.json_schema.schema is required for type json_schema",
                              "response_format.json_schema.schema", "missing_required_parameter")
        return _make("json", schema, "response_format")
    raise bad_request(f"response_format.type {kind!r} is not supported: use text, json_object or json_schema",
                      "response_format.type", "unsupported")


def tool_spec(req: Any) -> tuple[StructuredOutputSpec, ToolMode] | None:
    """The constraint and mode of a chat request's tool call, or None when it calls no tool."""
    tools = getattr(req, "tools", None)
    choice = getattr(req, "tool_choice", None)
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice", "invalid_value")
        return None
    functions = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{i}]: a {{'type': 'function', 'function': {{'name': ...}}}} object",
                              f"tools[{i}]", "invalid_value")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        functions[fn["name"]] = params
    if choice == "none":
        return None
    if choice in (None, "auto"):
        raise bad_request("tool_choice 'auto' (the default with tools) needs a tool-call parser, which this "
                          "server does not have: send tool_choice 'required', a named function, or 'none'",
                          "tool_choice", "unsupported")
    if getattr(req, "stream", False):
        raise bad_request("streamed tool calls are not supported: send stream=false with tool_choice",
                          "stream", "unsupported")
    if choice == "required":
        # A non-empty list of {"name": one of the tools, "parameters": that tool's schema}.
        items = [{"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, params in functions.items()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if getattr(req, "parallel_tool_calls", None) is False:
            schema["maxItems"] = 1
        return _make("json", schema, "tool_choice"), ToolMode(None)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name is None:
        raise bad_request("tool_choice: 'none', 'auto', 'required' or {'type': 'function', 'function': "
                          "{'name': ...}}", "tool_choice", "invalid_value")
    if name not in functions:
        raise bad_request(f"tool_choice names {name!r}, which is not among the tools {sorted(functions)}",
                          "tool_choice", "invalid_value")
    return _make("json", functions[name], "tool_choice"), ToolMode(name)


def as_tool_calls(body: dict[str, Any], mode: ToolMode) -> dict[str, Any]:
    """Turn each choice's constrained text into message.tool_calls (text that does not parse stays content)."""
    for choice in body["choices"]:
        msg = choice["message"]
        text = msg.get("content") or ""
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            continue  # cut by max_tokens: finish_reason "length" says so, the partial text stays visible
        if mode.name is not None:
            calls = [(mode.name, parsed)]
        else:
            calls = [(c["name"], c["parameters"]) for c in parsed]
        msg["content"] = None
        msg["tool_calls"] = [{"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}}
                             for name, args in calls]
        if mode.name is None and choice["finish_reason"] == "stop":
            choice["finish_reason"] = "tool_calls"
    return body
