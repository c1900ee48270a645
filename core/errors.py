"""Typed errors raised by the policy core; every message says what to change."""

from __future__ import annotations


def short_repr(value: object, limit: int = 200) -> str:
    """repr() cut to `limit`, safe for huge ints."""
    try:
        text = repr(value)
    except ValueError:  # past sys.get_int_max_str_digits()
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit] + "..."


def unreadable_text(path: object, err: OSError | UnicodeDecodeError) -> tuple[int | None, str]:
    """(line, why) for a user file that cannot be read as text: a folder, no permission, or not UTF-8.

    For bytes that are not UTF-8, the line is that of the first bad byte (the file is read again in binary,
    since a text reader fails a whole chunk at a time)."""
    if isinstance(err, UnicodeDecodeError):
        line, where = None, ""
        try:
            with open(str(path), "rb") as fh:
                data = fh.read()
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            where = f" (byte 0x{data[e.start]:02x})"
        except OSError:
            pass
        return line, f"not UTF-8 text{where}: is it the right file? a text file must be saved as UTF-8"
    return None, f"cannot be read: {err.strerror or err}"


class TwinserveError(Exception):
    """Base class of every error twinserve raises on purpose.

    Subclass constructors call _keep_args so `type(e)(*e.args)` (SimPy, pickle) rebuilds the error.
    """

    def _keep_args(self, message: str, *ctor_args: object) -> None:
        Exception.__init__(self, *ctor_args)
        self._message = message

    def __str__(self) -> str:
        message = getattr(self, "_message", None)
        return message if message is not None else super().__str__()


class FileFieldError(TwinserveError, ValueError):
    """A value read from a file is missing or wrong: names the file, the line and the field."""

    def __init__(self, field: str, message: str, file: str | None = None,
                 line: int | None = None) -> None:
        self.field = field
        self.file = file
        self.line = line
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        self._keep_args(f"{where}field '{field}': {message}", field, message, file, line)


class InvalidSamplingParamsError(TwinserveError, ValueError):
    """A sampling parameter is outside its allowed range."""
    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self._keep_args(f"sampling parameter {field}={short_repr(value)} is invalid: allowed {allowed}",
                        field, value, allowed)


class InvalidRequestError(TwinserveError, ValueError):
    """A request that can never be served as given."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        self._keep_args(message, message, param)


class PromptTooLongError(InvalidRequestError):
    """The prompt (or its max output) exceeds what the engine can hold."""

    def __init__(self, message: str, num_tokens: int, limit: int) -> None:
        self.num_tokens = num_tokens
        self.limit = limit
        super().__init__(message, param="prompt")
        self.args = (message, num_tokens, limit)


class InvalidConfigError(TwinserveError, ValueError):
    """A scheduler or cache configuration value is out of range."""
    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self._keep_args(f"config {field}={short_repr(value)} is invalid: allowed {allowed}", field, value, allowed)


class ComputedTokensError(TwinserveError, RuntimeError):
    """A request's num_computed_tokens leaves it nothing to compute: it could never finish, so it fails alone."""

    def __init__(self, request_id: str, num_computed_tokens: int, num_tokens: int, source: str) -> None:
        self.request_id = request_id
        self.num_computed_tokens = num_computed_tokens
        self.num_tokens = num_tokens
        self._keep_args(
            f"request {request_id!r}: num_computed_tokens={num_computed_tokens} is wrong for its {num_tokens} "
            f"tokens ({source}); it could never finish, so it ends here and the other requests carry on",
            request_id, num_computed_tokens, num_tokens, source)


class ExecutorOutputError(TwinserveError, RuntimeError):
    """An executor sent back tokens a request's step cannot yield (too many for a verify step, any for a
    partial prefill): it fails alone."""

    def __init__(self, request_id: str, problem: str) -> None:
        self.request_id = request_id
        self.problem = problem
        self._keep_args(
            f"request {request_id!r}: the executor sent back {problem}; that step's output for it cannot be "
            f"trusted, so it ends here and the other requests carry on (a bug in the executor or model runner)",
            request_id, problem)


class PrefixCacheBusyError(TwinserveError, RuntimeError):
    """The prefix cache cannot be reset while blocks are held."""


class UnsupportedModelError(TwinserveError, ValueError):
    """A model not found or not served."""


class UnsupportedArchitectureError(UnsupportedModelError):
    """config.json names an architecture no registered model class implements."""
    def __init__(self, architecture: object, supported: list[str], model_type: object = None) -> None:
        self.architecture = architecture
        self.supported = list(supported)
        kind = "" if model_type is None else f" (model_type {short_repr(model_type)})"
        self._keep_args(f"architecture {short_repr(architecture)}{kind} is not supported; twinserve serves "
                        f"{', '.join(self.supported)}", architecture, self.supported, model_type)


class UnsupportedConfigFieldError(UnsupportedModelError):
    """A model config field holds a value the model class does not implement (never silently ignored)."""
    def __init__(self, architecture: str, field: str, value: object, supported: str) -> None:
        self.architecture = architecture
        self.field = field
        self.value = value
        self._keep_args(f"{architecture}: config field {field}={short_repr(value)} is not implemented; "
                        f"supported: {supported}", architecture, field, value, supported)


class CheckpointMismatchError(UnsupportedModelError):
    """A checkpoint tensor's name or shape does not match the model its config describes."""
    def __init__(self, tensor: str, problem: str) -> None:
        self.tensor = tensor
        self._keep_args(f"checkpoint tensor {tensor!r}: {problem}", tensor, problem)


class EngineDeadError(TwinserveError, RuntimeError):
    """The engine failed a step and cannot serve further requests."""
