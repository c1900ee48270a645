"""Run one study point or a grid of them (processes or Ray, progress bar), one row per point."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from twinserve.backends.sim.host_link import HostTierExecutor
from twinserve.sim.build import _cfg_error, build, simulate
from twinserve.sim.config import StudyConfig, coerce, resolve_field, set_field, validate
from twinserve.sim.errors import ConfigError
from twinserve.sim.kv_offload import tier_columns
from twinserve.sim.metrics import beyond_fit, mark_warmup_steps, requests_frame, steps_frame, summarize
from twinserve.sim.runner import PointError, PointFailure, run_jobs
from twinserve.sim.workload import Workload


@dataclass(slots=True)
class PointResult:
    """A study point's summary row and its per-request, per-step (and per-replica) tables."""

    row: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    replicas: pd.DataFrame | None = None


def is_cluster(cfg: StudyConfig) -> bool:
    """True when the study has more than one replica (or disaggregated pools)."""
    return cfg.cluster.num_replicas > 1 or cfg.cluster.num_prefill_replicas > 0


def check_turns(cfg: StudyConfig, workload: Workload) -> dict[str, int]:
    """The run's follow-up and trace counts for its row; ConfigError when turns > 1 made none."""
    ls = workload.length_stats
    if cfg.workload.turns > 1 and ls.followups == 0 and ls.followups_dropped > 0:
        raise _cfg_error(cfg, "workload", "turns",
                         f"turns = {cfg.workload.turns}, but every follow-up turn "
                         f"({ls.followups_dropped}) outgrew max_model_len = "
                         f"{cfg.scheduler.max_model_len}, so only first turns ran; raise "
                         "max_model_len, lower prompt_max, output_max or followup_tokens, "
                         "or set turns = 1")
    # A count taken from the trace's rows (num_requests not set) is short by its dropped rows: not "short".
    short = max(0, ls.short - ls.dropped) if cfg.num_requests_from_trace else ls.short
    return {"followups_dropped": ls.followups_dropped, "requests_short": short}


def run_cluster_point(cfg: StudyConfig, overrides: dict[str, Any] | None = None,
                      itl: bool = True) -> PointResult:
    """Simulate a cluster configuration and compute cluster and per-replica metrics."""
    from twinserve.sim.cluster_study import simulate_cluster

    built, res = simulate_cluster(cfg)
    return cluster_point_result(cfg, built, res, overrides, itl)


def cluster_point_result(cfg: StudyConfig, built: Any, res: Any,
                         overrides: dict[str, Any] | None = None, itl: bool = True) -> PointResult:
    """The metrics of one finished cluster run (built: sim.cluster_study.BuiltCluster).

    itl=False: the requests table has empty itl_s lists (the row's ITLs are the same).
    """
    from twinserve.sim.cluster_study import cluster_frames, cluster_row, replicas_frame

    counts = check_turns(cfg, built.workload)
    req, steps = cluster_frames(res, itl)
    per = replicas_frame(built, res, req)
    e = cfg.engine
    extra: dict[str, Any] = dict(overrides or {})
    extra.update({"model": e.model, "hardware": e.hardware, "tp": e.tensor_parallel_size,
                  "cost_model": built.engines[0].cost_model.name})
    row = cluster_row(built, res, req, steps, per, extra, _token_times(res.total, itl))
    row.update(counts)
    return PointResult(row, req, mark_warmup_steps(steps, req), per)


def run_point(cfg: StudyConfig, overrides: dict[str, Any] | None = None,
              itl: bool = True) -> PointResult:
    """Simulate one configuration and compute its metrics (itl=False: no itl_s lists in its table)."""
    if is_cluster(cfg):
        return run_cluster_point(cfg, overrides, itl)
    built, result = simulate(cfg)
    return point_result(cfg, built, result, overrides, itl)


def _token_times(result: Any, itl: bool) -> list[list[float]] | None:
    # Without the itl_s lists, summarize takes the ITLs from the records (numpy, same values).
    return None if itl else [r.token_times for r in result.records]


