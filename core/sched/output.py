"""The policy/execution contract: what to run, and what came back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from twinserve.core.request import FinishReason
from twinserve.core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request new to the executor (or rebuilt after preemption)."""

    req_id: str
    # With any tokens generated before a preemption.
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    # Prefix-cache hits.
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Requests the executor already holds, as parallel lists."""

    req_ids: list[str] = field(default_factory=list)
    # Read-only (may be a shared empty tuple).
    new_block_ids: list[Sequence[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One step: who runs, with how many tokens, and what changed."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: list[str]
    finished_req_ids: set[str]
    # Drafts are the last len(drafts) of a request's scheduled tokens.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Rejected drafts' blocks to drop from the table's end first.
    num_dropped_blocks: dict[str, int] = field(default_factory=dict)
    # Host tier (read-only, may be shared empties): copies run before the forward, stores first.
    # (device block id, host slot): an evicted block's KV, read before this step reuses the block.
    kv_stores: Sequence[tuple[int, int]] = ()
    # Load job id -> [(host slot, device block id)]; report each job in finished_loads when copied.
    kv_loads: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        """True when nothing runs this step."""
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class Logprob:
    """Log-probabilities at one position: the sampled token and the top N."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the executor returns (no tokens for a partial prefill)."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[Logprob]] | None = None
    # req id -> reason; only these requests end ("error").
    failed: dict[str, str] | None = None
    # req id -> (first prompt index described, records).
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]] | None = None
    step_time: float | None = None
    # Next-step drafts; the scheduler picks how many to verify.
    spec_token_ids: dict[str, list[int]] | None = None
    # Load jobs (SchedulerOutput.kv_loads) whose copies are done: this step's or earlier ones'.
    finished_loads: list[int] | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's result of a step."""

    # Scheduler.update_from_output sets fields one by one: add new ones there.

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
        """True when this is the request's last output."""
        return self.finish_reason is not None
