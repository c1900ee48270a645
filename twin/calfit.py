"""`twinserve calibrate`, the fitting phase: a calibration's step log to a profile.

The steps are corrected for the machine's drift (each scaled to the median probe's speed,
the probe at its time interpolated between the probes around it), the steps after idle gaps
are set apart and priced per gap by an extra time (`fit_wake`), and the rest are fitted by
backends/sim/fit.py with the engine's code-path breakpoints. `refit` fits a profile again from
the step log it was made from; `merge` fits several calibrations of one engine as one.
"""

from __future__ import annotations

import datetime as _dt
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.fit import fit_step_profile, select_regimes
from twinserve.backends.sim.fitted import (FEATURE_COLUMNS, FittedCostModel, ProfileError, recorded_small_batch_rows,
                                           resolve_profile)
from twinserve.core.errors import InvalidConfigError

from twinserve.backends.real.step_log import TIME_COLUMNS, StepLog
from twinserve.twin.calibrate import (WAKE_STEPS, CalibrationDesign, Calibrator, _git_commit, catalog_name,
                                      cpu_features, device_name)
from twinserve.twin.hostload import HostLoad


def split_wake(rows: list[dict[str, Any]], marks: Sequence[Sequence[float]]) -> tuple[
        list[dict[str, Any]], list[tuple[float, list[dict[str, Any]]]]]:
    """(rows to fit the step model on, [(idle gap, the WAKE_STEPS rows after it)]).

    marks: (index of the first step after the idle gap in rows, the gap in seconds), as the
    calibrator records them (provenance "idle_steps"; a speed probe between two points also
    leaves a gap in the log, but the engine was busy, so gaps are not read off the times).
    Those steps are left out of the step model's fit and priced by factors instead.
    """
    skip: set[int] = set()
    episodes = []
    for index, gap in marks:
        i = int(index)
        if 0 <= i and i + WAKE_STEPS <= len(rows):
            episodes.append((float(gap), rows[i:i + WAKE_STEPS]))
            skip.update(range(i, i + WAKE_STEPS))
    return [r for i, r in enumerate(rows) if i not in skip], episodes


def fit_wake(profile: FittedCostModel, episodes: list[tuple[float, list[dict[str, Any]]]]) -> None:
    """Set the profile's wake cost: per design gap and step after it, the median of measured less
    predicted time (the step model fitted without those steps), never below zero. An extra
    time, not a factor: in service the same gap adds about as much to a long step as to a
    short one (fitted.FittedCostModel.wake_extra_s)."""
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
    """Rows with their times at the machine's median probe speed, and that probe (seconds).

    A step at time t is scaled by ref / probe(t), probe(t) interpolated linearly between the
    probes around it (held flat before the first and after the last). With fewer than two
    probes the rows come back unchanged.
    """
    if not probes:
        return rows, float("nan")
    times = [t for t, _ in probes]
    secs = [s for _, s in probes]
    ref = float(np.median(secs))
    if len(probes) < 2:
        return rows, ref
    scale = ref / np.interp([float(r["start_s"]) for r in rows], times, secs)
    return [_scaled(r, float(k), time_columns) for r, k in zip(rows, scale)], ref


def regime_bounds(engine: Any) -> list[int]:
    """Token counts where the engine switches code path (CPU fp32: small-batch weights, padding)."""
    device = engine.args.resolve_device()
    return _code_path_bounds(device.type, str(engine.args.resolve_dtype(device)),
                             engine.args.resolve_small_batch_rows(device), _pad_rows())


def _code_path_bounds(device_type: str, dtype: str, small_rows: int, pad_rows: int = 0) -> list[int]:
    """small_rows: products of at most this many rows take the transposed weight copies (0: none)."""
    from twinserve.backends.real.models.llama import PAD_MIN_ROWS

    if device_type != "cpu" or dtype.replace("torch.", "") != "float32":
        return []
    bounds = [small_rows] if small_rows else []
    # Products of PAD_MIN_ROWS..pad_rows-1 rows that F.linear runs cost what pad_rows rows cost.
    lo = max(PAD_MIN_ROWS, small_rows + 1)
    if pad_rows and lo < pad_rows:
        bounds += [lo - 1, pad_rows - 1]
    return sorted(set(bounds))


def _pad_rows() -> int:
    from twinserve.backends.real.models.llama import PAD_ROWS

    return PAD_ROWS


