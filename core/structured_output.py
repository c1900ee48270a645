"""What a request's output must match (JSON schema, any JSON, regex, choice, grammar).

Pure data: the real backend compiles a spec (cached) onto `compiled` and masks logits with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinserve.core.errors import InvalidSamplingParamsError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True)
class StructuredOutputSpec:
    """A constraint on the generated text."""

    kind: str
    value: str | list[str] = ""
    # The request field it came from, for error messages.
    param: str = "structured_output"
    # Process-local: compiled grammars don't pickle, so each process recompiles.
    compiled: Any = field(default=None, compare=False, repr=False)

    def validate(self) -> None:
        """Raise InvalidSamplingParamsError unless kind and value fit."""
        if self.kind not in KINDS:
            raise InvalidSamplingParamsError(self.param, self.kind, f"one of {', '.join(KINDS)}")
        if self.kind == "choice":
            ok = isinstance(self.value, list) and bool(self.value) and all(
                isinstance(v, str) and v for v in self.value)
            if not ok:
                raise InvalidSamplingParamsError(self.param, self.value, "a non-empty list of non-empty strings")
        elif self.kind != "json_object" and (not isinstance(self.value, str) or not self.value):
            raise InvalidSamplingParamsError(self.param, self.value, f"a non-empty {self.kind} string")

    @property
    def cache_key(self) -> tuple[str, str]:
        """What identifies the compiled grammar."""
        value = "\x00".join(self.value) if isinstance(self.value, list) else self.value
        return self.kind, value

    def portable(self) -> "StructuredOutputSpec":
        """A copy without the compiled grammar, for another process."""
        return StructuredOutputSpec(self.kind, self.value, self.param)

    def __getstate__(self) -> tuple[str, str | list[str], str]:
        return self.kind, self.value, self.param

    def __setstate__(self, state: tuple[str, str | list[str], str]) -> None:
        self.kind, self.value, self.param = state
        self.compiled = None
