"""`twinserve calibrate`, the fitting phase: a calibration's step log to a profile.

Steps are rescaled to the median speed probe to remove drift; steps after idle gaps are priced
separately (`fit_wake`); the rest go to backends/sim/fit.py.
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
from twinserve.backends.real.hardware import (cpu_features, device_name, engine_pad_rows, fp32_product_path,
                                              engine_product_plan, graph_max_decodes, regime_bounds)
from twinserve.backends.sim.catalog import catalog_name
from twinserve.twin.hostcopy import time_host_copies
from twinserve.twin.calibrate import WAKE_STEPS, CalibrationDesign, Calibrator, _git_commit
from twinserve.twin.preflight import served_model_spec
from twinserve.twin.verifyfit import fit_verify_term, is_verify
from twinserve.backends.real.hostload import HostLoad


def split_wake(rows: list[dict[str, Any]], marks: Sequence[Sequence[float]]) -> tuple[
        list[dict[str, Any]], list[tuple[float, list[dict[str, Any]]]]]:
    """Rows to fit on, and (idle gap, the WAKE_STEPS rows after it) per calibrator mark."""
    skip: set[int] = set()
    episodes = []
    for index, gap in marks:
        i = int(index)
        if 0 <= i and i + WAKE_STEPS <= len(rows):
            episodes.append((float(gap), rows[i:i + WAKE_STEPS]))
            skip.update(range(i, i + WAKE_STEPS))
    return [r for i, r in enumerate(rows) if i not in skip], episodes


def fit_wake(profile: FittedCostModel, episodes: list[tuple[float, list[dict[str, Any]]]]) -> None:
    """Set the profile's wake cost: per gap and following step, the median extra time (>= 0)."""
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
    out = dict(row)
    for c in time_columns:
        if out.get(c) is not None:
            out[c] = float(out[c]) * k
    return out


def correct_drift(rows: list[dict[str, Any]], probes: list[tuple[float, float]],
                  time_columns: tuple[str, ...] = TIME_COLUMNS) -> tuple[list[dict[str, Any]], float]:
    """Rows scaled by ref / probe(t) (probes interpolated; ref their median), and ref in seconds."""
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
    """Tensor parallelism: the share of step time in collectives."""
    comm = sum(float((r.get("extra") or {}).get("comm_time_s", 0.0)) for r in rows)
    total = sum(float(r["step_time_s"]) for r in rows)
    return comm / total if total > 0 else 0.0


def fitter(base: Sequence[int], candidates: Sequence[int],
           graph_max: int | None) -> Callable[..., FittedCostModel]:
    """A fit function with breakpoints chosen among candidates on top of the code path's own."""
    def fit(rows: list[dict[str, Any]], **meta: Any) -> FittedCostModel:
        # The regimes are chosen on the fit the profile gets: sliding windows included.
        window = {"attention": meta["attention"]} if "attention" in meta else {}
        bounds = select_regimes(rows, base, candidates, graph_max_decodes=graph_max, **window)
        return fit_step_profile(rows, regime_max_tokens=bounds, graph_max_decodes=graph_max, **meta)
    return fit


