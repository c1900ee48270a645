"""Replay mode, the strictest check of the twin: the simulator fed the real run's step times.

Step k of the simulation starts when the real step k started (so arrivals are admitted
where the engine admitted them) and lasts as long as it really lasted. The scheduler is
the same object in both worlds, so the schedule must come out identical: the same
requests with the same token counts in every step, the same preemptions, the same prefix
hits. Any difference is a bug in the twin (a workload or executor that differs from the
engine), not a cost-model error.

A follow-up turn arrives when the real client got the previous answer (plus its think time),
so the replay makes follow-ups from the real finish times. With the engine core in its own
process the steps are the core's (realrun.py): step k admits the arrivals that had reached
the core (`RealRun.admit_until`), and token times differ from the real ones by the hop back
to the front end (reported in max_token_time_diff_s, not part of `exact`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from twinserve.backends.sim.executor import SimExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.sim.world import RunResult, Simulation
from twinserve.sim.workload import Workload

from twinserve.twin.realrun import RealRun


class ReplayCostModel:
    """Returns the measured step durations, in order."""

    name = "replay"

    def __init__(self, durations: list[float]) -> None:
        self.durations = durations
        self.next = 0

    def step_time(self, *features: float) -> float:
        """The next measured duration (0 past the end: the check reports the overrun)."""
        i = self.next
        self.next += 1
        return self.durations[i] if i < len(self.durations) else 0.0


class RecordingExecutor(SimExecutor):
    """A SimExecutor that also keeps what every step scheduled."""

    def __init__(self, cost_model: Any) -> None:
        super().__init__(cost_model)
        self.schedules: list[dict[str, int]] = []
        self.preempted: list[list[str]] = []

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Record the step, then run it as the simulator does."""
        self.schedules.append(dict(so.num_scheduled_tokens))
        self.preempted.append(sorted(so.preempted_req_ids))
        return super().execute(so)


@dataclass(slots=True)
class ReplayCheck:
    """How the replayed schedule compares with the real one."""

    exact: bool
    num_steps_real: int
    num_steps_sim: int
    first_mismatch: dict[str, Any] | None = None
    prefix_hit_mismatches: int = 0
    preemption_mismatches: int = 0
    max_token_time_diff_s: float = 0.0
    result: RunResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {"exact": self.exact, "num_steps_real": self.num_steps_real,
                "num_steps_sim": self.num_steps_sim, "first_mismatch": self.first_mismatch,
                "prefix_hit_mismatches": self.prefix_hit_mismatches,
                "preemption_mismatches": self.preemption_mismatches,
                "max_token_time_diff_s": self.max_token_time_diff_s}


def _follow_real_finishes(workload: Workload, finish: dict[str, float]) -> None:
    """Make follow-up turns from the real finish times (what the real client waited for)."""
    own = workload.next_turn

    def next_turn(item: Any, context: list[int], finish_time: float) -> Any:
        return own(item, context, finish.get(item.request_id, finish_time))

    workload.next_turn = next_turn  # type: ignore[method-assign]


def replay(real: RealRun, make_workload: Callable[[], Workload],
           sched_cfg: SchedulerConfig) -> ReplayCheck:
    """Run the simulator on the real run's step times and compare the schedules."""
    durations = [e - s for s, e in zip(real.step_starts, real.step_ends)]
    executor = RecordingExecutor(ReplayCostModel(durations))
    core = EngineCore(dataclasses.replace(sched_cfg), executor)
    workload = make_workload()
    if workload.cfg.turns > 1:
        _follow_real_finishes(workload, {r.request_id: r.finish_time for r in real.records
                                         if r.finish_time is not None})
    sim = Simulation(core, executor, workload, step_starts=real.step_starts, admit_until=real.admit_until)
    result = sim.run()
    mismatch: dict[str, Any] | None = None
    for k, (a, b) in enumerate(zip(real.schedules, executor.schedules)):
        if a != b:
            mismatch = {"step": k, "what": "scheduled tokens", "real": a, "sim": b}
            break
        if real.preempted[k] != executor.preempted[k]:
            mismatch = {"step": k, "what": "preempted", "real": real.preempted[k],
                        "sim": executor.preempted[k]}
            break
    n_real, n_sim = len(real.schedules), len(executor.schedules)
    if mismatch is None and (n_real != n_sim or sim.replay_exhausted):
        mismatch = {"step": min(n_real, n_sim), "what": "number of steps", "real": n_real,
                    "sim": n_sim}
    real_by_id = {r.request_id: r for r in real.records}
    hits = pre = 0
    diff = 0.0
    for r in result.records:
        q = real_by_id.get(r.request_id)
        if q is None:
            continue
        hits += q.prefix_hit_tokens != r.prefix_hit_tokens
        pre += q.num_preemptions != r.num_preemptions
        for x, y in zip(q.token_times, r.token_times):
            diff = max(diff, abs(x - y))
    if mismatch is None and len(result.records) != len(real.records):
        mismatch = {"step": None, "what": "number of requests", "real": len(real.records),
                    "sim": len(result.records)}
    exact = mismatch is None and hits == 0 and pre == 0
    return ReplayCheck(exact, n_real, n_sim, mismatch, hits, pre, diff, result)
