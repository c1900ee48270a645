"""The contract between policy and execution: what to run, and what came back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from twinserve.core.request import FinishReason
from twinserve.core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the executor has not seen (or must rebuild after preemption)."""

    req_id: str
    # Includes tokens generated before a preemption: all recomputed.
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    # Prefix-cache hits: the step computes from here.
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Requests the executor already holds state for, as parallel lists."""

    req_ids: list[str] = field(default_factory=list)
    # Blocks appended this step (read-only: a shared empty tuple when none).
    new_block_ids: list[Sequence[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One engine step: who runs, how many tokens each, and what changed since the last step."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: list[str]
    finished_req_ids: set[str]
    # Drafts to verify: the last len(drafts) of the request's num_scheduled_tokens.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Blocks (rejected drafts') to drop from the table's end before appending new ones.
    num_dropped_blocks: dict[str, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class Logprob:
    """Log-probabilities for one sampled position: the sampled token and the top N."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the executor returns: sampled token ids per request (empty for a partial prefill)."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[Logprob]] | None = None
    # req id -> reason; only these requests end (with "error").
    failed: dict[str, str] | None = None
    # req id -> (index of the first prompt token described, its records).
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]] | None = None
    step_time: float | None = None
    # Drafts for each request's next step; the scheduler picks how many to verify.
    spec_token_ids: dict[str, list[int]] | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """Per-request result of one step: new tokens, and a finish reason once it ends."""

    # Built field by field in Scheduler.update_from_output (hot path): set new fields there too.

    req_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[Logprob] | None = None
    prompt_logprobs: tuple[int, list[Logprob]] | None = None
    error: str | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
