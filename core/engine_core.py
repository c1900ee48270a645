"""The engine core: schedule -> execute -> update, one step at a time, time injected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from twinserve.core.request import FinishReason, Request
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from twinserve.core.sched.scheduler import Scheduler
from twinserve.core.spec_decode import SpeculativeConfig


class Executor(Protocol):
    """Runs a step: a cost model in the simulator, workers in the real engine."""

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Compute the step; sampled tokens (and duration, if known)."""


@dataclass(slots=True)
class StepStats:
    """One engine step's record."""

    step: int
    start_time: float
    duration: float
    num_running: int
    num_waiting: int
    num_new_reqs: int
    num_scheduled_reqs: int
    num_scheduled_tokens: int
    kv_usage: float
    prefix_queries: int
    prefix_hits: int
    num_preempted: int
    num_finished: int
    # Only with a clock (else 0).
    schedule_time: float = 0.0
    execute_time: float = 0.0
    update_time: float = 0.0
    num_spec_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class EngineCore:
    """Owns the scheduler and an executor; the busy loop calls step(now).

    Time is injected; the optional clock only times phases.
    """

    def __init__(self, config: SchedulerConfig, executor: Executor,
                 clock: Callable[[], float] | None = None,
                 speculative_config: SpeculativeConfig | None = None) -> None:
        self.config = config
        self.scheduler = Scheduler(config, speculative_config)
        self.executor = executor
        self.clock = clock
        self.num_steps = 0
        # Bytes one block moves to or from a host tier (the real engine sets it; for metrics).
        self.host_page_bytes = 0
        # For step logs and replay checks.
        self.last_scheduler_output: SchedulerOutput | None = None

    def add_request(self, request: Request) -> None:
        """Queue a request (typed error if it can never be served)."""
        self.scheduler.add_request(request)

    def abort(self, request_ids: Iterable[str], now: float | None = None,
              reason: FinishReason = FinishReason.ABORT) -> list[EngineCoreOutput]:
        """End requests early; returns their final outputs."""
        return self.scheduler.abort_requests(request_ids, reason, now)

    def has_unfinished_requests(self) -> bool:
        """True while anything is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    def step(self, now: float) -> tuple[list[EngineCoreOutput], StepStats | None]:
        """Run one iteration at time now; tokens are stamped now + the step's duration."""
        sched = self.scheduler
        if not sched.has_unfinished_requests():
            return [], None
        clock = self.clock
        c0 = clock() if clock is not None else 0.0
        so = sched.schedule(now)
        c1 = clock() if clock is not None else 0.0
        mro = self.executor.execute(so)
        c2 = clock() if clock is not None else 0.0
        duration = mro.step_time or 0.0
        outputs = sched.update_from_output(so, mro, now + duration)
        if mro.prompt_logprobs or mro.failed:
            outputs = self._attach_extras(outputs, mro, now + duration)
        if clock is None:
            t_sched = t_exec = t_update = 0.0
        else:
            c3 = clock()
            t_sched, t_exec, t_update = c1 - c0, c2 - c1, c3 - c2
        self.last_scheduler_output = so
        kv = sched.kv
        stats = StepStats(
            self.num_steps, now, duration, sched.num_running, sched.num_waiting,
            len(so.scheduled_new_reqs), len(so.num_scheduled_tokens),
            so.total_num_scheduled_tokens, kv.usage, kv.stats.queries, kv.stats.hits,
            len(so.preempted_req_ids), len(sched.finished_req_ids), t_sched, t_exec, t_update,
            sched.step_num_spec_reqs, sched.step_num_draft_tokens, sched.step_num_accepted_tokens,
        )
        self.num_steps += 1
        return outputs, stats

    def _attach_extras(self, outputs: list[EngineCoreOutput], mro: ModelRunnerOutput,
                       now: float) -> list[EngineCoreOutput]:
        """Attach prompt logprobs, and end failed requests with an error."""
        by_id = {o.req_id: o for o in outputs}
        for rid, plp in (mro.prompt_logprobs or {}).items():
            out = by_id.get(rid)
            if out is None:  # a prefill chunk that sampled nothing
                if rid not in self.scheduler.requests:
                    continue
                out = by_id[rid] = EngineCoreOutput(rid, [])
                outputs.append(out)
            out.prompt_logprobs = plp
        if mro.failed:
            for out in self.scheduler.abort_requests(list(mro.failed), FinishReason.ERROR, now):
                out.error = mro.failed[out.req_id]
                prev = by_id.get(out.req_id)
                if prev is not None:
                    outputs.remove(prev)
                    out.prompt_logprobs = prev.prompt_logprobs
                outputs.append(out)
        return outputs
