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
    # Prompt plus any tokens generated before a preemption: the executor recomputes them all.
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    # Tokens already in the KV cache (prefix-cache hits); the step computes from here.
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Requests the executor already holds state for, as parallel lists."""

    req_ids: list[str] = field(default_factory=list)
    # Blocks appended to each request's block table this step (a shared empty tuple when
    # none: read-only for executors).
    new_block_ids: list[Sequence[int]] = field(default_factory=list)
    # Tokens in the KV cache before this step (the context the new tokens attend to).
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One engine step: who runs, how many tokens each, and what changed since the last step."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: list[str]
    # Requests that ended since the previous step: the executor drops their state.
    finished_req_ids: set[str]
    # Draft tokens to verify per request (vLLM v1's name): they are the last len(drafts) of
    # the request's num_scheduled_tokens, placed after its newest sampled token.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Blocks to drop from the end of a held request's block table before this step's new
    # blocks are appended (they held only rejected drafts and went back to the pool).
    num_dropped_blocks: dict[str, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        """True when nothing runs this step."""
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
    # Requests whose own inputs made the step fail for them (req id -> reason): the core ends
    # them with finish reason "error"; every other request of the step goes on.
    failed: dict[str, str] | None = None
    # Prompt log-probabilities computed this step, for requests that asked: req id -> (index of
    # the first prompt token described, one record per prompt token from there).
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]] | None = None
    # Wall or simulated duration of the step, when the executor measured or modelled one.
    step_time: float | None = None
    # Drafts proposed for each request's next step (speculative decoding only): the scheduler
    # decides how many of them to schedule.
    spec_token_ids: dict[str, list[int]] | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """Per-request result of one step: new tokens, and a finish reason once it ends."""

    # Scheduler.update_from_output builds these field by field (no __init__ call on the
    # decode hot path): a field added here must be set there too.

    req_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[Logprob] | None = None
    # (index of the first prompt token described, records) when prompt logprobs were asked for.
    prompt_logprobs: tuple[int, list[Logprob]] | None = None
    # Why the request failed, with finish reason "error".
    error: str | None = None
    # Draft tokens verified for the request this step and how many of them were accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        """True when this is the request's last output."""
        return self.finish_reason is not None
