"""Speculative decoding as the scheduler sees it: configuration and acceptance counters.

Proposers and verification live in the backends; names follow vLLM's --speculative-config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from twinserve.core.errors import InvalidConfigError
from twinserve.core.knobs import check_fields, json_object, knob

SPEC_METHODS = ("ngram", "draft_model")
# More drafts per step are never worth the verify width (vLLM caps k similarly).
MAX_SPECULATIVE_TOKENS = 32


@dataclass(slots=True)
class SpeculativeConfig:
    """How drafts are proposed and when speculation is off."""

    method: str = knob("ngram", help="how drafts are proposed: prompt n-grams, or a smaller draft model",
                       choices=SPEC_METHODS)
    num_speculative_tokens: int = knob(4, help="draft tokens per step", unit="tokens",
                                       range=(1, MAX_SPECULATIVE_TOKENS))
    # ngram: suffix lengths matched against the context.
    prompt_lookup_max: int = knob(4, help="ngram: longest suffix matched against the context", unit="tokens",
                                  range=(1, 1 << 16))
    prompt_lookup_min: int = knob(1, help="ngram: shortest suffix matched against the context", unit="tokens",
                                  range=(1, 1 << 16))
    model: str | None = knob(None, help="draft_model: the draft, named as the target is")
    disable_by_batch_size: int = knob(0, help="no drafts while this many requests run", range=(0, 1 << 31),
                                      special={0: "never off"})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidConfigError naming the first bad field."""
        check_fields(self, prefix="speculative_config.")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise InvalidConfigError("speculative_config.prompt_lookup_max", self.prompt_lookup_max,
                                     f"an integer >= prompt_lookup_min ({self.prompt_lookup_min})")
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
        d = json_object("speculative_config", spec)
        known = {f.name for f in fields(cls)}
        if d.get("method") == "draft_model" or ("model" in d and "method" not in d):
            d.setdefault("method", "draft_model")
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidConfigError("speculative_config", unknown,
                                     f"keys among {sorted(known)}")
        return cls(**d)


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
