"""Reading a request body safely: a size limit (413), JSON parsed and validated off the event loop
when large, and client mistakes that the JSON decoder lets through (deep nesting, lone surrogates)
as 400s. The server and the router (`twinserve route`) both read their bodies here."""

from __future__ import annotations

import asyncio
import json
import os
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


async def parse_json(raw: bytes, then: Callable[[Any], Any] | None = None, ids_fields: tuple[str, ...] = ()) -> Any:
    """Decode and check a JSON body, then `then(body)` on it (a request model's validation, which costs
    as much as the decoding: 0.1 s for 2M token ids); a large body's whole parse runs on a worker thread.

    A worker thread alone does not free the loop: json.loads and pydantic each hold the GIL for their
    whole call. So long arrays of integers are decoded in slices (see _loads), and a long integer array
    in one of `ids_fields` (top-level token-id fields, each id checked later by the route, like a prompt
    or /detokenize's tokens; or one prompt of a batch) is shown to `then` as its first element only and
    put back in the validated model afterwards. Whatever that shortcut cannot place, `then` validates whole.
    """
    def parse() -> Any:
        body, runs = _decode(raw)
        if then is None:
            return body
        short = [(path, ids) for path, ids in runs if path[0] in ids_fields and len(path) <= 2]
        if not short:
            return then(body)
        for path, ids in short:
            _put(body, path, ids[:1])
        try:
            model = then(body)
        finally:
            for path, ids in short:
                _put(body, path, ids)
        if all(_swap_in(model, path, ids) for path, ids in short):
            return model
        return then(body)

    if len(raw) > INLINE_PARSE_BYTES:
        return await asyncio.to_thread(parse)
    return parse()


def decode_json(raw: bytes) -> Any:
    """json.loads plus the depth and surrogate checks; every failure is a 400."""
    return _decode(raw)[0]


def _decode(raw: bytes) -> tuple[Any, list[tuple[tuple[Any, ...], list[int]]]]:
    """decode_json's body, and (path, list) for each long integer array decoded in slices."""
    if _max_depth_exceeded(raw):
        raise bad_request(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", None, "invalid_json")
    try:
        body, runs = _loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"malformed JSON body: {e}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("the JSON body nests too deeply", None, "invalid_json") from None
    if _SURROGATE_ESCAPE.search(raw):
        path = _find_surrogate(body, "")
        if path is not None:
            raise bad_request(f"{path or 'body'}: the string holds a lone UTF-16 surrogate, which is not valid "
                              "Unicode text", path or None, "invalid_value")
    return body, runs


# An array of integers longer than LONG_INT_ARRAY_BYTES (~1k token ids) is decoded in slices of about
# SLICE_BYTES: one json.loads of 10 MB of ids holds the GIL for 0.3 s, a slice for a millisecond or two,
# and between slices the event loop's thread gets the GIL back. No step scans more than a slice at once.
LONG_INT_ARRAY_BYTES = 4096
SLICE_BYTES = 64 * 1024
_LONG_INT_ARRAY_START = re.compile(rb"\[[0-9,\- \t\r\n]{%d}" % LONG_INT_ARRAY_BYTES)
_NUMBER_BYTES = b"0123456789,- \t\r\n"


def _loads(raw: bytes) -> tuple[Any, list[tuple[tuple[Any, ...], list[int]]]]:
    """json.loads(raw), long integer arrays decoded slice by slice; the same value and the same errors.

    Each such array is cut out and replaced by a unique placeholder string; the rest is decoded in one
    call and the lists are put back where their placeholders are. Anything unexpected (an array inside
    a string, a malformed slice) falls back to one json.loads of the whole body, which decides.
    """
    if len(raw) <= INLINE_PARSE_BYTES:
        return json.loads(raw), []
    nonce = os.urandom(8).hex()
    parts: list[bytes] = []
    lists: dict[str, list[int]] = {}
    pos = cut = 0
    while (m := _LONG_INT_ARRAY_START.search(raw, pos)) is not None:
        got = _int_array(raw, m.start() + 1)
        if got is None:
            pos = m.start() + 1
            continue
        ids, end = got
        name = f"\x00{nonce}:{len(lists)}"
        parts += [raw[cut:m.start()], json.dumps(name).encode()]
        lists[name] = ids
        pos = cut = end
    if not lists:
        return json.loads(raw), []
    parts.append(raw[cut:])
    try:
        body = json.loads(b"".join(parts))
    except (ValueError, RecursionError):
        return json.loads(raw), []
    found: list[tuple[tuple[Any, ...], list[int]]] = []
    body = _restore(body, lists, (), found)
    if len(found) != len(lists):
        return json.loads(raw), []
    return body, found


def _int_array(raw: bytes, start: int) -> tuple[list[int], int] | None:
    """(the integers, the index past its ']') of the array whose inside begins at raw[start], decoded a
    slice at a time, each slice cut at a comma; None unless it is a well-formed array of integers."""
    out: list[int] = []
    a = start
    while True:
        stop = min(a + SLICE_BYTES, len(raw))
        close = raw.find(b"]", a, stop)
        if close >= 0:
            b = close
        else:
            b = raw.rfind(b",", a, stop)
            if b <= a or stop == len(raw):
                return None
        piece = raw[a:b]
        if piece.translate(None, _NUMBER_BYTES):
            return None
        try:
            part = json.loads(b"[" + piece + b"]")
        except ValueError:
            return None
        if not part:  # an empty slice: ",," or a trailing comma, which the whole parse refuses
            return None
        out += part
        if close >= 0:
            return out, close + 1
        a = b + 1


def _restore(value: Any, lists: dict[str, list[int]], path: tuple[Any, ...],
             found: list[tuple[tuple[Any, ...], list[int]]]) -> Any:
    if isinstance(value, str):
        ids = lists.get(value)
        if ids is not None:
            found.append((path, ids))
            return ids
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (str, dict, list)):
                value[k] = _restore(v, lists, path + (k,), found)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, (str, dict, list)):
                value[i] = _restore(v, lists, path + (i,), found)
    return value


def _put(body: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        body = body[step]
    body[path[-1]] = value


def _swap_in(model: Any, path: tuple[Any, ...], ids: list[int]) -> bool:
    """Put a whole id list where validation saw its first element only; False when it is not found there."""
    value = getattr(model, str(path[0]), None)
    if len(path) == 1:
        if value != ids[:1]:
            return False
        setattr(model, str(path[0]), ids)
        return True
    if not isinstance(value, list) or not isinstance(path[1], int) or path[1] >= len(value) \
            or value[path[1]] != ids[:1]:
        return False
    value[path[1]] = ids
    return True


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
