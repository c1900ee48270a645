"""Two checks of a real run that are not the forecast.

Schedule equivalence: on the real step times the simulator must schedule exactly what the engine
did; a difference is a twin bug, never a cost-model error. Free running: the simulator on its own
clock with each step at its shape's measured duration, separating schedule drift from step pricing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fit import step_kind
from twinserve.backends.sim.fitted import FEATURE_COLUMNS
from twinserve.core.engine_core import EngineCore
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.sim.world import Simulation
from twinserve.sim.workload import Workload

from twinserve.twin.realrun import RealRun
from twinserve.twin.steps import step_residuals


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
class ScheduleCheck:
    """How the simulated schedule on the real step times compares with the real one."""

    equivalent: bool
    num_steps_real: int
    num_steps_sim: int
    first_mismatch: dict[str, Any] | None = None
    prefix_hit_mismatches: int = 0
    preemption_mismatches: int = 0
    max_token_time_diff_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return dataclasses.asdict(self)


def schedule_equivalence(real: RealRun, make_workload: Callable[[], Workload],
                         sched_cfg: SchedulerConfig) -> ScheduleCheck:
    """Run the simulator on the real run's step starts and times and compare the schedules."""
    durations = [e - s for s, e in zip(real.step_starts, real.step_ends)]
    executor = RecordingExecutor(ReplayCostModel(durations))
    core = EngineCore(dataclasses.replace(sched_cfg), executor)
    workload = make_workload()
    if workload.cfg.turns > 1:  # follow-ups from the real finish times (what the real client waited for)
        finish = {r.request_id: r.finish_time for r in real.records if r.finish_time is not None}
        own = workload.next_turn
        workload.next_turn = lambda item, ctx, t: own(item, ctx, finish.get(item.request_id, t))  # type: ignore
    sim = Simulation(core, executor, workload, step_starts=real.step_starts, admit_until=real.admit_until,
                     admit_count=real.admit_count)
    if workload.cfg.concurrency > 0:  # closed-loop clients freed at the real finishes too
        done = {r.request_id: r.finish_time for r in real.records if r.finish_time is not None}
        free = sim.source.on_done
        sim.source.on_done = lambda item, t, nxt=None: free(item, done.get(item.request_id, t), nxt)  # type: ignore
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
    same = mismatch is None and hits == 0 and pre == 0
    return ScheduleCheck(same, n_real, n_sim, mismatch, hits, pre, diff)


class ShapeCostModel:
    """Prices a step at the median measured duration of its shape.

    An unseen shape gets the profile's price times the run's measured/priced ratio for its kind.
    """

    name = "measured-by-shape"

    def __init__(self, rows: Sequence[dict[str, Any]], fallback: Any) -> None:
        by: dict[tuple[float, ...], list[float]] = {}
        for r in rows:
            if r["num_prefill_tokens"] + r["num_decode_seqs"] > 0:
                by.setdefault(_shape(r), []).append(float(r["step_time_s"]) + float(r.get("gap_s") or 0.0))
        self.table = {k: float(np.median(v)) for k, v in by.items()}
        ratios: dict[str, list[float]] = {}
        for kind, measured, priced, _ in step_residuals(fallback, rows):
            ratios.setdefault(kind, []).append(measured / priced)
        self.ratio = {k: float(np.median(v)) for k, v in ratios.items()}
        self.fallback, self.priced, self.missed = fallback, 0, 0

    def step_time(self, *f: float) -> float:
        """The measured median of this shape, else the fallback's price at its kind's ratio."""
        t = self.table.get(tuple(round(float(x), 6) for x in f))  # as _shape rounds
        self.priced, self.missed = self.priced + (t is not None), self.missed + (t is None)
        return t if t is not None else self.fallback.step_time(*f) * self.ratio.get(step_kind(f[0], f[4]), 1.0)


def _shape(row: dict[str, Any]) -> tuple[float, ...]:
    return tuple(round(float(row[c]), 6) for c in FEATURE_COLUMNS)


def free_running(rows: Sequence[dict[str, Any]], records: Sequence[Any], forecast_records: Sequence[Any],
                 make_workload: Callable[[], Workload], sched_cfg: SchedulerConfig, profile: Any,
                 spec: Any = None, seed: int = 0) -> dict[str, Any]:
    """Free-running simulation at measured shape durations: schedule drift and step-pricing error."""
    from twinserve.twin.compare import compare
    from twinserve.twin.forecast import simulate

    cm = ShapeCostModel(rows, profile)
    sim = simulate(cm, make_workload, sched_cfg, spec, seed)
    drift = compare(records, sim.records)["metrics"]
    pricing = compare(sim.records, forecast_records)["metrics"]
    errs = lambda m: {k: {q: v[q]["err"] for q in ("p50", "p90")} for k, v in m.items()}  # noqa: E731
    return {"steps_by_measured_shape": cm.priced, "steps_by_kind_ratio": cm.missed,
            "schedule_drift": errs(drift), "step_pricing": errs(pricing)}