def point_result(cfg: StudyConfig, built: Any, result: Any,
                 overrides: dict[str, Any] | None = None, itl: bool = True) -> PointResult:
    """The metrics of one finished single-engine run (built: sim.build.BuiltStudy).

    itl=False: the requests table has empty itl_s lists (the row's ITLs are the same).
    """
    counts = check_turns(cfg, built.workload)
    req = requests_frame(result, itl)
    steps = steps_frame(result)
    e = built.cfg.engine  # with replica 0's overrides, if any
    totals = built.simulation.executor.totals
    extra: dict[str, Any] = dict(overrides or {})
    extra.update({"model": e.model, "hardware": e.hardware, "tp": e.tensor_parallel_size,
                  "cost_model": built.cost_model.name})
    row = summarize(result, req, steps, cfg.slo, extra, _token_times(result, itl))
    row.update(beyond_fit([built.simulation.executor]))
    gpus = e.tensor_parallel_size * e.data_parallel_size * e.pipeline_parallel_size
    row["mfu"] = totals.mfu(built.model, built.hardware, gpus)
    row["mbu"] = totals.mbu(built.model, built.hardware, gpus)
    row["token_throughput_bound"] = built.roofline.max_tokens_per_second()
    ls = built.workload.length_stats
    row["overlong_policy"] = ls.policy
    row["overlong_clipped"] = ls.clipped
    row["overlong_dropped"] = ls.dropped
    row.update(counts)
    tier = built.simulation.core.executor
    if isinstance(tier, HostTierExecutor):
        row.update(tier_columns(tier, built.simulation.core.scheduler.kv, result.end_time))
    return PointResult(row, req, mark_warmup_steps(steps, req))


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """['field=a,b,c', ...] -> {'section.field': ['a', 'b', 'c']} (fields checked)."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(spec, "a grid axis is written field=value1,value2,...")
        name, values = spec.split("=", 1)
        dotted = resolve_field(name.strip())
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not items:
            raise ConfigError(dotted, "the grid axis has no values")
        for v in items:
            coerce(dotted, v)  # fail before anything runs
        grid[dotted] = items
    return grid


def grid_points(base: StudyConfig, grid: dict[str, list[str]]
                ) -> list[tuple[dict[str, Any], StudyConfig]]:
    """The cartesian product of the grid applied to copies of base."""
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        cfg = copy.deepcopy(base)
        point: dict[str, Any] = {}
        for n, v in zip(names, values):
            set_field(cfg, n, v)
            point[n.split(".", 1)[1]] = getattr(getattr(cfg, n.split(".")[0]), n.split(".", 1)[1])
        out.append((point, cfg))
    return out


def check_points(points: list[tuple[dict[str, Any], StudyConfig]],
                 failures: list[PointFailure] | None = None) -> list[tuple[dict[str, Any], StudyConfig]]:
    """Validate and build every grid point before any runs.

    With a failures list, bad points are recorded there and left out; without, the first fails.
    """
    good = []
    for point, cfg in points:
        try:
            validate(cfg)
            build(cfg)
        except ConfigError as e:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            err = ConfigError(e.field, f"{e.args[1]} (grid point {where})", e.file, e.line)
            if failures is None:
                raise err from None
            failures.append(PointFailure(point, str(err)))
            continue
        good.append((point, cfg))
    return good


def _run(args: tuple[dict[str, Any], StudyConfig, bool]) -> PointResult:
    point, cfg, keep = args
    res = run_point(cfg, point, itl=keep)
    if not keep:
        res.requests = res.requests.iloc[0:0]
        res.steps = res.steps.iloc[0:0]
        res.replicas = None
    return res


def run_grid(base: StudyConfig, grid: dict[str, list[str]], workers: int | None = None,
             progress: bool = True, keep_tables: bool = True, ray_address: str | None = None,
             failures: list[PointFailure] | None = None) -> list[PointResult]:
    """Every grid point, in parallel (processes, or Ray tasks with ray_address), in grid order.

    Failing points go to failures, or without one raise PointError after every point ran.
    """
    points = check_points(grid_points(base, grid), failures)
    jobs = [(p, c, keep_tables) for p, c in points]
    out = run_jobs(_run, jobs, [p for p, _ in points], workers, ray_address, "sweep", progress)
    failed = [r for r in out if isinstance(r, PointFailure)]
    if failed and failures is None:
        raise PointError(failed)
    if failures is not None:
        failures.extend(failed)
    return [r for r in out if not isinstance(r, PointFailure)]
