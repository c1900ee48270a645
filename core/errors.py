"""Typed errors raised by the policy core; every message says what to change."""

from __future__ import annotations


class TwinserveError(Exception):
    """Base class of every error twinserve raises on purpose."""


class InvalidSamplingParamsError(TwinserveError, ValueError):
    """A sampling parameter is outside its allowed range."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"sampling parameter {field}={value!r} is invalid: allowed {allowed}")


class InvalidRequestError(TwinserveError, ValueError):
    """A request can never be served as given (empty, too long, duplicate id...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        super().__init__(message)


class PromptTooLongError(InvalidRequestError):
    """The prompt (or prompt plus the tokens it may generate) exceeds what the engine can hold."""

    def __init__(self, message: str, num_tokens: int, limit: int) -> None:
        self.num_tokens = num_tokens
        self.limit = limit
        super().__init__(message, param="prompt")


class InvalidConfigError(TwinserveError, ValueError):
    """A scheduler or cache configuration value is out of range."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"config {field}={value!r} is invalid: allowed {allowed}")


class PrefixCacheBusyError(TwinserveError, RuntimeError):
    """The prefix cache cannot be reset while blocks are held by requests."""


class UnsupportedModelError(TwinserveError, ValueError):
    """A model cannot be found or its architecture is not one twinserve serves."""


class EngineDeadError(TwinserveError, RuntimeError):
    """The engine failed while executing a step and cannot serve further requests."""
