"""How well did the speed samples price the steps of recorded fidelity runs?

`speed_tracking.py` asks this of a fixed block of steps run over and over; this script asks it
of the runs a study recorded. For each run (a `twinserve fidelity --out` directory, or a
study's directory of them: `fidelity.json` and `steps_real.csv`), every step is priced by the
profile as fidelity prices it (`band.step_residuals`: the wake after idling included) at the
speed read in one of several ways, and set against what it measured:

- the samples as fidelity reads them (`fidelity.sampled_trace`: the profile's smoothing over
  20 s windows);
- where the run also took the prefill sampler's (`fidelity --prefill-samples`), each step's
  prefill share at its speed and the rest at the weights sampler's;
- no reading at all (the profile's reference speed);
- the samples over 60 s and 120 s windows;
- the samples over windows widened to hold at least 10 samples (a light load samples only
  while busy, so a 20 s window may hold two);
- the samples for the decode share of each step only, its prefill share at the reference speed.

Printed: for each way, the rms over 20 s windows of steps of log(predicted / measured),
weighted by measured time, and the rms and mean over runs of the busy-time error; then, for
the samples as fidelity reads them (and split with the prefill sampler's), the windows grouped by
the share of their predicted time spent on prefill tokens: how closely the steps' speed
followed the samples' (correlation, slope of log measured-over-priced on log sampled
slowness, rms).

    python experiments/speed_in_runs.py --profile builtin:smollm2-135m-cpu-1t STUDY_DIR...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from twinserve.backends.real.step_log import read_step_log
from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.twin.band import step_residuals
from twinserve.twin.fidelity import sampled_trace
from twinserve.twin.speedtrace import SpeedTrace, without_sample_pauses

WINDOW_S = 20.0
SHARE_BINS = (0.0, 0.2, 0.5, 0.8, 1.0)
# The samples with each step's prefill share at the prefill sampler's speed.
SPLIT = "samples, prefill shares by the prefill sampler"
# The readings whose windows are grouped by prefill share.
BY_SHARE = ("samples (fidelity)", SPLIT)


def run_dirs(paths: list[str]) -> list[Path]:
    """The run directories named, or found one level below a named study directory."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "fidelity.json").exists():
            out.append(p)
        else:
            out += sorted(d for d in p.iterdir() if (d / "fidelity.json").exists())
    return out


def at_least(samples: list[list[float]], ref_s: float, k: int, window_s: float = WINDOW_S) -> SpeedTrace:
    """The samples' median over window_s, widened around each sample to its k nearest when the
    window holds fewer."""
    pts = sorted((float(t), float(s)) for t, s in samples)
    t = np.array([a for a, _ in pts])
    s = np.array([b for _, b in pts]) / ref_s
    smooth = []
    for ti in t:
        near = np.abs(t - ti) <= window_s / 2
        if near.sum() < k:
            near = np.zeros(len(t), bool)
            near[np.argsort(np.abs(t - ti), kind="stable")[:k]] = True
        smooth.append(float(np.median(s[near])))
    return SpeedTrace(t.tolist(), smooth, window_s=window_s, num_samples=len(t))


def readings(profile: FittedCostModel, speed: dict[str, Any]) -> dict[str, Callable[[float, float], float]]:
    """Ways to read the run's slowness: (seconds into the run, prefill share) -> slowness; {}
    when the run sampled nothing this profile's reference can judge."""
    # With the prefill sampler's trace beside it where the run took one; `factor` reads the
    # weights samples alone, as fidelity does by default.
    fid = sampled_trace(profile, speed, prefill=True)
    if fid is None:
        return {}
    samples = speed["sampled"]["samples"]
    ref = profile.meta["provenance"]["speed_sample_s"]
    long = {w: SpeedTrace.from_samples(samples, ref, window_s=w, smoothing=fid.smoothing) for w in (60.0, 120.0)}
    k = int(WINDOW_S / fid.every_s)
    wide = at_least(samples, ref, k)
    ways = {"samples (fidelity)": lambda t, p: fid.factor(t)}
    if fid.prefill is not None:
        ways[SPLIT] = lambda t, p: fid.at(t, p, 1.0)
    return {**ways,
            "none": lambda t, p: 1.0,
            "samples, 60 s windows": lambda t, p: long[60.0].factor(t),
            "samples, 120 s windows": lambda t, p: long[120.0].factor(t),
            f"samples, >= {k} a window": lambda t, p: wide.factor(t),
            "samples on decode share only": lambda t, p: 1.0 + (fid.factor(t) - 1.0) * (1.0 - p)}


