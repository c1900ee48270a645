"""One `simulate search` run, ended as soon as its SLOs are lost beyond doubt, and the
steady-state estimate that places each configuration's first run near its answer.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from twinserve.core.request import Request
from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig, replica_config
from twinserve.sim.gc_policy import recycle_blocks, release_cluster, simulation_gc
from twinserve.sim.metrics import slo_row
from twinserve.sim.study import _run, cluster_point_result, is_cluster, point_result
from twinserve.sim.world import ArrivalSource, RequestRecord


def _metric(rec: RequestRecord, metric: str) -> float | None:
    """A finished request's value of ttft/tpot/e2e/queue, as sim.metrics computes it."""
    if rec.finish_time is None:
        return None
    if metric == "ttft":
        return rec.first_token_time - rec.arrival_time if rec.first_token_time is not None else None
    if metric == "tpot":
        n = rec.num_output_tokens
        return (rec.finish_time - rec.first_token_time) / (n - 1) if n > 1 else None
    if metric == "e2e":
        return rec.finish_time - rec.arrival_time
    if metric == "queue":
        return (rec.first_scheduled_time - rec.arrival_time
                if rec.first_scheduled_time is not None else None)
    return None


def exceed_needed(total: int, q: float) -> int:
    """Values above a limit that force np.percentile(values, 100q) above it, for <= total values.

    Linear interpolation reads the sorted values at floor and ceil of (n - 1) q; once both are
    above the limit so is the percentile. n - floor((n - 1) q) never falls as n grows, so the
    count for the largest possible n is safe for any n the run ends with.
    """
    return total - math.floor((total - 1) * q)