def calibrate(engine: Any, design: CalibrationDesign | None = None, threads: int | None = None,
              progress: bool = True, seed: int = 0, max_context: int | None = None) -> tuple[FittedCostModel, StepLog]:
    """Run the design on engine and fit its profile; its contexts cover max_context tokens (default:
    the engine's max_model_len), so no step the engine meets lies past the fitted shapes."""
    import torch

    a = engine.args
    sc = engine.scheduler_config
    if not sc.enable_prefix_caching:
        raise InvalidConfigError("enable_prefix_caching", False,
                                 "True for calibration (cached-context chunks come from prefix hits)")
    design = (design or CalibrationDesign()).covering(max_context or sc.max_model_len, sc.max_model_len)
    design = design.for_limits(sc.max_num_seqs, sc.max_num_batched_tokens, sc.max_model_len)
    # Read now: a commit may land while the design runs.
    commit = _git_commit()
    wall = time.perf_counter()
    host = HostLoad()
    cal = Calibrator(engine, seed)
    log = cal.run(design, progress)
    wall = time.perf_counter() - wall
    host_load = host.result()
    cfg = engine.model_config
    plan = engine_product_plan(engine)
    device = engine.args.resolve_device()
    tp = engine.args.tensor_parallel_size
    spec = served_model_spec(cfg, engine.model_name, engine.args.resolve_dtype(device).itemsize)
    name = catalog_name(spec)
    # Breakpoints: the engine's code-path switch, plus batch sizes where per-row cost changes slope.
    graph_max = graph_max_decodes(device.type, a.enforce_eager, a.attention_backend, sc.max_num_seqs)
    fit = fitter(regime_bounds(engine), [b for b in design.decode_batches if 4 < b < max(design.decode_batches)],
                 graph_max)
    # Probes as the profile stores them (time since the first) and as a refit reads them back
    # (t0 + that), so the refit's correction is the very same floats.
    t0 = cal.probes[0][0] if cal.probes else 0.0
    stored_probes = [[t - t0, sec] for t, sec in cal.probes]
    rows, probe_ref = correct_drift(log.rows(), [(t0 + rel, sec) for rel, sec in stored_probes])
    rows, wake = split_wake(rows, cal.idle_steps)
    # Verify steps get their own term on top of the base fit, which never sees them.
    verify_rows = [r for r in rows if is_verify(r)]
    rows = [r for r in rows if not is_verify(r)]
    speculative = a.speculative_config
    probe_secs = [sec for _, sec in cal.probes]
    profile = fit(
        rows, model=name,
        hardware=device_name(device), tensor_parallel_size=tp,
        # Sliding layers' attention is fitted and priced capped at their window.
        attention={"sliding_window": spec.sliding_window, "num_sliding_layers": spec.num_sliding_layers,
                   "num_layers": spec.num_layers},
        provenance={
            "made_by": "twinserve calibrate",
            "engine_model": engine.model_name,
            "device": str(device),
            "dtype": str(engine.args.resolve_dtype(device)).replace("torch.", ""),
            "quantization": engine.args.quantization,
            "tensor_parallel_size": tp,
            # The two core modes pace steps differently.
            "engine_core_mode": engine.core_mode,
            # A CPU profile's prices depend on its kernel features.
            "cpu": cpu_features(),
            "threads": threads if threads is not None else torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "git_commit": commit,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(wall, 1),
            # Other processes' CPU share: a noisy neighbour.
            "host_load": host_load,
            # Speed probes: the median (the correction's reference), each one, and their spread.
            "speed_probe_s": probe_ref if probe_secs else None,
            # Unrounded (JSON floats round-trip), so a refit redoes the correction exactly.
            "speed_probes": stored_probes,
            # On the step log's clock, so a refit can redo the correction.
            "speed_probe_t0": cal.probes[0][0] if cal.probes else None,
            "speed_probe_drift": max(probe_secs) / min(probe_secs) - 1 if probe_secs else None,
            # Compared by fidelity with its own probes.
            "speed_probe_parts": ({"decode_s": float(np.median([p.decode_s for p in cal.probe_parts])),
                                   "prefill_s": float(np.median([p.prefill_s for p in cal.probe_parts]))}
                                  if cal.probe_parts else None),
            "drift_corrected": len(probe_secs) >= 2,
            "drift_source": "probes",
            # (step-log index, gap seconds) of steps after an idle gap.
            "idle_steps": [list(m) for m in cal.idle_steps],
            "engine": {"block_size": a.block_size, "max_num_seqs": sc.max_num_seqs,
                       "max_num_batched_tokens": sc.max_num_batched_tokens,
                       "small_batch_weights": a.small_batch_weights,
                       "small_batch_rows": plan.small_batch_rows() if plan is not None
                       else a.resolve_small_batch_rows(), "prepack_weights": a.prepack_weights,
                       "attention_backend": a.attention_backend, "enforce_eager": a.enforce_eager,
                       "cuda_graph_max_batch": graph_max, "pad_rows": engine_pad_rows(engine),
                       "fp32_product_path": fp32_product_path(a, plan),
                       # Per row count (1..16, then above) the kernel of CPU products; fidelity compares it.
                       "cpu_product_paths": plan.record() if plan is not None else None},
            "design": asdict(design),
            "speculative_config": ({"method": speculative.method,
                                    "num_speculative_tokens": speculative.num_speculative_tokens}
                                   if speculative is not None else None),
        })
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    # The host KV tier's copies, on this engine's page geometry (twin/hostcopy.py).
    kv_bytes = spec.precision.kv_bytes
    page_elems = a.block_size * spec.kv_bytes_per_token_per_gpu(tp) // (2 * spec.num_layers * kv_bytes)
    profile.meta["host_link"] = time_host_copies(spec.num_layers, page_elems, engine.args.resolve_dtype(device),
                                                 device)
    fit_wake(profile, wake)
    if speculative is not None:
        profile.meta["fit"]["verify"] = fit_verify_term(profile, verify_rows)
    return profile, log