def measure(profile: FittedCostModel, dirs: list[Path]) -> tuple[dict, dict, dict]:
    """For each way of reading the speed: per 20 s window (log(priced/measured), measured s) and
    per run log(priced/measured busy time); and per window, for the BY_SHARE readings,
    (log(measured / priced at the reference speed), log(sampled slowness), prefill share,
    measured s)."""
    win: dict[str, list[tuple[float, float]]] = {}
    busy: dict[str, list[float]] = {}
    shares: dict[str, list[tuple[float, float, float, float]]] = {}
    for d in dirs:
        speed = json.loads((d / "fidelity.json").read_text())["speed"]
        ways = readings(profile, speed)
        if not ways:
            print(f"{d}: no speed samples the profile's reference can judge; left out")
            continue
        t0 = float(speed["sampled"]["t0"])
        # The samples' own time is out of the steps, as fidelity judges them.
        rows = without_sample_pauses(read_step_log(d / "steps_real.csv"), speed["sampled"]["samples"]
                                     + (speed["sampled"].get("prefill_samples") or []), t0=t0)
        res = step_residuals(profile, rows)
        if not res:
            print(f"{d}: no step computed tokens; left out")
            continue
        t = np.array([float(rows[i]["start_s"]) - t0 for *_, i in res])
        measured = np.array([m for _, m, _, _ in res])
        priced = np.array([p for _, _, p, _ in res])
        tok = np.array([rows[i]["num_prefill_tokens"]
                        / max(rows[i]["num_prefill_tokens"] + rows[i]["num_decode_seqs"], 1) for *_, i in res])
        starts = np.arange(0.0, t.max(), WINDOW_S)
        for name, read in ways.items():
            f = np.array([read(a, b) for a, b in zip(t, tok)])
            busy.setdefault(name, []).append(float(np.log((priced * f).sum() / measured.sum())))
            for a in starts:
                w = (t >= a) & (t < a + WINDOW_S)
                if w.sum() >= 5:
                    win.setdefault(name, []).append((float(np.log((priced[w] * f[w]).sum() / measured[w].sum())),
                                                     float(measured[w].sum())))
                    if name in BY_SHARE:
                        share = float((priced[w] * tok[w]).sum() / priced[w].sum())
                        shares.setdefault(name, []).append((float(np.log(measured[w].sum() / priced[w].sum())),
                                       float(np.log((priced[w] * f[w]).sum() / priced[w].sum())), share,
                                       float(measured[w].sum())))
    return win, busy, shares


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="the profile to price the steps by (file or builtin:NAME)")
    ap.add_argument("runs", nargs="+", help="fidelity output directories, or study directories holding them")
    args = ap.parse_args(argv)
    profile = FittedCostModel.load(args.profile)
    dirs = run_dirs(args.runs)
    win, busy, shares = measure(profile, dirs)
    if not busy:
        raise SystemExit("no run with speed samples to judge")
    print(f"{len(busy['none'])} runs priced by {args.profile}; {len(win.get('none', []))} windows of "
          f"{WINDOW_S:g} s with 5+ steps\n")
    print("| the run's speed read by | per window: rms log(priced/measured) | per run: rms busy-time error | mean |")
    print("|---|---|---|---|")
    for name in win:
        e = np.array(win[name])
        b = np.array(busy[name])
        print(f"| {name} | {np.sqrt(np.average(e[:, 0] ** 2, weights=e[:, 1])):.1%} | "
              f"{np.sqrt(np.mean(b ** 2)):.1%} | {b.mean():+.1%} |")
    for name, rows in shares.items():
        print(f"\nwindows by the share of their priced time on prefill tokens, against {name}:")
        print("| prefill share | windows | correlation | slope | rms |")
        print("|---|---|---|---|---|")
        a = np.array(rows).reshape(-1, 4)
        for lo, hi in zip(SHARE_BINS, SHARE_BINS[1:]):
            g = a[((a[:, 2] > lo) | (lo == 0.0)) & (a[:, 2] <= hi)]
            if len(g) < 4:
                continue
            rms = np.sqrt(np.average((g[:, 0] - g[:, 1]) ** 2, weights=g[:, 3]))
            print(f"| {lo:.1f}-{hi:.1f} | {len(g)} | {np.corrcoef(g[:, 0], g[:, 1])[0, 1]:.2f} | "
                  f"{np.polyfit(g[:, 1], g[:, 0], 1)[0]:.2f} | {rms:.1%} |")


if __name__ == "__main__":
    main()
