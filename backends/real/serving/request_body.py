"""Reading a request body safely: a size limit (413), JSON parsed and validated off the event loop
when large, and client mistakes that the JSON decoder lets through (deep nesting, lone surrogates)
as 400s. The server and the router (`twinserve route`) both read their bodies here."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable

from fastapi import Request

from twinserve.backends.real.serving.errors import APIError, bad_request

# Bodies above this are parsed on a worker thread so one large prompt never stalls the loop.
INLINE_PARSE_BYTES = 64 * 1024
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Deeper JSON than this is refused: nothing a client sends legitimately nests so far, and the
# decoder, the validator and the chat template would otherwise recurse on it.
MAX_JSON_DEPTH = 64
# A JSON escape of a UTF-16 surrogate: the only way a lone surrogate gets into a parsed string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def body_too_large(limit: int) -> APIError:
    """A 413 in OpenAI's error shape."""
    return APIError(413, f"the request body exceeds {limit} bytes (the server's --max-request-body-bytes)",
                    "invalid_request_error", None, "request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_json(raw: bytes, then: Callable[[Any], Any] | None = None) -> Any:
    """Decode and check a JSON body, then `then(body)` on it (a request model's validation, which costs
    as much as the decoding: 0.1 s for 2M token ids); a large body's whole parse runs on a worker thread."""
    def parse() -> Any:
        body = decode_json(raw)
        return body if then is None else then(body)

    if len(raw) > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(parse)
    return parse()


def decode_json(raw: bytes) -> Any:
    """json.loads plus the depth and surrogate checks; every failure is a 400."""
    if _max_depth_exceeded(raw):
        raise bad_request(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", None, "invalid_json")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"malformed JSON body: {e}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("the JSON body nests too deeply", None, "invalid_json") from None
    if _SURROGATE_ESCAPE.search(raw):
        path = _find_surrogate(body, "")
        if path is not None:
            raise bad_request(f"{path or 'body'}: the string holds a lone UTF-16 surrogate, which is not valid "
                              "Unicode text", path or None, "invalid_value")
    return body


def _max_depth_exceeded(raw: bytes) -> bool:
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    depth = 0
    for m in _BRACKETS.finditer(_STRINGS.sub(b'""', raw)):
        if m.group() in b"[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _find_surrogate(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if _find_surrogate(k, sub) is not None:
                return sub
            found = _find_surrogate(v, sub)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _find_surrogate(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None
