"""HTTP-facing errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import re
from typing import Any

from twinserve.core.errors import (EngineDeadError, InvalidRequestError, InvalidSamplingParamsError,
                             PromptTooLongError, TwinserveError, UnsupportedModelError)


class APIError(TwinserveError):
    """An error with the HTTP status and OpenAI error fields it is reported with."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        self._keep_args(message, status, message, type, param, code)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class ServerOverloadedError(APIError):
    """Too many requests are queued; the client should retry later (429)."""

    def __init__(self, num_queued: int, limit: int) -> None:
        super().__init__(429, f"server is overloaded: {num_queued} requests are queued (limit {limit}, "
                         "set by --max-queued-requests); retry later", "server_overloaded_error",
                         None, "too_many_requests")
        self.args = (num_queued, limit)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 invalid_request_error."""
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(name: str, served: list[str]) -> APIError:
    """A 404 for a model this server does not serve."""
    return APIError(404, f"the model {name!r} does not exist; this server serves {served}",
                    "invalid_request_error", "model", "model_not_found")


def engine_dead(reason: str) -> APIError:
    """A 503: the engine failed and cannot serve requests (a one-line reason; the log has the rest)."""
    return APIError(503, f"the engine has failed and cannot serve requests ({short_reason(reason)}); restart the "
                    "server (its log has the details)", "engine_dead_error", None, "engine_dead")


# A file path (two or more components), as tracebacks and OS errors carry them.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.~+-]+){2,}[/\\]?")
_MAX_REASON_CHARS = 160


def short_reason(reason: str) -> str:
    """The first line of a failure, without file paths and cut short: what a client may see."""
    line = reason.strip().split("\n", 1)[0].split("\\n", 1)[0]
    line = line.split("Traceback (most recent call last)", 1)[0].rstrip(" :(")
    line = _PATH.sub("<path>", line)
    return line if len(line) <= _MAX_REASON_CHARS else line[:_MAX_REASON_CHARS - 3] + "..."


def unauthorized() -> APIError:
    """A 401 for a missing or wrong API key."""
    return APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>' with the key "
                    "given to --api-key", "invalid_request_error", None, "invalid_api_key")


def to_api_error(exc: BaseException) -> APIError:
    """Map an engine or validation error onto its HTTP status and OpenAI fields."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLongError):
        return bad_request(str(exc), exc.param or "prompt", "context_length_exceeded")
    if isinstance(exc, InvalidSamplingParamsError):
        return bad_request(str(exc), exc.field, "invalid_value")
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc), exc.param, "invalid_value")
    if isinstance(exc, UnsupportedModelError):
        return APIError(404, str(exc), "invalid_request_error", "model", "model_not_found")
    if isinstance(exc, EngineDeadError):
        return engine_dead(str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error", None, None)
