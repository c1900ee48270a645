"""`twinserve calibrate`, the fitting phase: a calibration's step log to a profile.

The steps are corrected for the machine's drift (each scaled to the median probe's speed,
the probe at its time interpolated between the probes around it), the steps after idle gaps
are set apart and priced per gap by an extra time (`fit_wake`), and the rest are fitted by
backends/sim/fit.py with the engine's code-path breakpoints (experiments/calibrations.py refits
a profile from its step log, or fits several calibrations of one engine as one).
"""

from __future__ import annotations

import datetime as _dt
import platform
import time
from dataclasses import asdict
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.fit import fit_step_profile, select_regimes
from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel
from twinserve.core.errors import InvalidConfigError

from twinserve.backends.real.step_log import TIME_COLUMNS, StepLog
from twinserve.backends.real.hardware import _pad_rows, cpu_features, device_name, graph_max_decodes, regime_bounds
from twinserve.backends.sim.catalog import catalog_name
from twinserve.twin.calibrate import WAKE_STEPS, CalibrationDesign, Calibrator, _git_commit
from twinserve.backends.real.hostload import HostLoad


def split_wake(rows: list[dict[str, Any]], marks: Sequence[Sequence[float]]) -> tuple[
        list[dict[str, Any]], list[tuple[float, list[dict[str, Any]]]]]:
    """(rows to fit the step model on, [(idle gap, the WAKE_STEPS rows after it)]); marks are
    (index of the first step after the gap, gap seconds) as the calibrator records them."""
    skip: set[int] = set()
    episodes = []
    for index, gap in marks:
        i = int(index)
        if 0 <= i and i + WAKE_STEPS <= len(rows):
            episodes.append((float(gap), rows[i:i + WAKE_STEPS]))
            skip.update(range(i, i + WAKE_STEPS))
    return [r for i, r in enumerate(rows) if i not in skip], episodes


def fit_wake(profile: FittedCostModel, episodes: list[tuple[float, list[dict[str, Any]]]]) -> None:
    """Set the profile's wake cost: per gap and step after it, the median extra time over the
    step model's price (never below zero; an extra time, not a factor: fitted.wake_extra_s)."""
    by_gap: dict[float, list[list[float]]] = {}
    for gap, steps in episodes:
        extra = [float(r["step_time_s"]) + float(r.get("gap_s") or 0.0)
                 - profile.step_time(*(float(r[c]) for c in FEATURE_COLUMNS)) for r in steps]
        by_gap.setdefault(gap, []).append(extra)
    gaps = sorted(by_gap)
    profile.wake_idle_s = tuple(gaps)
    profile.wake_factors = ()
    profile.wake_extra_s = tuple(tuple(max(0.0, float(np.median(col))) for col in zip(*by_gap[g]))
                                 for g in gaps)


def _scaled(row: dict[str, Any], k: float, time_columns: tuple[str, ...] = TIME_COLUMNS) -> dict[str, Any]:
    """A copy of a step-log row with its times multiplied by k."""
    out = dict(row)
    for c in time_columns:
        if out.get(c) is not None:
            out[c] = float(out[c]) * k
    return out


def correct_drift(rows: list[dict[str, Any]], probes: list[tuple[float, float]],
                  time_columns: tuple[str, ...] = TIME_COLUMNS) -> tuple[list[dict[str, Any]], float]:
    """Rows with their times at the machine's median probe speed, and that probe (seconds): a step
    at t scaled by ref / probe(t), interpolated between probes (unchanged with fewer than two)."""
    if not probes:
        return rows, float("nan")
    times = [t for t, _ in probes]
    secs = [s for _, s in probes]
    ref = float(np.median(secs))
    if len(probes) < 2:
        return rows, ref
    scale = ref / np.interp([float(r["start_s"]) for r in rows], times, secs)
    return [_scaled(r, float(k), time_columns) for r, k in zip(rows, scale)], ref


def _comm_share(rows: list[dict[str, Any]]) -> float:
    """Tensor parallelism: the share of step time spent in collectives (rank 0's host time)."""
    comm = sum(float((r.get("extra") or {}).get("comm_time_s", 0.0)) for r in rows)
    total = sum(float(r["step_time_s"]) for r in rows)
    return comm / total if total > 0 else 0.0


def fitter(base: Sequence[int], candidates: Sequence[int],
           graph_max: int | None) -> Callable[..., FittedCostModel]:
    """Step-log rows (and profile meta) to a profile, as calibrate fits them: token-count
    breakpoints chosen among the candidates on top of the code path's own (base), then the fit."""
    def fit(rows: list[dict[str, Any]], **meta: Any) -> FittedCostModel:
        bounds = select_regimes(rows, base, candidates, graph_max_decodes=graph_max)
        return fit_step_profile(rows, regime_max_tokens=bounds, graph_max_decodes=graph_max, **meta)
    return fit


