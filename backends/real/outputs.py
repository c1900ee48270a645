"""What the engine hands back: per-request outputs with cumulative and incremental parts."""

from __future__ import annotations

from dataclasses import dataclass, field

from twinserve.core.sched.output import Logprob


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps (engine clock, seconds) and counts of one request."""

    arrival_time: float
    num_prompt_tokens: int
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # Speculative decoding: draft tokens verified for the request and how many were accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Arrival to finish."""
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        """Arrival to first scheduling."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finish_time is None or self.first_token_time is None or self.num_generation_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_generation_tokens - 1)


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (of n): everything so far, and what is new since the last output."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[Logprob] | None = None
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: list[Logprob] | None = None
    # Why the sequence failed (finish reason "error"); other requests were not affected.
    error: str | None = None

    @property
    def finished(self) -> bool:
        """True once this sequence has ended."""
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """A request's state after a step: its prompt, its n completions, finished when all are."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    # One entry per prompt token (None for the first) when prompt_logprobs was asked for.
    prompt_logprobs: list[Logprob | None] | None = None
