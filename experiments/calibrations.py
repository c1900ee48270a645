"""Calibrations refitted and merged: the tools that made the shipped CPU profiles.

    python experiments/calibrations.py refit P.json --out Q.json [--steps P.steps.csv]
    python experiments/calibrations.py merge A.json B.json ... --out M.json

`refit` fits a calibrated profile again by this version's fit from the step log beside it
(the drift correction redone from its probes, the code-path regimes from its recorded engine),
so a change to the cost model can be judged on a device's measurements after the device is
gone. `merge` fits the step logs of several calibrations of one engine as one, each scaled to
the median of their reference probes. The sittings the shipped profiles were merged from are in
experiments/data/calibrations (drift-corrected by speed samples, a method the product no longer
has: they are history, docs/twin-log.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from twinserve.backends.sim.fitted import FittedCostModel, ProfileError, recorded_small_batch_rows, resolve_profile
from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.hardware import _code_path_bounds, graph_max_decodes
from twinserve.twin.calfit import _comm_share, _scaled, correct_drift, fit_wake, fitter, split_wake
from twinserve.twin.verifyfit import fit_verify_term, is_verify
from twinserve.twin.calibrate import _git_commit, drift_warning


class Prepared(NamedTuple):
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
    # As calibrate: verify steps priced by their own term, never by the base fit.
    rows = [r for r in p.rows if not is_verify(r)]
    profile = p.fit(rows, **meta, provenance={**prov, "refit": note})
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    fit_wake(profile, p.wake)
    if prov.get("speculative_config"):
        profile.meta["fit"]["verify"] = fit_verify_term(profile, [r for r in p.rows if is_verify(r)])
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("refit", help="fit a calibrated profile again from its step log")
    r.add_argument("profile")
    r.add_argument("--steps", default=None, help="its step log (default: beside it, .steps.csv)")
    r.add_argument("--out", required=True)
    m = sub.add_parser("merge", help="fit several calibrations of one engine as one")
    m.add_argument("profiles", nargs="+")
    m.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        made = refit(a.profile, a.steps) if a.what == "refit" else merge(a.profiles)
    except (ProfileError, InvalidConfigError) as e:
        print(f"calibrations {a.what}: error: {e}", file=sys.stderr)
        return 2
    made.save(a.out)
    fit = made.meta["fit"]
    print(f"wrote {a.out}: {fit['num_steps']} steps, R2 {fit['r2']:.4f}, MAPE {fit['mape']:.1%}")
    if fit.get("verify") is not None:
        from twinserve.twin.cli import _verify_line

        print(_verify_line(fit["verify"], made))
    moved = drift_warning(made.meta.get("provenance") or {})
    if moved:
        print(f"calibrations {a.what}: {moved}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