def calibrate(engine: Any, design: CalibrationDesign | None = None, threads: int | None = None,
              progress: bool = True, seed: int = 0) -> tuple[FittedCostModel, StepLog]:
    """Run the design on engine and fit its profile (with diagnostics and provenance)."""
    import torch

    a = engine.args
    sc = engine.scheduler_config
    if not sc.enable_prefix_caching:
        raise InvalidConfigError("enable_prefix_caching", False,
                                 "True for calibration (cached-context chunks come from prefix hits)")
    design = (design or CalibrationDesign()).for_limits(sc.max_num_seqs, sc.max_num_batched_tokens,
                                                        sc.max_model_len)
    # The code that runs the design: read now, since a commit may land while it runs.
    commit = _git_commit()
    wall = time.perf_counter()
    host = HostLoad()
    cal = Calibrator(engine, seed)
    log = cal.run(design, progress)
    wall = time.perf_counter() - wall
    host_load = host.result()
    cfg = engine.model_config
    device = engine.args.resolve_device()
    tp = engine.args.tensor_parallel_size
    name = catalog_name(cfg, engine.model_name)
    # Breakpoints: the engine's own code-path switch, plus batch sizes where the measured
    # cost per row changes slope (candidates from the design's decode batches).
    graph_max = graph_max_decodes(device.type, a.enforce_eager, a.attention_backend, sc.max_num_seqs)
    fit = fitter(regime_bounds(engine), [b for b in design.decode_batches if 4 < b < max(design.decode_batches)],
                 graph_max)
    # The drift correction: by the probes between design points.
    rows, probe_ref = correct_drift(log.rows(), cal.probes)
    rows, wake = split_wake(rows, cal.idle_steps)
    probe_secs = [sec for _, sec in cal.probes]
    profile = fit(
        rows, model=name,
        hardware=device_name(device), tensor_parallel_size=tp,
        provenance={
            "made_by": "twinserve calibrate",
            "engine_model": engine.model_name,
            "device": str(device),
            "dtype": str(engine.args.resolve_dtype(device)).replace("torch.", ""),
            "quantization": engine.args.quantization,
            "tensor_parallel_size": tp,
            # In process or in a process of its own: the two pace steps differently (step_log.py).
            "engine_core_mode": engine.core_mode,
            # The host CPU's kernel features (a CPU profile's prices depend on them).
            "cpu": cpu_features(),
            "threads": threads if threads is not None else torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "git_commit": commit,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(wall, 1),
            # Other processes' share of the CPUs it ran on (hostload.py): a noisy neighbour.
            "host_load": host_load,
            # The machine's speed while calibrating (calibrate.speed_probe): the median probe
            # (which the step times were corrected to when drift_source is "probes"), every
            # probe (seconds into the run), and the spread of the probes (slowest / fastest - 1).
            "speed_probe_s": probe_ref if probe_secs else None,
            "speed_probes": [[round(t - cal.probes[0][0], 6), round(sec, 9)] for t, sec in cal.probes],
            # The first probe on the step log's clock (start_s), so a refit can redo the correction.
            "speed_probe_t0": cal.probes[0][0] if cal.probes else None,
            "speed_probe_drift": max(probe_secs) / min(probe_secs) - 1 if probe_secs else None,
            # The median of each part, which fidelity compares its own probes' parts with.
            "speed_probe_parts": ({"decode_s": float(np.median([p.decode_s for p in cal.probe_parts])),
                                   "prefill_s": float(np.median([p.prefill_s for p in cal.probe_parts]))}
                                  if cal.probe_parts else None),
            "drift_corrected": len(probe_secs) >= 2,
            "drift_source": "probes",
            # Steps that followed an idle gap (index in the step log, seconds): priced by "wake".
            "idle_steps": [list(m) for m in cal.idle_steps],
            "engine": {"block_size": a.block_size, "max_num_seqs": sc.max_num_seqs,
                       "max_num_batched_tokens": sc.max_num_batched_tokens,
                       "small_batch_weights": a.small_batch_weights,
                       "small_batch_rows": a.resolve_small_batch_rows(), "prepack_weights": a.prepack_weights,
                       "attention_backend": a.attention_backend, "enforce_eager": a.enforce_eager,
                       "cuda_graph_max_batch": graph_max, "pad_rows": _pad_rows()},
            "design": asdict(design),
        })
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    fit_wake(profile, wake)
    return profile, log
