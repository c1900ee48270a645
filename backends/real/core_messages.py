"""Front end <-> engine core messages, as msgspec structs (msgpack on the wire)."""

from __future__ import annotations

from typing import Any

import msgspec

from twinserve.core.request import FinishReason
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched.output import Logprob


class CoreStats(msgspec.Struct, array_like=True):
    """Scheduler and KV-cache state after the core's latest iteration."""

    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    kv_usage: float = 0.0
    num_free_blocks: int = 0
    num_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    # Speculative decoding totals (SpecDecodeStats).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []
    # Host tier: lookups in tokens (vLLM's external prefix cache) and bytes copied each way.
    external_queries: int = 0
    external_hits: int = 0
    offload_bytes_stored: int = 0
    offload_bytes_loaded: int = 0


class CoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request's result of one step, with the Request's lifecycle facts."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[Logprob] | None = None
    prompt_logprobs: tuple[int, list[Logprob]] | None = None
    error: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    prefix_hit_tokens: int = -1
    num_preemptions: int = 0
    # Speculative decoding: verified and accepted draft tokens.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


# ---------------------------------------------------------------- front end -> core
class AddRequest(msgspec.Struct, tag=True, array_like=True):
    """Queue one validated request; a structured-output spec travels without its compiled grammar."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_id: int | None = None
    # Keeps the prefix out of others' cache hits (prompt logprobs need every position).
    cache_salt: str | None = None


class AbortRequests(msgspec.Struct, tag=True, array_like=True):
    """End requests early with the given finish reason."""
    request_ids: list[str]
    reason: FinishReason = FinishReason.ABORT


class Consumed(msgspec.Struct, tag=True, array_like=True):
    """StepOutputs the front end has taken so far: the core's credit to step on."""

    count: int


class SetStepLog(msgspec.Struct, tag=True, array_like=True):
    """Turn the core's step timing and StepTraces on or off."""

    on: bool
    record_schedule: bool = False


class ResetPrefixCache(msgspec.Struct, tag=True, array_like=True):
    """Forget every cached prefix (the core ignores it while requests hold blocks)."""


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    """Stop the busy loop, the executor and its workers."""


# ---------------------------------------------------------------- core -> front end
class Ready(msgspec.Struct, tag=True, array_like=True):
    """The core is built; what the front end needs to validate requests."""

    num_blocks: int
    kv_bytes_per_token: int
    pids: list[int]


class StepTrace(msgspec.Struct, array_like=True, omit_defaults=True):
    """One core step for the front end's step log (schedule_s and update_s travel in StepStats)."""

    prefill_chunks: list[tuple[int, int]]
    decode_context_lens: list[int]
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    step_time_s: float = 0.0
    gap_s: float = 0.0
    extra: dict[str, float] | None = None
    # Only with record_schedule (replay checks).
    scheduled: dict[str, int] | None = None
    preempted: list[str] | None = None
    admitted_until: float | None = None
    # How many requests the core had taken by then (ties in arrival time need the count).
    admitted_count: int | None = None


class StepOutputs(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """Everything one busy-loop iteration produced."""

    outputs: list[CoreOutput]
    stats: CoreStats
    # Front-end messages handled so far: shows when the core has caught up.
    inputs_seen: int
    # StepStats, untyped so its owner can grow it.
    step_stats: Any = None
    trace: StepTrace | None = None


class CoreError(msgspec.Struct, tag=True, array_like=True):
    """The core failed; it exits after sending this."""

    message: str
    traceback: str


class Bye(msgspec.Struct, tag=True, array_like=True):
    """The core shut down cleanly."""


ToCore = AddRequest | AbortRequests | Consumed | SetStepLog | ResetPrefixCache | Shutdown
FromCore = Ready | StepOutputs | CoreError | Bye


def encoder() -> msgspec.msgpack.Encoder:
    """One encoder per socket owner (not thread-safe)."""
    return msgspec.msgpack.Encoder()


def to_core_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the front end sends."""
    return msgspec.msgpack.Decoder(ToCore)


def from_core_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the core sends."""
    return msgspec.msgpack.Decoder(FromCore)
