"""Typed errors for studies, configs and traces; each names the file, the line and the field."""

from __future__ import annotations

from twinserve.core.errors import FileFieldError, TwinserveError


class SimError(TwinserveError):
    """Base class of the simulator's own errors."""


class ConfigError(SimError, FileFieldError):
    """A study config value is wrong: says which field, in which file, on which line."""


class TraceError(SimError, ValueError):
    """A trace row cannot be read, or a request is longer than allowed under on_overlong='fail'."""

    def __init__(self, file: str, line: int, field: str | None, message: str) -> None:
        self.file = file
        self.line = line
        self.field = field
        col = f" column '{field}':" if field else ""
        self._keep_args(f"{file}:{line}:{col} {message}", file, line, field, message)
