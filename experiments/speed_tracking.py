"""Does the 3 ms speed sample (backends/twin/speedtrace.py) track the engine's own speed?

Runs the real engine (SmolLM2, 1 thread) through the same block of steps over and over
(a 4-sequence batch prefilled and decoded 8 times, then one 96-token prefill: about 2 s on
this project's VM), with one speed sample after each block, for --seconds. Each block's speed
is its steps' seconds against the median block's; each sample's is its seconds against the
median sample's. It then prints, for windows of 20 s to 240 s (the span of a fidelity run's
requests up to a whole run), how far three estimates of the blocks' mean speed in a window miss
it (rms of log ratios):

- the samples' mean within the window (what `twinserve fidelity` now prices the steps at);
- the blocks just before and just after the window (what a probe before and after a run sees;
  favoured here: they are the same steps as the window's);
- no estimate (the median speed).

Run it pinned to a core with nothing else on the machine, e.g.
`taskset -c 1 python experiments/speed_tracking.py --seconds 900`.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=900.0)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", default=None, help="also write every block and sample as JSON here")
    a = p.parse_args()
    import torch

    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine
    from twinserve.backends.real.step_log import StepLog
    from twinserve.backends.twin.calibrate import Calibrator
    from twinserve.backends.twin.speedtrace import SpeedSampler

    torch.set_num_threads(1)
    engine = LLMEngine(EngineArgs(model=a.model))
    cal = Calibrator(engine, seed=7)
    cal.warm_up()
    sampler = SpeedSampler()
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
            blocks.append({"t": t, "steps_s": sum(r.step_time_s for r in log.records),
                           "sample_s": sampler.sample()})
    finally:
        engine.shutdown()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(blocks, f)
    t = np.array([b["t"] for b in blocks])
    work = np.array([b["steps_s"] for b in blocks])
    smp = np.array([b["sample_s"] for b in blocks])
    ws, ss = work / np.median(work), smp / np.median(smp)
    print(f"{len(blocks)} blocks of {np.median(work):.2f} s over {t[-1]:.0f} s; median sample "
          f"{np.median(smp) * 1e3:.2f} ms; block speed spread (sd of log) {np.std(np.log(ws)):.3f}; "
          f"block-to-sample correlation (log) {np.corrcoef(np.log(ws), np.log(ss))[0, 1]:.2f}")
    step = float(np.median(np.diff(t)))
    print("| window | windows | samples' mean: rms miss | blocks before and after | none |")
    print("|---|---|---|---|---|")
    for span in (20, 60, 120, 240):
        n = max(int(span / step), 1)
        errs: dict[str, list[float]] = {"samples": [], "ends": [], "none": []}
        for s in range(1, len(blocks) - n - 1, n):
            truth = float(np.mean(ws[s:s + n]))
            errs["samples"].append(np.log(np.mean(ss[s:s + n]) / truth))
            errs["ends"].append(np.log((ws[s - 1] + ws[s + n]) / 2 / truth))
            errs["none"].append(np.log(1 / truth))
        if not errs["none"]:
            continue
        rms = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in errs.items()}
        print(f"| {span} s | {len(errs['none'])} | {rms['samples']:.1%} | {rms['ends']:.1%} | {rms['none']:.1%} |")
    print("\nminute by minute (x median): blocks / samples")
    for m in range(int(t[-1] // 60) + 1):
        sel = (t >= 60 * m) & (t < 60 * (m + 1))
        if sel.any():
            print(f"  {m:3d}: {ws[sel].mean():.3f} / {ss[sel].mean():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
