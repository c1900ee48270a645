"""The access log: one line per HTTP request (method, path, status, latency, request id).

A pure ASGI middleware rather than FastAPI's @app.middleware("http"): it sees the status when the
headers go out and the latency when the last body byte does, so a streamed response is timed to
its end, and it never buffers a body. For 4xx/5xx it keeps the (small) error body and logs its
message, so a refused request leaves its reason on the server.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Awaitable, Callable

logger = logging.getLogger("twinserve.access")

# An OpenAI error body is a few hundred bytes; never keep more of a failing response than this.
_MAX_ERROR_BODY = 4096
# The end user a request names (its body's `user`) and the client's X-Request-Id are logged up to
# this many characters.
_MAX_USER_CHARS = 256

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


def new_request_id() -> str:
    """A fresh request id (hex uuid4)."""
    return uuid.uuid4().hex


def error_message(body: bytes) -> str:
    """The message of an error body: OpenAI's error.message, FastAPI's detail, or the raw text."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in data:
            return str(data["detail"])
    return json.dumps(data)[:500]


class AccessLogMiddleware:
    """Gives every request an id (scope state and the X-Request-Id header) and logs one line for it."""

    def __init__(self, app: ASGIApp, enabled: bool = True,
                 on_response: Callable[[str, str, int], None] | None = None) -> None:
        self.app = app
        self.enabled = enabled
        # Told (method, route path, status) of every request, logged or not (the http_requests counter).
        self.on_response = on_response

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        client_id = _header(scope, b"x-request-id")
        status = 500
        error_body = bytearray()

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", (client_id or request_id).encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and status >= 400:
                room = _MAX_ERROR_BODY - len(error_body)
                if room > 0:
                    error_body.extend(message.get("body", b"")[:room])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as exc:
            status = max(status, 500) if status < 400 else status
            if not error_body:
                error_body.extend(f"{type(exc).__name__}: {exc}".encode()[:_MAX_ERROR_BODY])
            raise
        finally:
            if self.on_response is not None:
                route = scope.get("route")
                handler = getattr(route, "path", None) or "none"  # unmatched paths share one label
                self.on_response(scope.get("method", "-"), handler, status)
            if self.enabled:
                self._log(scope, status, time.monotonic() - t0, request_id, client_id, bytes(error_body))

    @staticmethod
    def _log(scope: dict[str, Any], status: int, latency: float, request_id: str, client_id: str | None,
             error_body: bytes) -> None:
        client = scope.get("client")
        host = f"{client[0]}:{client[1]}" if client else "-"
        path = scope.get("path", "")
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        line = (f'{host} "{scope.get("method", "-")} {path}" {status} {latency * 1000:.1f}ms '
                f"request_id={request_id}")
        # The client's X-Request-Id and its body's `user`: quoted and cut, so a value cannot forge
        # fields of the line or flood it.
        if client_id:
            line += f" x_request_id={json.dumps(client_id[:_MAX_USER_CHARS])}"
        user = scope.get("state", {}).get("user")
        if isinstance(user, str):
            line += f" user={json.dumps(user[:_MAX_USER_CHARS])}"
        if status >= 400:
            line += f" error={json.dumps(error_message(error_body) if error_body else '')}"
        # A client that hung up (499) is routine: an info line like a success, no warning.
        logger.log(logging.WARNING if status >= 400 and status != 499 else logging.INFO, line)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def configure_access_logger(enabled: bool) -> None:
    """Send access lines to stderr at INFO (uvicorn configures only its own loggers)."""
    if not enabled:
        return
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s access: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