@dataclass(slots=True)
class SLOGuard:
    """Counts finished requests past each percentile SLO; True once the run must miss one."""

    total: int
    checks: list[tuple[str, str, float, int]] = field(default_factory=list)  # col, metric, limit, n
    counts: list[int] = field(default_factory=list)
    reason: str = ""
    # Per check: requests whose TTFT miss was counted before they finished (at the first token,
    # or still waiting past arrival + limit): not counted again at finish.
    early: list[set[str]] = field(default_factory=list)
    # Requests whose first token was reported (first_token); with watch_waiting, the arrivals
    # in order, the clock, and per check how many arrivals were looked at.
    seen: set[str] = field(default_factory=set)
    arrived: list[Any] | None = None
    clock: Any = None
    source: Any = None
    waited: list[int] = field(default_factory=list)

    @classmethod
    def for_run(cls, slos: dict[str, float], total: int) -> "SLOGuard | None":
        """A guard over the p-statistic SLOs (a mean cannot be settled early); None if none."""
        g = cls(total)
        for col, limit in slos.items():
            stat, metric = col.split("_")[0], col.split("_")[1]
            if stat.startswith("p") and metric in ("ttft", "tpot", "e2e", "queue"):
                g.checks.append((col, metric, limit, exceed_needed(total, int(stat[1:]) / 100)))
        g.counts = [0] * len(g.checks)
        g.early = [set() for _ in g.checks]
        g.waited = [0] * len(g.checks)
        return g if g.checks else None

    def __call__(self, rec: RequestRecord) -> bool:
        if getattr(rec, "warmup", False):  # a closed loop's warm-up is not measured
            return False
        if rec.finish_reason == "refused":
            self.reason = "a request was refused"
            return True
        early = self.early
        for i, (col, metric, limit, need) in enumerate(self.checks):
            if metric == "ttft" and early[i] and rec.request_id in early[i]:
                continue  # counted before it finished (first_token, _waiting)
            v = _metric(rec, metric)
            if v is not None and v > limit:
                self.counts[i] += 1
                if self.counts[i] >= need:
                    self.reason = self._lost(col, need, limit)
                    return True
        return self.arrived is not None and self._waiting()

    def _lost(self, col: str, need: int, limit: float) -> str:
        """The reason a run stops: need of its requests over one SLO's limit."""
        return f"{col} lost: {need} of at most {self.total} requests over {limit:g} s"

    def first_token(self, req: Request) -> bool:
        """Count a TTFT miss at the request's first token, when it is certain; True: lost.

        The value is the one its record will hold (first_token_time is set once), so counting it
        here instead of at finish moves the stop earlier and never changes the verdict: a request
        that gets its first token either finishes (its TTFT is in the row) or the row fails anyway
        (completed < num_requests).
        """
        item = req.payload
        if getattr(item, "warmup", False) or req.first_token_time is None:
            return False
        rid = req.request_id
        self.seen.add(rid)
        ttft = req.first_token_time - req.arrival_time
        lost = False
        for i, (col, metric, limit, need) in enumerate(self.checks):
            if metric == "ttft" and ttft > limit:
                if rid not in self.early[i]:
                    self.early[i].add(rid)
                    self.counts[i] += 1
                if self.counts[i] >= need and not lost:
                    self.reason = self._lost(col, need, limit)
                    lost = True
        return lost or (self.arrived is not None and self._waiting())

    def watch_waiting(self, env: Any, source: Any) -> None:
        """Also count a TTFT miss for each arrived request still without its first token past
        arrival + limit (an open loop's source: its pops are noted in arrival order).

        Every step that has started by env.now was priced when it started and its first tokens
        reported then (sim.world.first_tokens), and no step starts before env.now: a request not
        reported yet gets its first token at env.now or later, so now - arrival > limit makes its
        TTFT, as its record will hold it, over the limit. Needs first_token set as the hook.
        """
        arrived: list[Any] = []
        pop = source.pop_until

        def pop_until(t: float) -> list[Any]:
            items = pop(t)
            if items:
                arrived.extend(items)
            return items

        source.pop_until = pop_until  # the run reads it off the instance at each arrival
        self.arrived = arrived
        self.clock = env
        self.source = source

    def unwatch(self) -> None:
        """Drop the wrapper (source -> it -> source is a cycle, freed only by a full collection)."""
        if self.source is not None:
            self.source.__dict__.pop("pop_until", None)
            self.source = None

    def _waiting(self) -> bool:
        """Count the requests waiting past their TTFT limit at the clock's now; True: lost."""
        now = self.clock.now
        arrived = self.arrived
        assert arrived is not None
        seen = self.seen
        lost = False
        for i, (col, metric, limit, need) in enumerate(self.checks):
            if metric != "ttft":
                continue
            k = self.waited[i]
            counted = self.early[i]
            while k < len(arrived):
                item = arrived[k]
                if now - item.arrival_time <= limit:
                    break  # arrivals are in order: the rest waited less
                rid = item.request_id
                if rid not in seen and rid not in counted:
                    counted.add(rid)
                    self.counts[i] += 1
                k += 1
            self.waited[i] = k
            if self.counts[i] >= need and not lost:
                self.reason = self._lost(col, need, limit)
                lost = True
        return lost

    @property
    def watches_ttft(self) -> bool:
        """True when a TTFT percentile is among the checks (the first-token hook is worth it)."""
        return any(metric == "ttft" for _, metric, _, _ in self.checks)


def run_search_point(job: tuple[Any, ...]) -> dict[str, Any]:
    """Simulate one (configuration, rate); job is (point, cfg, slos, early[, lean]). With
    early=True stop once an SLO is lost for sure.

    A stopped run's row has completed < num_requests, so sim.search.meets fails it, and says
    why in `stopped_early`. lean=True (a run only judged: sim.search_band's extra seeds) gives
    a run that meets its SLOs the verdict columns only (sim.metrics.slo_row, summarize's values
    to the bit) and records no per-token times unless an ITL is an SLO.
    """
    # Building a pool of 10^5 KV blocks under the default GC runs full collections over them;
    # the simulation's own GC policy (sim.gc_policy) covers the build and the row too.
    with simulation_gc():
        return _search_point(*job)


