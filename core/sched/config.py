"""Scheduler and KV-cache knobs, named as in vLLM, validated."""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.hashing import HASH_FUNCTIONS
from twinserve.core.sched.policies import PREEMPTION_CHOICES, QUEUE_POLICIES


# CLIs offer these names, so a registration works everywhere.
SCHEDULER_CHOICES: dict[str, tuple[str, ...]] = {
    "policy": tuple(QUEUE_POLICIES),
    "preemption": PREEMPTION_CHOICES,
    "prefix_caching_hash_algo": tuple(HASH_FUNCTIONS),
}


@dataclass(slots=True)
class SchedulerConfig:
    """Who enters a batch, and how the KV pool is laid out."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    # Per-step prefill cap (0 = none) so long prompts share the budget.
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    num_blocks: int = 1024
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "xxhash"
    # Fraction of blocks kept free after an admission.
    watermark: float = 0.0
    # "fcfs", "priority" (lower first) or "sjf" (shortest prompt first).
    policy: str = "fcfs"
    # Victim: "last" admitted, "priority", or "auto" (follows policy).
    preemption: str = "auto"
    # Against starvation: each interval waited is one level; 0 = strict order,
    # which can starve requests forever.
    aging_interval_s: float = 30.0
    # The model's all-layer sliding window; 0 = full attention.
    sliding_window: int = 0
    # KV cache groups' windows (0 = full attention) for a model mixing attention types, from
    # core.kv.groups.group_windows; () = one group (sliding_window's).
    kv_groups: tuple[int, ...] = ()

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
        g = self.kv_groups
        if not isinstance(g, (tuple, list)) or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in g):
            raise InvalidConfigError("kv_groups", g, "a tuple of windows >= 0 (0 = full attention)")
        if len(g) > 1 and self.sliding_window:
            raise InvalidConfigError("sliding_window", self.sliding_window,
                                     "0 when kv_groups gives each group's window")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InvalidConfigError(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f">= max_model_len ({self.max_model_len}) when chunked prefill is off, "
                "or a prompt could never be scheduled",
            )