def graph_max_decodes(device_type: str, enforce_eager: bool, attention_backend: str | None,
                      max_num_seqs: int) -> int | None:
    """The largest decode batch an engine so configured replays from a CUDA graph (the worker's
    rule: CUDA, not eager, a backend with supports_cuda_graphs), or None when it runs eagerly."""
    from twinserve.backends.real.attention import backend_name
    from twinserve.backends.real.cuda_graphs import graph_buckets

    # Only the Triton backend's launches are graph-safe (TritonPagedAttention.supports_cuda_graphs).
    if device_type != "cuda" or enforce_eager or backend_name(attention_backend, device_type) != "triton":
        return None
    return graph_buckets(max_num_seqs)[-1]


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


@dataclass(slots=True)
class Prepared:
    """One calibration's step log as this version fits it: drift-corrected (`rows` at the
    machine's `ref` speed, the median probe's seconds; None uncorrected), the steps after idle
    gaps apart (`wake`), and the fit that suits its engine."""

    profile: FittedCostModel
    prov: dict[str, Any]
    note: dict[str, Any]
    rows: list[dict[str, Any]]
    wake: list[tuple[float, list[dict[str, Any]]]]
    fit: Callable[..., FittedCostModel]
    ref: float | None


def prepare(profile_path: str | Path, steps_path: str | Path | None = None) -> Prepared:
    """A calibrated profile's step log (the `.steps.csv` beside it, or steps_path), corrected
    for the machine's drift as this version corrects it (refit's first half)."""
    from twinserve.backends.real.step_log import read_step_log

    old = FittedCostModel.load(profile_path)
    prov = dict(old.meta.get("provenance") or {})
    if prov.get("merged_from"):
        raise ProfileError(f"{profile_path} was merged from {len(prov['merged_from'])} calibrations and has no "
                           "step log of its own: merge their profiles again (twinserve calibrate --merge)")
    steps = Path(steps_path) if steps_path else resolve_profile(profile_path).with_suffix(".steps.csv")
    rows = read_step_log(steps)
    probes = prov.get("speed_probes") or []
    t0 = prov.get("speed_probe_t0")
    note: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "git_commit": _git_commit(), "step_log": steps.name,
                            "previous_fit": {k: (old.meta.get("fit") or {}).get(k) for k in ("r2", "mape")}}
    if prov.get("drift_source") == "samples":
        raise ProfileError(f"{profile_path} was drift-corrected by in-run speed samples, a method this version "
                           "no longer has (docs/twin-log.md): calibrate again (`twinserve calibrate --out P.json`)")
    eng = prov.get("engine") or {}
    device_type = str(prov.get("device", "cpu")).split(":")[0]
    graph_max = eng.get("cuda_graph_max_batch")
    if "cuda_graph_max_batch" not in eng:  # profiles made before it was recorded
        graph_max = graph_max_decodes(device_type, bool(eng.get("enforce_eager")), eng.get("attention_backend"),
                                      int(eng.get("max_num_seqs", 256)))
        if graph_max is not None:
            note["cuda_graph_max_batch_inferred"] = graph_max
    batches = (prov.get("design") or {}).get("decode_batches") or []
    # Profiles made before row padding existed record no pad_rows: their engine padded nothing.
    base = _code_path_bounds(device_type, str(prov.get("dtype", "")), recorded_small_batch_rows(eng, copies=False),
                             int(eng.get("pad_rows") or 0))
    fit = fitter(base, [b for b in batches if 4 < b < max(batches)], graph_max)

    idle = prov.get("idle_steps") or []
    ref: float | None = None
    if prov.get("drift_corrected") and len(probes) >= 2:
        if t0 is None:  # profiles made before t0 was recorded: the first probe ran just before step 1
            t0 = min(float(r["start_s"]) for r in rows)
            note["speed_probe_t0_estimated"] = True
        rows, ref = correct_drift(rows, [(t0 + float(rel), float(sec)) for rel, sec in probes])
    # Logs made before the design had idle points have none: their profiles price no wake.
    rows, wake = split_wake(rows, idle)
    return Prepared(old, prov, note, rows, wake, fit, ref)


