"""Scheduler and KV-cache knobs, named as vLLM names them, validated."""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.hashing import HASH_FUNCTIONS
from twinserve.core.sched.policies import PREEMPTION_CHOICES, QUEUE_POLICIES


# The knobs that take a registered name, and the names each takes: CLIs and study files
# offer these, so a policy registered in policies.py or hashing.py is usable everywhere.
SCHEDULER_CHOICES: dict[str, tuple[str, ...]] = {
    "policy": tuple(QUEUE_POLICIES),
    "preemption": PREEMPTION_CHOICES,
    "prefix_caching_hash_algo": tuple(HASH_FUNCTIONS),
}


@dataclass(slots=True)
class SchedulerConfig:
    """Everything that decides who enters a batch and how the KV pool is laid out."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    # A prefill asks for at most this many tokens a step (0 = no cap), so long prompts
    # share the budget with others; only meaningful with chunked prefill.
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    num_blocks: int = 1024
    enable_prefix_caching: bool = True
    # A name in kv.hashing.HASH_FUNCTIONS (or, in code, a hash function itself).
    prefix_caching_hash_algo: str = "xxhash"
    # Fraction of all blocks that must stay free after admitting a new request.
    watermark: float = 0.0
    # Waiting-queue order, a name in policies.QUEUE_POLICIES: "fcfs", "priority" (lower
    # value first, arrival breaks ties) or "sjf" (shortest prompt first).
    policy: str = "fcfs"
    # Victim when memory runs out, a name in policies.PREEMPTION_POLICIES: "last" admitted,
    # strict "priority" (no aging), or "auto" (priority under the priority policy, else last).
    preemption: str = "auto"
    # Aging against starvation under "priority" and "sjf": every aging_interval_s seconds a
    # request has spent waiting (not running) counts as one priority level, and under sjf,
    # once it has waited this long it outranks any newly arrived prompt. 0 turns aging off
    # (strict order: a steady stream of short or important requests can then hold others
    # back forever).
    aging_interval_s: float = 30.0
    # The model's sliding window when every layer has one (Mistral): the KV manager frees
    # the blocks a request's window has left behind. 0: full attention, every block kept.
    sliding_window: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidConfigError naming the first bad field."""
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size",
                     "num_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(name, value, "an integer >= 1")
        t = self.long_prefill_token_threshold
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidConfigError("long_prefill_token_threshold", t, "an integer >= 0")
        a = self.aging_interval_s
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a < float("inf"):
            raise InvalidConfigError("aging_interval_s", a, "a finite number of seconds >= 0 (0 = no aging)")
        if not isinstance(self.policy, str) or self.policy not in QUEUE_POLICIES:
            raise InvalidConfigError("policy", self.policy, " or ".join(QUEUE_POLICIES))
        if not isinstance(self.preemption, str) or self.preemption not in PREEMPTION_CHOICES:
            raise InvalidConfigError("preemption", self.preemption, " or ".join(PREEMPTION_CHOICES))
        w = self.watermark
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
            raise InvalidConfigError("watermark", w, "a number in [0, 1)")
        h = self.prefix_caching_hash_algo
        if not callable(h) and not (isinstance(h, str) and h in HASH_FUNCTIONS):
            raise InvalidConfigError("prefix_caching_hash_algo", h, " or ".join(HASH_FUNCTIONS))
        w = self.sliding_window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise InvalidConfigError("sliding_window", w, "an integer >= 1, or 0 for full attention")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InvalidConfigError(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f">= max_model_len ({self.max_model_len}) when chunked prefill is off, "
                "or a prompt could never be scheduled",
            )
