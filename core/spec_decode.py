"""Speculative decoding as the scheduler sees it: configuration and acceptance counters.

Proposers and verification live in the backends; names follow vLLM's --speculative-config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from twinserve.core.errors import InvalidConfigError

SPEC_METHODS = ("ngram", "draft_model")
# More drafts per step are never worth the verify width (vLLM caps k similarly).
MAX_SPECULATIVE_TOKENS = 32


@dataclass(slots=True)
class SpeculativeConfig:
    """How drafts are proposed and when speculation is off."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    # ngram: suffix lengths matched against the context.
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None
    # No drafts at this many running requests or more (0: never off).
    disable_by_batch_size: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidConfigError naming the first bad field."""
        if self.method not in SPEC_METHODS:
            raise InvalidConfigError("speculative_config.method", self.method, f"one of {SPEC_METHODS}")
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _int_in("prompt_lookup_min", self.prompt_lookup_min, 1, 1 << 16)
        _int_in("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 1 << 16)
        _int_in("disable_by_batch_size", self.disable_by_batch_size, 0, 1 << 31)
        if self.method == "draft_model" and not self.model:
            raise InvalidConfigError("speculative_config.model", self.model,
                                     "a draft model path when method is 'draft_model'")

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past a step's tokens that proposing needs (vLLM's num_lookahead_tokens).

        A draft model writes its own KV at the k positions it feeds while drafting, through the
        target's block table; n-gram drafts write nothing.
        """
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    def active(self, num_running: int) -> bool:
        """Whether a step with this many running requests drafts."""
        d = self.disable_by_batch_size
        return d <= 0 or num_running < d

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | str | None) -> "SpeculativeConfig | None":
        """Build from vLLM's dict or JSON; unknown keys are an error."""
        if spec is None or isinstance(spec, SpeculativeConfig):
            return spec
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise InvalidConfigError("speculative_config", spec, f"a JSON object ({e.msg})") from None
        if not isinstance(spec, Mapping):
            raise InvalidConfigError("speculative_config", spec, "a JSON object / dict")
        known = {f.name for f in fields(cls)}
        d = dict(spec)
        if d.get("method") == "draft_model" or ("model" in d and "method" not in d):
            d.setdefault("method", "draft_model")
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidConfigError("speculative_config", unknown,
                                     f"keys among {sorted(known)}")
        return cls(**d)


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidConfigError(f"speculative_config.{name}", value, f"an integer in [{lo}, {hi}]")


@dataclass(slots=True)
class SpecDecodeStats:
    """Draft and acceptance totals (vLLM's spec_decode_* counters)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Accepted drafts by position in the draft.
    accepted_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one request's verified draft."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