def _search_point(point: dict[str, Any], cfg: StudyConfig, slos: dict[str, float], early: bool,
                  lean: bool = False) -> dict[str, Any]:
    w = cfg.workload
    # Follow-up turns make the request count unknown in advance; clusters run their own loop.
    guard = SLOGuard.for_run(slos, w.num_requests) if early and w.turns == 1 else None
    if guard is None:
        return _run((point, cfg, False)).row
    # A closed loop's warm-up is summarize's to leave out: full rows there.
    lean = lean and w.concurrency == 0
    if is_cluster(cfg):
        return _cluster_point(point, cfg, guard, slos if lean else None)
    built = build(cfg)
    if lean:
        built.simulation.keep_token_times = _needs_itl(slos)
    built.simulation.abort = guard
    if guard.watches_ttft:
        built.simulation.first_token = guard.first_token
        _watch_waiting(guard, built.simulation, w)
    result = built.simulation.run()
    if built.simulation.aborted:
        row = {**point, "num_requests": w.num_requests, "completed": len(result.records),
               "refused": 0, "stopped_early": guard.reason, "sim_wall_s": result.wall_time}
    elif lean:
        row = {**point, **slo_row(result, list(slos)), "stopped_early": ""}
    else:
        row = point_result(cfg, built, result, point, itl=False).row
        row["stopped_early"] = ""
    guard.unwatch()
    recycle_blocks([built.simulation.core])
    return row


def _needs_itl(slos: dict[str, float]) -> bool:
    """True when an SLO is on ITL (then a run must record every token's time)."""
    return any(col.split("_")[1] == "itl" for col in slos)




def _watch_waiting(guard: SLOGuard, sim: Any, w: Any) -> None:
    """Let the guard count requests waiting past their TTFT limit (open loop, one turn only:
    a closed loop's or a follow-up's arrival is made at run time, out of the source's order)."""
    if w.concurrency == 0 and w.turns == 1 and type(sim.source) is ArrivalSource:
        guard.watch_waiting(sim.env, sim.source)


class _Lost(Exception):
    """Raised out of a cluster's SimPy loop once its guard has seen an SLO lost."""


def _cluster_point(point: dict[str, Any], cfg: StudyConfig, guard: SLOGuard,
                   lean: dict[str, float] | None = None) -> dict[str, Any]:
    """A cluster (or disaggregated) run, ended by the guard like a single engine's; with lean
    (the SLOs), a run that meets them gets only its verdict columns (sim.metrics.slo_row)."""
    from twinserve.sim.cluster_study import build_cluster

    def on_record(rec: RequestRecord) -> None:
        if guard(rec):
            raise _Lost  # propagates out of env.run(): the cluster loop needs no abort flag

    def on_first_token(req: Request) -> bool:
        if guard.first_token(req):
            raise _Lost
        return False

    built = build_cluster(cfg, on_record=on_record)
    if lean is not None:
        built.simulation.keep_token_times = _needs_itl(lean)
    if guard.watches_ttft:
        built.simulation.first_token = on_first_token
        _watch_waiting(guard, built.simulation, cfg.workload)
    try:
        res = built.simulation.run()
    except _Lost as lost:
        row = {**point, "num_requests": cfg.workload.num_requests,
               "completed": len(built.simulation.records), "refused": 0,
               "stopped_early": guard.reason, "sim_wall_s": 0.0}
        _clear_frames(lost)
    else:
        if lean is not None:
            row = {**point, **slo_row(res.total, list(lean)), "stopped_early": ""}
        else:
            row = cluster_search_row(cfg, built, res, point)
            row["stopped_early"] = ""
    guard.unwatch()
    recycle_blocks([r.core for r in built.simulation.replicas])
    release_cluster(built.simulation)
    return row