def refit(profile_path: str | Path, steps_path: str | Path | None = None) -> FittedCostModel:
    """A calibrated profile fitted again by this version's fit, from the step log it was made from.

    The log is the `.steps.csv` that calibrate wrote beside the profile (or steps_path). The
    provenance is kept; the drift correction is redone from its probes; the code-path regimes come from the recorded engine
    settings (a CUDA engine that did not run eagerly replayed decode batches of up to its
    largest bucket from graphs). So a change to the cost model can be judged on a device's
    measurements after the device is gone.
    """
    p = prepare(profile_path, steps_path)
    prov, note = p.prov, p.note
    if prov.get("refit"):  # an earlier refit's note, kept (its previous_fit is the first fit's)
        note["earlier_refit"] = prov["refit"]
    meta = {k: v for k, v in p.profile.meta.items() if k not in ("fit", "provenance", "format")}
    profile = p.fit(p.rows, **meta, provenance={**prov, "refit": note})
    profile.meta["fit"]["comm_share"] = _comm_share(p.rows)
    fit_wake(profile, p.wake)
    return profile


# What calibrations must share to be fitted as one: the model and the machine's kind, how the
# engine ran (threads, dtype, limits, code paths) and how its speed was measured.
MERGE_KEYS = ("engine_model", "device", "dtype", "quantization", "tensor_parallel_size", "engine_core_mode",
              "threads", "engine", "drift_source")


def merge(profile_paths: Sequence[str | Path]) -> FittedCostModel:
    """One profile fitted on the step logs of several calibrations of one engine.

    A calibration prices the machine at its own reference speed (the median probe), and two
    calibrations hours apart price the same steps apart even so (docs/twin-log.md, "Several
    calibrations, fitted as one").
    Each log is corrected as refit corrects it, its times scaled to the median of the
    calibrations' references, and all are fitted together, so the profile stands on several
    of the machine's moods rather than one.
    """
    paths = list(profile_paths)
    if len(paths) < 2:
        raise InvalidConfigError("merge", paths, "two or more calibrated profiles")
    parts = [prepare(p) for p in paths]
    first = parts[0]
    for path, part in zip(paths[1:], parts[1:]):
        for key in MERGE_KEYS:
            a, b = first.prov.get(key), part.prov.get(key)
            if a != b:
                raise ProfileError(f"{path}: {key} is {b!r} where {paths[0]} has {a!r}; merge calibrations "
                                   "of one engine, run the same way")
        if first.profile.model != part.profile.model:
            raise ProfileError(f"{path} was calibrated for model {part.profile.model!r}, {paths[0]} for "
                               f"{first.profile.model!r}")
        if first.profile.meta.get("hardware") != part.profile.meta.get("hardware"):
            raise ProfileError(f"{path} was calibrated on {part.profile.meta.get('hardware')!r}, {paths[0]} on "
                               f"{first.profile.meta.get('hardware')!r}; merge calibrations of one machine")
    for path, part in zip(paths, parts):
        if not part.ref:
            raise ProfileError(f"{path}: its steps were not corrected for the machine's speed (fewer than "
                               "two probes), so there is no reference to merge it by")
    common = float(np.median([p.ref for p in parts]))
    rows: list[dict[str, Any]] = []
    wake: list[tuple[float, list[dict[str, Any]]]] = []
    sources = []
    for path, part in zip(paths, parts):
        k = common / float(part.ref)  # every part has a reference: checked above
        rows += [_scaled(r, k) for r in part.rows]
        wake += [(gap, [_scaled(r, k) for r in steps]) for gap, steps in part.wake]
        sources.append({"profile": str(path), "date": part.prov.get("date"), "wall_s": part.prov.get("wall_s"),
                        "num_steps": len(part.rows), "reference_s": part.ref, "scaled_by": k})
    # Per calibration, not of the whole: the probes and idle steps stay in its own file.
    prov = {k: v for k, v in first.prov.items()
            if k not in ("speed_probes", "speed_probe_t0", "speed_probe_drift", "idle_steps", "refit", "note", "host_load",
                         "git_commit", "date", "wall_s")}
    prov.update(made_by="twinserve calibrate --merge", merged_from=sources, git_commit=_git_commit(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                wall_s=round(sum(float(p.prov.get("wall_s") or 0.0) for p in parts), 1))
    prov["speed_probe_s"] = common
    probe_parts = [(p.prov["speed_probe_parts"], s["scaled_by"]) for p, s in zip(parts, sources)
                   if p.prov.get("speed_probe_parts")]
    if probe_parts:
        prov["speed_probe_parts"] = {f: float(np.median([pp[f] * k for pp, k in probe_parts]))
                                     for f in ("decode_s", "prefill_s")}
    meta = {k: v for k, v in first.profile.meta.items() if k not in ("fit", "provenance", "format")}
    # One engine, so one code path: the first calibration's fit (its design's breakpoint candidates).
    profile = first.fit(rows, **meta, provenance=prov)
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    fit_wake(profile, wake)
    return profile


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
