"""`simulate validate`: every measured row it can express, simulated, and the errors summarized.

Each row is a closed-loop study (sim/validate_rows.py) run as its benchmark ran
(sim/validate_protocol.py: by default every one of 10 N requests counted). TTFT and TPOT are the
means over the window; TTFT adds the serving front end's latency outside the engine
(sim/validate_engines.py; the engine's own is pred_ttft_engine_ms). Output throughput per GPU is derived from
them for both sides alike, as a closed-loop benchmark's is: N clients each finish a request every
TTFT + (OSL - 1) x TPOT, so tok/s/GPU = N x OSL / (TTFT + (OSL - 1) x TPOT) / GPUs.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pandas as pd

from twinserve.core.errors import TwinserveError
from twinserve.sim.gc_policy import recycle_blocks, release_cluster, simulation_gc

from twinserve.sim.validate_engines import frontend_latency_s
from twinserve.sim.validate_estimate import (FULL, drain_study, estimate_waves, estimator_label, uses_estimate,
                                            wave_estimate)
from twinserve.sim.validate_protocol import DEFAULT_WINDOW, harness, run_design
from twinserve.sim.validate_recipes import disagg_recipe, kv_cache_note, row_recipe
from twinserve.sim.validate_reduce import DEFAULT_REDUCTION, slice_row
from twinserve.sim.validate_rows import (NotExpressible, RowPlan, aic_version_used, closed_loop_available, num_gpus,
                                         parallelism, precision_fields, design_counts, row_plan,
                                         row_study, with_rate)
from twinserve.sim.validate_layouts import DEFAULT_DISAGG_ASSUMPTION

METRICS = ("ttft", "tpot", "tput", "ttft_all")  # ttft_all: the cold first wave counted too
# End each run once the requests up to the measured window's last are final: the same window,
# without simulating the last wave to its end (False: run every request out, for comparisons).
STOP_AT_WINDOW = True
# Fixed-rate stand-in for a closed loop (before [workload] concurrency exists): rate = N / E2E,
# iterated this many times from a one-wave start.
_LITTLE_ITERATIONS = 2


def throughput_per_gpu(concurrency: float, isl_unused: int, osl: int, ttft_ms: float, tpot_ms: float,
                       gpus: int) -> float:
    """Output tok/s per GPU of N closed-loop clients with zero think time (module docstring)."""
    cycle_s = (ttft_ms + (osl - 1) * tpot_ms) / 1000.0
    if not cycle_s > 0 or gpus <= 0:
        return float("nan")
    return concurrency * osl / cycle_s / gpus


def window_means(req: pd.DataFrame, warm: int, measured: int) -> dict[str, float]:
    """Mean TTFT, TPOT and E2E (ms) of requests warm .. warm + measured in arrival order."""
    done = req.sort_values(["arrival_s", "request_id"], kind="stable").iloc[warm:warm + measured]
    return {"ttft_ms": float(done["ttft_s"].mean() * 1000), "tpot_ms": float(done["tpot_s"].mean() * 1000),
            "e2e_ms": float(done["e2e_s"].mean() * 1000), "n": int(done["ttft_s"].notna().sum())}


def run_to_window(cfg: Any, count: int, stop_early: bool = True) -> pd.DataFrame:
    """The per-request table of a closed-loop study run until its first `count` requests are final.

    With stop_early the run ends there (sim.clients.FirstRequestsDone): those requests' rows are
    a full run's, and the requests after them, never measured, are not simulated to their end.
    """
    from twinserve.sim.build import build
    from twinserve.sim.clients import FirstRequestsDone
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.metrics import requests_frame
    from twinserve.sim.study import is_cluster

    cluster = is_cluster(cfg)
    # Validation reads requests only: a cluster keeps no step log.
    sim = build_cluster(cfg, keep_steps=False).simulation if cluster else build(cfg).simulation
    sim.keep_token_times = False  # ... and no per-token times (requests_frame(itl=False) reads none)
    if cluster:
        sim.count_blocks = True  # ... nor block ids: lazy decodes hold crossings' blocks as counts
    if stop_early:
        watch = FirstRequestsDone(count, lambda: sim.env.now)
        watch.watch(sim.source)
        sim.abort = watch
    # The run's collector settings held until the run is freed: unfrozen at the run's end, its
    # millions of objects would be walked by the first full collection the frame's rows set off
    # (seconds at thousands of clients) and then freed anyway.
    with simulation_gc():
        res = sim.run()
        frame = requests_frame(res.total if cluster else res, itl=False)
        _free_run(sim, cluster)
    return frame


PRELOAD_TRIES = 3  # rows of one (model, system, engine, version, mode) tried before preload_aic leaves it to the workers


def preload_aic(jobs: list[tuple[Any, ...]]) -> int:
    """Build each distinct (model, system, engine, version, mode) study of `jobs` once in this process,
    so the aic kernel tables its cost models read are loaded here; returns the studies built.

    run_validation calls it before its workers fork: they then share the loaded tables (read-only
    pages, not counted against a worker's memory cap: sim.runner._private_bytes) instead of each
    reading them again (1.5-4.6 s a database; docs/validate-speed.md). A study that cannot be built
    is skipped here (its worker reports it), and the next row of its kind tried in its place, up to
    PRELOAD_TRIES rows a kind.
    """
    from twinserve.sim.build import build
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.study import is_cluster

    done: set[tuple[str, ...]] = set()
    tries: dict[tuple[str, ...], int] = {}
    for job in jobs:
        row, cost_model = job[0], job[1]
        options = job[2] if len(job) > 2 and isinstance(job[2], dict) else {}
        key = tuple(str(row.get(k, "")) for k in ("model", "system", "backend", "backend_version", "mode"))
        if cost_model != "aic" or key in done or tries.get(key, 0) >= PRELOAD_TRIES:
            continue
        tries[key] = tries.get(key, 0) + 1
        try:
            cfg = row_study(pd.Series(row), cost_model, disagg=options.get("disagg", DEFAULT_DISAGG_ASSUMPTION),
                            window=options.get("window", DEFAULT_WINDOW))
            cfg, _ = slice_row(cfg, int(row["concurrency"]), options.get("reduce", DEFAULT_REDUCTION))
            if is_cluster(cfg):
                build_cluster(cfg, keep_steps=False)
            else:
                build(cfg)
        except (TwinserveError, ValueError):
            continue
        done.add(key)
    return len(done)


def _free_run(sim: Any, cluster: bool) -> None:
    """Let reference counting free a finished run, as a search's runs are: its KV blocks go to the
    next run's pools, and a cluster's suspended SimPy processes are closed (sim.gc_policy). Otherwise
    each study leaves its world (millions of objects at the head) to a full collection, which
    simulation_gc's frozen generations put off past the next studies: one worker grew to 12.8 GB
    (docs/validate-speed.md)."""
    recycle_blocks([r.core for r in sim.replicas] if cluster else [sim.core])
    if cluster:
        release_cluster(sim)


def simulate_row(job: tuple[Any, ...]) -> dict[str, Any]:
    """One row's prediction: its study run closed-loop (or by the Little's-law stand-in).

    job: (row as a dict, cost model[, options]); options: {"disagg": assumption (validate_layouts.py), "window":
    design (validate_protocol.py), "reduce": 'replicas' simulates a 1/g slice of a disaggregated cluster
    (validate_reduce.py; the `reduction` column says which) or 'none', "waves": K of an estimated row (None:
    validate_estimate.estimate_waves of its clients)}.
    """
    from twinserve.sim.study import run_point

    row, cost_model = job[0], job[1]
    options = job[2] if len(job) > 2 and isinstance(job[2], dict) else {}
    disagg = options.get("disagg", DEFAULT_DISAGG_ASSUMPTION)
    window = options.get("window", DEFAULT_WINDOW)
    t0, c0 = time.perf_counter(), time.process_time()
    cfg = row_study(pd.Series(row), cost_model, disagg=disagg, window=window)
    conc = int(row["concurrency"])
    design = run_design(pd.Series(row), window)
    # The row's estimator is chosen on its own clients; the runs below are of the slice's (sim = conc / g).
    cfg, part = slice_row(cfg, conc, options.get("reduce", DEFAULT_REDUCTION))
    sim = part.clients or conc
    warm, measured, total = design_counts(sim, design)
    extra: dict[str, Any] = {"estimator": "littles_law", "reduction": part.label()}  # estimator: set below
    if cost_model == "aic":
        extra["aic_version"] = aic_version_used(row)
    waves = total // sim if design.requests_per_client > 0 and sim > 0 else 0
    k = options.get("waves") or estimate_waves(conc)
    if closed_loop_available() and window == "benchmark" and uses_estimate(conc, waves, k):
        # The first waves and a drain wave; the waves between extrapolated from the last (validate_estimate.py).
        req = run_to_window(drain_study(cfg, sim, k), (k + 1) * sim, False)
        means = wave_estimate(req, sim, waves, k, drain=True)
        extra["pred_ttft_all_ms"] = means["ttft_ms"]  # every request counted already
        extra["estimator"] = estimator_label(k)
        loop = "closed"
    elif closed_loop_available():
        req = run_to_window(cfg, warm + measured, STOP_AT_WINDOW)
        means = window_means(req, warm, measured)
        extra["estimator"] = FULL if design.requests_per_client > 0 else "steady"
        # The cold wave and the window, as a benchmark without a warm-up that stops there reports.
        first = req.sort_values(["arrival_s", "request_id"], kind="stable").iloc[:warm + measured]
        extra["pred_ttft_all_ms"] = float(first["ttft_s"].mean() * 1000)
        loop = "closed"
    else:
        # A cold wave of N requests at once gives the first E2E; then a fixed rate N / E2E.
        wave = with_rate(cfg, 1.0)
        wave.workload.arrival = "all_at_once"
        wave.workload.num_requests = conc
        e2e = window_means(run_point(wave).requests, 0, conc)["e2e_ms"]
        for _ in range(_LITTLE_ITERATIONS):
            means = window_means(run_point(with_rate(cfg, conc / (e2e / 1000.0))).requests, warm, measured)
            e2e = means["e2e_ms"]
        loop = "littles_law"
    # The front end's first-token latency lies outside the simulated engine; it grows with the row's
    # prompt length (validate_engines.py).
    front_ms = frontend_latency_s(str(row["backend"]), int(row["isl"])) * 1000.0
    if "pred_ttft_all_ms" in extra:
        extra["pred_ttft_all_ms"] += front_ms
    return {"pred_ttft_ms": means["ttft_ms"] + front_ms, "pred_ttft_engine_ms": means["ttft_ms"],
            "pred_tpot_ms": means["tpot_ms"], "measured_requests": means["n"],
            "loop": loop, "window": window, "sim_wall_s": time.perf_counter() - t0,
            # This process's CPU seconds: on a shared machine the honest cost of a row.
            "sim_cpu_s": time.process_time() - c0, **extra}


def _plan(row: pd.Series, disagg: str | None) -> RowPlan | None:
    """The row's plan for its layout columns (the same for every cost model), None if not expressible."""
    try:
        return row_plan(row, "roofline", disagg=disagg)
    except TwinserveError:
        return None


