"""Do the speed samples (backends/twin/speedtrace.py) track the engine's own speed?

Runs the real engine (SmolLM2, 1 thread) through the same block of steps over and over
(a 4-sequence batch prefilled and decoded 8 times, then one 96-token prefill: about 2 s on
this project's VM), with one sample of each kind after each block: the weights sampler (a
one-row pass through the model's own weights and LM head, calibrate's default) and the matvec
sampler (a product over a fixed 64 MiB matrix, the baseline). Each block's speed is its steps'
seconds against the median block's; each sample's is its seconds against its kind's median.
It then prints, for windows of 20 s to 240 s (the span of a fidelity run's requests up to a
whole run), how far these estimates of the blocks' mean speed in a window miss it (rms of log
ratios), for the whole block and for its decode steps and its prefill steps apart:

- each kind of sample's median within the window (what `twinserve fidelity --speed-from
  samples` prices the steps at), and their mean (how it priced them before Dec 1, 18:00);
- the blocks just before and just after the window (what a probe before and after a run sees;
  favoured here: they are the same steps as the window's);
- no estimate (the median speed).

Then, as fidelity prices a step, each block against the samples within half a window of it:
the rms of log(estimate / block) with their mean taken out, and that mean (the bias against
the median speed both are measured from).

Run it pinned to a core with nothing else on the machine, e.g.
`taskset -c 1 python experiments/speed_tracking.py --seconds 900`.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

KINDS = ("weights", "matvec")


def report(blocks: list[dict]) -> None:
    """Print the tracking table of these blocks."""
    t = np.array([b["t"] for b in blocks])
    truth = {}
    for part, key in (("all", ("decode_s", "prefill_s")), ("decode", ("decode_s",)), ("prefill", ("prefill_s",))):
        work = np.array([sum(b[k] for k in key) for b in blocks])
        truth[part] = work / np.median(work)
    smp = {k: np.array([b[k] for b in blocks]) for k in KINDS}
    est = {k: v / np.median(v) for k, v in smp.items()}
    ws = truth["all"]
    print(f"{len(blocks)} blocks of {np.median([b['decode_s'] + b['prefill_s'] for b in blocks]):.2f} s over "
          f"{t[-1]:.0f} s; block speed spread (sd of log) {np.std(np.log(ws)):.3f}")
    for k in KINDS:
        print(f"  {k} sampler: median {np.median(smp[k]) * 1e3:.2f} ms; block-to-sample correlation (log) "
              f"{np.corrcoef(np.log(ws), np.log(est[k]))[0, 1]:.2f}")
    step = float(np.median(np.diff(t)))
    print("| window | steps | windows | weights samples: median / mean | matvec samples: median / mean "
          "| blocks before and after | none |")
    print("|---|---|---|---|---|---|---|")
    stats = {"median": np.median, "mean": np.mean}
    for span in (20, 60, 120, 240):
        n = max(int(span / step), 1)
        for part, tv in truth.items():
            errs: dict[str, list[float]] = {f"{k} {f}": [] for k in KINDS for f in stats}
            errs.update(ends=[], none=[])
            for s in range(1, len(blocks) - n - 1, n):
                mean = float(np.mean(tv[s:s + n]))
                for k in KINDS:
                    for f, fn in stats.items():
                        errs[f"{k} {f}"].append(np.log(fn(est[k][s:s + n]) / mean))
                errs["ends"].append(np.log((tv[s - 1] + tv[s + n]) / 2 / mean))
                errs["none"].append(np.log(1 / mean))
            if not errs["none"]:
                continue
            rms = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in errs.items()}
            print(f"| {span} s | {part} | {len(errs['none'])} | {rms['weights median']:.1%} / "
                  f"{rms['weights mean']:.1%} | {rms['matvec median']:.1%} / {rms['matvec mean']:.1%} | "
                  f"{rms['ends']:.1%} | {rms['none']:.1%} |")
    print("\neach block against the samples within half a window of it: rms (bias)")
    print("| window | weights: median | weights: mean | matvec: median | matvec: mean |")
    print("|---|---|---|---|---|")
    for span in (10, 20, 40, 60):
        cells = []
        for k in KINDS:
            for fn in stats.values():
                e = np.array([np.log(fn(est[k][np.abs(t - ti) <= span / 2]) / ws[i]) for i, ti in enumerate(t)])
                cells.append(f"{np.std(e):.1%} ({np.mean(e):+.1%})")
        print(f"| {span} s | " + " | ".join(cells) + " |")
    print("\nminute by minute (x median): blocks / weights samples / matvec samples")
    for m in range(int(t[-1] // 60) + 1):
        sel = (t >= 60 * m) & (t < 60 * (m + 1))
        if sel.any():
            w, mv = est["weights"][sel].mean(), est["matvec"][sel].mean()
            print(f"  {m:3d}: {ws[sel].mean():.3f} / {w:.3f} / {mv:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=900.0)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", default=None, help="also write every block and sample as JSON here")
    p.add_argument("--from-json", default=None, help="report the blocks of an earlier --out instead of running")
    a = p.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            report(json.load(f))
        return 0
    import torch

    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine
    from twinserve.backends.real.step_log import StepLog
    from twinserve.twin.calibrate import Calibrator
    from twinserve.twin.speedtrace import sampler_for

    torch.set_num_threads(1)
    engine = LLMEngine(EngineArgs(model=a.model))
    cal = Calibrator(engine, seed=7)
    cal.warm_up()
    samplers = {k: sampler_for(engine, k) for k in KINDS}
    blocks = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < a.seconds:
            t = time.monotonic() - t0
            log = StepLog(keep=True)
            engine.set_step_log(log)
            cal.decode(4, 64, 8)
            cal.prefill_single(96, 0, [])
            engine.set_step_log(StepLog())
            b = {"t": t, "decode_s": sum(r.step_time_s for r in log.records if not r.num_prefill_tokens),
                 "prefill_s": sum(r.step_time_s for r in log.records if r.num_prefill_tokens)}
            b.update({k: s.sample() for k, s in samplers.items()})
            blocks.append(b)
    finally:
        engine.shutdown()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(blocks, f)
    report(blocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
