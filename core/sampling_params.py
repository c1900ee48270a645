"""Sampling parameters with validation of every field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from twinserve.core.errors import InvalidSamplingParamsError
from twinserve.core.structured_output import StructuredOutputSpec

# Below this a temperature means greedy (vLLM's epsilon); dividing by it would overflow logits.
GREEDY_TEMPERATURE = 1e-5
_INT64_MAX = 2 ** 63 - 1
# Float parameters multiply or divide fp32 logits: past this they turn into inf and NaN.
_F32_MAX = 3.4028234663852886e38


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
    # Log-probabilities of the prompt tokens (top N alongside), as completions' echo needs.
    prompt_logprobs: int | None = None
    # Token id -> bias added to its logit before sampling (OpenAI's range: [-100, 100]).
    logit_bias: dict[int, float] | None = None
    # vLLM's: a stop string that ends the output stays in its text.
    include_stop_str_in_output: bool = False
    # vLLM's: only these token ids may be sampled (every other logit is masked).
    allowed_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise InvalidSamplingParamsError("stop", self.stop, "a string or a list of non-empty strings")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = list(self.stop_token_ids)
        else:
            raise InvalidSamplingParamsError("stop_token_ids", self.stop_token_ids, "a list of integers >= 0")
        if self.logit_bias is not None and isinstance(self.logit_bias, dict):
            self.logit_bias = _int_keys(self.logit_bias) or None
        self.validate()

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (vLLM treats temperatures below 1e-5 as 0)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def validate(self) -> None:
        """Raise InvalidSamplingParamsError naming the first bad field."""
        _int_at_least("n", self.n, 1, upper=_INT64_MAX)
        if self.max_tokens is not None:
            _int_at_least("max_tokens", self.max_tokens, 1, upper=_INT64_MAX)
        _int_at_least("min_tokens", self.min_tokens, 0, upper=_INT64_MAX)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidSamplingParamsError(
                "min_tokens", self.min_tokens, f"an integer <= max_tokens ({self.max_tokens})"
            )
        _float_in("temperature", self.temperature, 0.0, _F32_MAX, f"a number in [0, {_F32_MAX:.4g}]")
        _float_in("top_p", self.top_p, 0.0, 1.0, "a number in (0, 1]", low_open=True)
        if (_is_bool(self.top_k) or not isinstance(self.top_k, int) or (self.top_k < 0 and self.top_k != -1)
                or self.top_k > _INT64_MAX):
            raise InvalidSamplingParamsError("top_k", self.top_k,
                                             f"-1 or 0 (disabled) or an integer in [1, {_INT64_MAX}]")
        _float_in("min_p", self.min_p, 0.0, 1.0, "a number in [0, 1]")
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0, "a number in [-2, 2]")
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "a number in [-2, 2]")
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, _F32_MAX,
                  f"a number in (0, {_F32_MAX:.4g}]", low_open=True)
        if self.seed is not None and (_is_bool(self.seed) or not isinstance(self.seed, int)
                                      or not -_INT64_MAX - 1 <= self.seed <= 2 * _INT64_MAX + 1):
            raise InvalidSamplingParamsError("seed", self.seed, "a 64-bit integer or None")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise InvalidSamplingParamsError("stop", self.stop, "a list of non-empty strings")
        for t in self.stop_token_ids:
            if _is_bool(t) or not isinstance(t, int) or not 0 <= t <= _INT64_MAX:
                raise InvalidSamplingParamsError(
                    "stop_token_ids", self.stop_token_ids, "a list of integers >= 0"
                )
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParamsError("ignore_eos", self.ignore_eos, "true or false")
        # The engine caps logprobs at its max_logprobs (vLLM's --max-logprobs); here only the type.
        if self.logprobs is not None:
            _int_at_least("logprobs", self.logprobs, 0, upper=_INT64_MAX)
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutputSpec):
                raise InvalidSamplingParamsError("structured_output", self.structured_output,
                                                 "a StructuredOutputSpec or None")
            self.structured_output.validate()
            if self.ignore_eos:
                # The grammar ends by allowing only EOS; ignoring it would run past the constraint.
                raise InvalidSamplingParamsError("ignore_eos", True,
                                                 "false when the output is constrained (structured output)")
        if self.prompt_logprobs is not None:
            _int_at_least("prompt_logprobs", self.prompt_logprobs, 0, upper=_INT64_MAX)
        if not isinstance(self.include_stop_str_in_output, bool):
            raise InvalidSamplingParamsError("include_stop_str_in_output", self.include_stop_str_in_output,
                                             "true or false")
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if (not isinstance(ids, (list, tuple)) or not ids
                    or not all(not _is_bool(t) and isinstance(t, int) and 0 <= t <= _INT64_MAX for t in ids)):
                raise InvalidSamplingParamsError("allowed_token_ids", ids, "a non-empty list of token ids >= 0")
        if not isinstance(self.skip_special_tokens, bool):
            raise InvalidSamplingParamsError("skip_special_tokens", self.skip_special_tokens, "true or false")
        if self.logit_bias is not None:
            _check_logit_bias(self.logit_bias)

    def clone(self, **changes: Any) -> "SamplingParams":
        """A validated copy with some fields changed."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["stop"] = list(self.stop)
        values["stop_token_ids"] = list(self.stop_token_ids)
        if self.logit_bias is not None:
            values["logit_bias"] = dict(self.logit_bias)
        if self.allowed_token_ids is not None:
            values["allowed_token_ids"] = list(self.allowed_token_ids)
        values.update(changes)
        return SamplingParams(**values)


def _int_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    # JSON object keys are strings: "50256" -> 50256; anything else is left for validate() to name.
    out: dict[Any, Any] = {}
    for k, v in bias.items():
        if isinstance(k, str) and k.strip().lstrip("-").isdigit() and len(k) < 30:
            k = int(k)
        out[k] = v
    return out


def _check_logit_bias(bias: object) -> None:
    allowed = "a map of token id (an integer >= 0) to a bias in [-100, 100]"
    if not isinstance(bias, dict):
        raise InvalidSamplingParamsError("logit_bias", bias, allowed)
    for k, v in bias.items():
        if _is_bool(k) or not isinstance(k, int) or not 0 <= k <= _INT64_MAX:
            raise InvalidSamplingParamsError("logit_bias", k, allowed)
        _float_in("logit_bias", v, -100.0, 100.0, allowed)


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
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        raise InvalidSamplingParamsError(name, value, allowed) from None
    if math.isnan(v) or math.isinf(v) or v < low or v > high or (low_open and v == low):
        raise InvalidSamplingParamsError(name, value, allowed)
