"""Messages between the front end and the engine core, as msgspec structs (msgpack on the wire)."""

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
    # Speculative decoding totals (the scheduler's SpecDecodeStats).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []


class CoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request's result of one step (EngineCoreOutput's fields, then the Request's facts)."""

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
    # The request's totals of verified and accepted draft tokens (speculative decoding).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


# ---------------------------------------------------------------- front end -> core
class AddRequest(msgspec.Struct, tag=True, array_like=True):
    """Queue one validated core request.

    A structured-output spec travels without its compiled grammar (it does not serialize); the
    masking process compiles its own (Worker.compile_grammar).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_id: int | None = None
    # Keeps the prefix out of others' cache hits (prompt logprobs need every position computed).
    cache_salt: str | None = None


class AbortRequests(msgspec.Struct, tag=True, array_like=True):
    """End requests early with the given finish reason."""

    request_ids: list[str]
    reason: FinishReason = FinishReason.ABORT


class Consumed(msgspec.Struct, tag=True, array_like=True):
    """The front end has taken this many StepOutputs so far (the core's credit to step on)."""

    count: int


class SetStepLog(msgspec.Struct, tag=True, array_like=True):
    """Time the core's phases and send a StepTrace with every step (on), or stop (off)."""

    on: bool
    record_schedule: bool = False


class ResetPrefixCache(msgspec.Struct, tag=True, array_like=True):
    """Forget every cached prefix (the core ignores it while requests hold blocks)."""


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    """Stop the busy loop, the executor and its workers."""


# ---------------------------------------------------------------- core -> front end
class Ready(msgspec.Struct, tag=True, array_like=True):
    """The core is built: its KV-cache size and what the front end needs to validate requests."""

    num_blocks: int
    kv_bytes_per_token: int
    pids: list[int]


class StepTrace(msgspec.Struct, array_like=True, omit_defaults=True):
    """One core step for the front end's step log: its shape and the phases StepStats lacks.

    Times are the core's own (see step_log's columns); schedule_s and update_s travel in StepStats.
    """

    prefill_chunks: list[tuple[int, int]]
    decode_context_lens: list[int]
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    step_time_s: float = 0.0
    gap_s: float = 0.0
    extra: dict[str, float] | None = None
    # Only with record_schedule (replay checks); admitted_until: latest arrival seen before scheduling.
    scheduled: dict[str, int] | None = None
    preempted: list[str] | None = None
    admitted_until: float | None = None


class StepOutputs(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """Everything one busy-loop iteration produced, in one message (trailing Nones not sent)."""

    outputs: list[CoreOutput]
    stats: CoreStats
    # Messages from the front end handled so far: it knows when the core has caught up.
    inputs_seen: int
    # The core's StepStats, generic so its owner can grow it.
    step_stats: Any = None
    # The step's trace while a step log is on (SetStepLog), else None.
    trace: StepTrace | None = None


class CoreError(msgspec.Struct, tag=True, array_like=True):
    """The core failed (at start-up or in a step); it exits after sending this."""

    message: str
    traceback: str


class Bye(msgspec.Struct, tag=True, array_like=True):
    """The core shut down cleanly."""


ToCore = AddRequest | AbortRequests | Consumed | SetStepLog | ResetPrefixCache | Shutdown
FromCore = Ready | StepOutputs | CoreError | Bye


def encoder() -> msgspec.msgpack.Encoder:
    """One encoder per socket owner (not thread-safe to share across threads)."""
    return msgspec.msgpack.Encoder()


def to_core_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the front end sends."""
    return msgspec.msgpack.Decoder(ToCore)


def from_core_decoder() -> msgspec.msgpack.Decoder:
    """Decodes what the core sends."""
    return msgspec.msgpack.Decoder(FromCore)