def cluster_search_row(cfg: StudyConfig, built: Any, res: Any,
                       point: dict[str, Any]) -> dict[str, Any]:
    """cluster_point_result(cfg, built, res, point, itl=False).row, to the bit, without the tables
    a search drops: an open-loop row needs of the per-replica table only its MFUs, and of the
    per-step tables only the largest KV usage (cluster_row replaces summarize's time averages
    with the replicas' own areas). Those tables (8 per-replica filters and quantiles, 8 step
    frames and their concat) were ~60% of a passing FP8 8x H200 cluster run's row (~25 ms of a
    0.2 s run). A closed loop (a measured window over the steps) takes the full path."""
    import pandas as pd

    from twinserve.sim.cluster_study import cluster_row
    from twinserve.sim.metrics import requests_frame
    from twinserve.sim.study import _token_times, check_turns

    total = res.total
    if any(r.client >= 0 for r in total.records) or not res.replicas:
        return cluster_point_result(cfg, built, res, point, itl=False).row
    counts = check_turns(cfg, built.workload)
    req = requests_frame(total, False)
    usage = [r.steps.kv_usage for r in res.replicas if len(r.steps.kv_usage)]
    # summarize reads max_kv_usage from the steps and time averages over [0, end], which
    # cluster_row overwrites from the replicas' areas (open loop): one step row with no duration.
    steps = (pd.DataFrame({"kv_usage": [float(max(max(u) for u in usage))], "duration_s": [0.0],
                           "batch_size": [0], "num_waiting": [0], "num_in_system": [0]})
             if usage else pd.DataFrame())
    per = pd.DataFrame({"mfu": [e.executor.totals.mfu(e.model, e.hardware,
                                                      replica_config(built.cfg, i).engine
                                                      .tensor_parallel_size)
                                for i, e in enumerate(built.engines)]})
    e = cfg.engine
    extra: dict[str, Any] = dict(point)
    extra.update({"model": e.model, "hardware": e.hardware, "tp": e.tensor_parallel_size,
                  "cost_model": built.engines[0].cost_model.name})
    row = cluster_row(built, res, req, steps, per, extra, _token_times(total, False))
    row.update(counts)
    return row


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the frames an exception out of a SimPy run went through (and its
    cause's: SimPy re-raises a process's exception as a copy): each traceback's frame holds the
    exception (a cycle) and the simulation's generators' frames hold the simulation."""
    seen = 0
    while exc is not None and seen < 4:
        traceback.clear_frames(exc.__traceback__)
        exc, seen = exc.__cause__, seen + 1


def steady_state_rate(cfg: StudyConfig, slos: dict[str, float]) -> float:
    """Requests/s the cost model sustains at the largest batch meeting the TPOT SLO."""
    return steady_state(cfg, slos)[0]


def steady_state(cfg: StudyConfig, slos: dict[str, float]) -> tuple[float, int]:
    """(requests/s, batch) the cost model sustains at the largest batch meeting the TPOT SLO.

    Per request: its prompt's prefill time plus its output tokens at batch B's step time / B.
    B is bounded by the KV pool (mean context), max_num_seqs and the TPOT limit; a crude
    figure, only used to place the first run (and calibrated by the first answers).
    """
    built = build(cfg)
    items = list(built.workload.items())
    if not items:
        return 0.0, 0
    isl = sum(i.num_prompt_tokens for i in items) / len(items)
    osl = max(1.0, sum(i.num_output_tokens for i in items) / len(items))
    cm = built.cost_model
    kv_tokens = built.capacity.num_blocks * built.cfg.scheduler.block_size
    ctx = isl + osl / 2
    b_max = max(1, min(built.cfg.scheduler.max_num_seqs, int(kv_tokens / max(ctx, 1.0))))
    tpot = min([v for k, v in slos.items() if "tpot" in k or "itl" in k] or [math.inf])

    def t_dec(b: int) -> float:
        return cm.step_time(0, 0, 0, 0.0, b, int(b * ctx))

    b = b_max
    if math.isfinite(tpot):
        lo, hi = 1, b_max  # largest b with t_dec(b) within 80% of the limit: prefill shares steps
        if t_dec(1) > 0.8 * tpot:
            b = 1
        else:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if t_dec(mid) <= 0.8 * tpot else (lo, mid - 1)
            b = lo
    n_isl = max(1, int(isl))
    t_pre = cm.step_time(n_isl, 1, 0, n_isl * (n_isl + 1) / 2, 0, 0)
    per_request = t_pre + osl * t_dec(b) / b
    c = cfg.cluster
    if c.num_prefill_replicas:  # disaggregated: the slower of the two pools sets the rate
        decode = c.num_replicas - c.num_prefill_replicas
        rate = min(c.num_prefill_replicas / t_pre, decode * b / (osl * t_dec(b)))
        return rate, b * decode
    replicas = max(1, c.num_replicas)
    return (replicas / per_request if per_request > 0 else 0.0), b * replicas