def _recipe_source(row: pd.Series) -> str:
    """The recipe column: the disaggregated launch's srt-slurm recipe where known, else row_recipe's source."""
    launch = disagg_recipe(row)
    return launch.source if launch is not None else row_recipe(row).source


def _kv_note(row: pd.Series) -> str:
    """The recipe column's word on a launch whose K/V dtype is not the precision's (validate_recipes.kv_cache_dtype)."""
    note = kv_cache_note(row)
    return f"; {note}" if note else ""


def row_record(row: pd.Series, *, disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> dict[str, Any]:
    """The CSV's descriptive columns and measured figures of one row (no prediction yet).

    `layout` is '' where the row gives its whole layout, else how the missing part was assumed or
    inferred; `gpus` and `parallelism` count the assumed workers.
    """
    plan = _plan(row, disagg)
    counts = plan.counts if plan is not None else None
    gpus = num_gpus(row, counts, disagg)
    try:
        prec = precision_fields(row)["quantization"]
    except NotExpressible:
        prec = str(row.get("precision"))
    conc = row.get("concurrency")
    rec = {"row_id": row["id"], "split": row["split"], "harness": harness(row), "backend": row["backend"],
           "backend_version": row["backend_version"], "system": row["system"], "model": row["model"],
           "precision": row.get("precision") if isinstance(row.get("precision"), str) else f"{prec} (not given)",
           "mode": row["mode"], "isl": int(row["isl"]), "osl": int(row["osl"]),
           "concurrency": int(conc) if conc == conc and conc is not None else None,
           "parallelism": parallelism(row, counts, disagg), "layout": plan.layout if plan is not None else "",
           "gpus": gpus, "recipe": _recipe_source(row) + _kv_note(row),
           "meas_ttft_ms": float(row["silicon_ttft_ms"]), "meas_tpot_ms": float(row["silicon_tpot_ms"])}
    rec["meas_tput_per_gpu"] = throughput_per_gpu(rec["concurrency"] or float("nan"), rec["isl"], rec["osl"],
                                                  rec["meas_ttft_ms"], rec["meas_tpot_ms"], gpus)
    return rec


def expressible(row: pd.Series, cost_model: str, *, disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> str:
    """'' when the row maps to a study, else the reason it does not."""
    try:
        row_study(row, cost_model, disagg=disagg)
    except NotExpressible as e:
        return str(e)
    except TwinserveError as e:  # a catalog or config refusal is a reason too
        return f"{type(e).__name__}: {e}"
    return ""


def finish_record(rec: dict[str, Any], pred: dict[str, Any] | None, error: str = "") -> dict[str, Any]:
    """rec with the prediction, the derived throughput and the signed errors (pred / meas - 1)."""
    rec = dict(rec)
    if pred is not None:
        rec.update(pred)
        rec["pred_tput_per_gpu"] = throughput_per_gpu(rec["concurrency"], rec["isl"], rec["osl"],
                                                      rec["pred_ttft_ms"], rec["pred_tpot_ms"], rec["gpus"])
    else:
        rec.update({"pred_ttft_ms": np.nan, "pred_tpot_ms": np.nan, "pred_tput_per_gpu": np.nan})
    rec["sim_error"] = error
    for m, (p, q) in {"ttft": ("pred_ttft_ms", "meas_ttft_ms"), "ttft_all": ("pred_ttft_all_ms", "meas_ttft_ms"),
                      "tpot": ("pred_tpot_ms", "meas_tpot_ms"),
                      "tput": ("pred_tput_per_gpu", "meas_tput_per_gpu")}.items():
        pv, mv = rec.get(p), rec.get(q)
        ok = pv is not None and mv is not None and math.isfinite(pv) and math.isfinite(mv) and mv > 0
        rec[f"err_{m}"] = pv / mv - 1.0 if ok else np.nan
    return rec


def _stats(errors: pd.Series) -> dict[str, Any]:
    a = errors.dropna().abs().to_numpy()
    if len(a) == 0:
        return {"n": 0}
    return {"n": int(len(a)), "median_abs": float(np.median(a)),
            "within_10": float(np.mean(a <= 0.10)), "within_20": float(np.mean(a <= 0.20)),
            "p90_abs": float(np.quantile(a, 0.90)), "p99_abs": float(np.quantile(a, 0.99)),
            "median_signed": float(errors.dropna().median())}


def _group(g: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": int(len(g)), "expressible": int(g["expressible"].sum()),
                           "simulated": int(g["err_tpot"].notna().sum())}
    out["expressible_share"] = out["expressible"] / out["rows"] if out["rows"] else 0.0
    # As given vs with an assumed or inferred layout (the `layout` column), so the headline stays honest.
    assumed = g["layout"].fillna("").astype(str) != "" if "layout" in g else pd.Series(False, index=g.index)
    out["expressible_as_given"] = int((g["expressible"] & ~assumed).sum())
    out["expressible_assumed"] = int((g["expressible"] & assumed).sum())
    for m in METRICS:
        out[m] = _stats(g[f"err_{m}"] if f"err_{m}" in g else pd.Series(dtype=float))
    return out


def summarize_validation(df: pd.DataFrame) -> dict[str, Any]:
    """Per split (dev, heldout, all), overall and per backend x system x model: counts and error stats."""
    out: dict[str, Any] = {}
    for split, part in (("dev", df[df["split"] == "dev"]), ("heldout", df[df["split"] == "heldout"]),
                        ("all", df)):
        groups = {f"{b} | {s} | {m}": _group(g)
                  for (b, s, m), g in part.groupby(["backend", "system", "model"], sort=True)}
        out[split] = {"overall": _group(part), "groups": groups}
        if "layout" in part:  # the error figures of each kind apart
            given = part["layout"].fillna("").astype(str) == ""
            out[split]["as_given"] = _group(part[given])
            out[split]["assumed_layout"] = _group(part[~given])
    return out


def summary_table(summary: dict[str, Any]) -> str:
    """The overall figures per split as a Markdown table (TPOT, TTFT, throughput)."""
    lines = ["| split | rows | expressible | simulated | TPOT med abs err | TPOT <=10% | TPOT <=20% | TPOT p90 "
             "| TTFT med abs err | TTFT <=20% | TTFT (cold wave in) med abs err | tput med abs err | tput <=20% |",
             "|" + "---|" * 13]
    for split in ("dev", "heldout", "all"):
        o = summary[split]["overall"]
        t, f, p, fa = o["tpot"], o["ttft"], o["tput"], o["ttft_all"]

        def pct(d: dict[str, Any], k: str) -> str:
            return f"{d[k]:.0%}" if d.get("n") else "-"
        lines.append(f"| {split} | {o['rows']} | {o['expressible']} ({o['expressible_share']:.0%}) | "
                     f"{o['simulated']} | {pct(t, 'median_abs')} | {pct(t, 'within_10')} | {pct(t, 'within_20')} | "
                     f"{pct(t, 'p90_abs')} | {pct(f, 'median_abs')} | {pct(f, 'within_20')} | {pct(fa, 'median_abs')} | "
                     f"{pct(p, 'median_abs')} | {pct(p, 'within_20')} |")
    return "\n".join(lines)
