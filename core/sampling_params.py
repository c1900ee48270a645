"""Sampling parameters with validation of every field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidSamplingParamsError
from .structured_output import StructuredOutputSpec


@dataclass(slots=True)
class SamplingParams:
    """How tokens are drawn and when generation stops, validated on construction."""

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    # Output must match this (JSON schema, regex, choice...); the runner masks logits with its grammar.
    structured_output: StructuredOutputSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self.validate()

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        """Raise InvalidSamplingParamsError naming the first bad field."""
        _int_at_least("n", self.n, 1)
        if self.max_tokens is not None:
            _int_at_least("max_tokens", self.max_tokens, 1)
        _int_at_least("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidSamplingParamsError(
                "min_tokens", self.min_tokens, f"an integer <= max_tokens ({self.max_tokens})"
            )
        _float_in("temperature", self.temperature, 0.0, math.inf, "a finite number >= 0")
        _float_in("top_p", self.top_p, 0.0, 1.0, "a number in (0, 1]", low_open=True)
        if _is_bool(self.top_k) or not isinstance(self.top_k, int) or (self.top_k < 0 and self.top_k != -1):
            raise InvalidSamplingParamsError("top_k", self.top_k, "-1 or 0 (disabled) or an integer >= 1")
        _float_in("min_p", self.min_p, 0.0, 1.0, "a number in [0, 1]")
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0, "a number in [-2, 2]")
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "a number in [-2, 2]")
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, math.inf,
                  "a finite number > 0", low_open=True)
        if self.seed is not None and (_is_bool(self.seed) or not isinstance(self.seed, int)):
            raise InvalidSamplingParamsError("seed", self.seed, "an integer or None")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise InvalidSamplingParamsError("stop", self.stop, "a list of non-empty strings")
        for t in self.stop_token_ids:
            if _is_bool(t) or not isinstance(t, int) or t < 0:
                raise InvalidSamplingParamsError(
                    "stop_token_ids", self.stop_token_ids, "a list of integers >= 0"
                )
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParamsError("ignore_eos", self.ignore_eos, "true or false")
        if self.logprobs is not None:
            _int_at_least("logprobs", self.logprobs, 0, upper=20)
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutputSpec):
                raise InvalidSamplingParamsError("structured_output", self.structured_output,
                                                 "a StructuredOutputSpec or None")
            self.structured_output.validate()
            if self.ignore_eos:
                # The grammar ends by allowing only EOS; ignoring it would run past the constraint.
                raise InvalidSamplingParamsError("ignore_eos", True,
                                                 "false when the output is constrained (structured output)")

    def clone(self, **changes: Any) -> "SamplingParams":
        """A validated copy with some fields changed."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["stop"] = list(self.stop)
        values["stop_token_ids"] = list(self.stop_token_ids)
        values.update(changes)
        return SamplingParams(**values)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _int_at_least(name: str, value: object, low: int, upper: int | None = None) -> None:
    if _is_bool(value) or not isinstance(value, int) or value < low or (upper is not None and value > upper):
        allowed = f"an integer >= {low}" if upper is None else f"an integer in [{low}, {upper}]"
        raise InvalidSamplingParamsError(name, value, allowed)


def _float_in(name: str, value: object, low: float, high: float, allowed: str,
              low_open: bool = False) -> None:
    if _is_bool(value) or not isinstance(value, (int, float)):
        raise InvalidSamplingParamsError(name, value, allowed)
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v < low or v > high or (low_open and v == low):
        raise InvalidSamplingParamsError(name, value, allowed)
