"""Typed errors for studies, configs and traces; each names the file, the line and the field."""

from __future__ import annotations

from twinserve.core.errors import TwinserveError


class SimError(TwinserveError):
    """Base class of the simulator's own errors."""


class ConfigError(SimError, ValueError):
    """A study config value is wrong: says which field, in which file, on which line."""

    def __init__(self, field: str, message: str, file: str | None = None,
                 line: int | None = None) -> None:
        self.field = field
        self.file = file
        self.line = line
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        self._keep_args(f"{where}field '{field}': {message}", field, message, file, line)


class TraceError(SimError, ValueError):
    """A trace row cannot be read, or a request is longer than allowed under on_overlong='fail'."""

    def __init__(self, file: str, line: int, field: str | None, message: str) -> None:
        self.file = file
        self.line = line
        self.field = field
        col = f" column '{field}':" if field else ""
        self._keep_args(f"{file}:{line}:{col} {message}", file, line, field, message)
