"""The front end's handle on the engine core: the same EngineCore in this process or in its own.

Both clients return per step a batch of CoreOutputs and the core's stats, so LLMEngine does not
care where the busy loop runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from twinserve.core.engine_core import EngineCore, StepStats
from twinserve.core.kv.model_kv import model_group_windows
from twinserve.core.request import FinishReason, Request
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.output import EngineCoreOutput
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.core_messages import CoreOutput, CoreStats


@dataclass(slots=True)
class CoreStep:
    """What one engine-core iteration produced."""

    outputs: list[CoreOutput]
    stats: StepStats | None = None
    # Core process with a step log: each core step's stats and trace, in order (one front-end
    # step can take several).
    traces: list[tuple[StepStats, Any]] | None = None


class EngineCoreClient(Protocol):
    """The seam between the front end and the busy loop."""

    num_blocks: int
    kv_bytes_per_token: int

    def add_request(self, request: Request) -> None:
        """Queue a validated request."""

    def abort(self, request_ids: Iterable[str], reason: FinishReason = FinishReason.ABORT) -> None:
        """End requests early."""

    def get_output(self, timeout: float) -> CoreStep | None:
        """The next iteration's outputs; None when nothing came within timeout."""

    def has_pending(self) -> bool:
        """True while the core has not yet answered everything sent to it."""

    def stats(self) -> CoreStats:
        """Scheduler and KV state after the latest iteration seen."""

    def set_step_log(self, on: bool, record_schedule: bool = False) -> None:
        """Turn the core's phase timing and step traces on or off."""

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (PrefixCacheBusyError while requests hold blocks)."""

    def shutdown(self) -> None:
        """Stop the core (and its workers) and write the step log if asked."""


def kv_group_windows(cfg: Any) -> tuple[int, ...]:
    """The KV manager's groups for a model config: each group's window, 0 = full attention.

    One entry when every layer has the same attention; a model mixing full and sliding layers
    (Gemma 3, Qwen2 with max_window_layers) gets a full group and sliding groups (core/kv/groups.py).
    """
    return model_group_windows(getattr(cfg, "layer_windows", None) if cfg is not None else None)


def kv_sliding_window(cfg: Any) -> int | None:
    """The window of KV group 0, whose block table a draft model reads (None: full attention).

    Group 0 is the full-attention group whenever any layer attends fully (kv_cache_groups).
    """
    return kv_group_windows(cfg)[0] or None


def scheduler_config_for(args: EngineArgs, max_model_len: int, num_blocks: int) -> SchedulerConfig:
    """The scheduler's config from the engine args and the workers' KV blocks."""
    return args.scheduler_config(max_model_len, num_blocks)


def core_output(o: EngineCoreOutput, req: Request | None) -> CoreOutput:
    """An EngineCoreOutput plus the request's lifecycle facts, as the wire record."""
    if req is None:
        return CoreOutput(o.req_id, o.new_token_ids, o.finish_reason, o.stop_reason, o.new_logprobs,
                          o.prompt_logprobs, o.error)
    return CoreOutput(o.req_id, o.new_token_ids, o.finish_reason, o.stop_reason, o.new_logprobs,
                      o.prompt_logprobs, o.error, req.first_scheduled_time, req.first_token_time,
                      req.prefix_hit_tokens, req.num_preemptions, req.num_draft_tokens, req.num_accepted_tokens)


def core_stats(core: EngineCore) -> CoreStats:
    """The core's scheduler and KV state as one record."""
    sched = core.scheduler
    kv = sched.kv
    return CoreStats(sched.num_running, sched.num_waiting, sched.num_preemptions, core.num_steps,
                     kv.usage, kv.num_free_blocks, kv.num_blocks, kv.stats.queries, kv.stats.hits,
                     sched.spec_stats.num_drafts, sched.spec_stats.num_draft_tokens,
                     sched.spec_stats.num_accepted_tokens, list(sched.spec_stats.accepted_per_pos),
                     *_host_stats(core))


def _host_stats(core: EngineCore) -> tuple[int, int, int, int]:
    """The host tier's (queries, hits, bytes stored, bytes loaded); zeros without one."""
    host = core.scheduler.kv.host
    if host is None:
        return 0, 0, 0, 0
    s, page = host.stats, core.host_page_bytes
    return s.queries, s.hits, s.blocks_stored * page, s.blocks_loaded * page


class CoreRequests:
    """The core's live requests by id, so outputs can carry their lifecycle facts."""

    def __init__(self) -> None:
        self.live: dict[str, Request] = {}

    def wrap(self, outputs: list[EngineCoreOutput]) -> list[CoreOutput]:
        """Wire records for outputs; finished requests are forgotten."""
        live = self.live
        res = []
        for o in outputs:
            res.append(core_output(o, live.get(o.req_id)))
            if o.finish_reason is not None:
                live.pop(o.req_id, None)
        return res


class InprocCoreClient:
    """Drives an EngineCore in this process: get_output runs one step."""

    def __init__(self, core: EngineCore, executor: Any, kv_bytes_per_token: int) -> None:
        self.core = core
        self.executor = executor
        self.scheduler = core.scheduler
        self.num_blocks = core.config.num_blocks
        self.kv_bytes_per_token = kv_bytes_per_token
        self._requests = CoreRequests()

    @property
    def num_steps(self) -> int:
        """Engine steps run so far."""
        return self.core.num_steps

    @property
    def last_scheduler_output(self) -> Any:
        """The SchedulerOutput of the step just run (replay checks read it)."""
        return self.core.last_scheduler_output

    def __getattr__(self, name: str) -> Any:
        # Read-through to the EngineCore for code written against it.
        return getattr(self.__dict__["core"], name)

    def add_request(self, request: Request) -> None:
        """Queue on the core (typed error if it can never be served)."""
        self.core.add_request(request)
        self._requests.live[request.request_id] = request

    def abort(self, request_ids: Iterable[str], reason: FinishReason = FinishReason.ABORT) -> None:
        """Abort on the core at once; KV blocks are freed before this returns."""
        ids = list(request_ids)
        self.core.abort(ids, time.monotonic(), reason)
        for rid in ids:
            self._requests.live.pop(rid, None)

    def get_output(self, timeout: float = 0.0) -> CoreStep | None:
        """Run one step now (a step in this process always returns, so no timeout)."""
        if not self.core.has_unfinished_requests():
            return None
        outputs, stats = self.core.step(time.monotonic())
        return CoreStep(self._requests.wrap(outputs), stats)

    def has_unfinished_requests(self) -> bool:
        """True while the core has anything waiting or running."""
        return self.core.has_unfinished_requests()

    def set_step_log(self, on: bool, record_schedule: bool = False) -> None:
        """Hand the core a clock and the workers phase timing (the engine builds the records)."""
        self.core.clock = time.perf_counter if on else None
        self.executor.set_timing(on)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (PrefixCacheBusyError while requests hold blocks)."""
        self.core.scheduler.reset_prefix_cache()

    def has_pending(self) -> bool:
        """Always False: requests and aborts take effect before the call returns."""
        return False

    def stats(self) -> CoreStats:
        """The live scheduler's state."""
        return core_stats(self.core)

    def shutdown(self) -> None:
        """Stop the executor (workers, step log)."""
        self.executor.shutdown()
