"""Are the H200 calibration's eager steps launch-bound? Step time against tokens and sequences.

    python experiments/h200_launch_floor.py [STEPS.csv]

Reads a calibration step log (default: the shipped H200 one) and prints, for the eager steps
(any with prefill tokens: decode batches up to the graph bound replay from CUDA graphs), the
median step time by tokens and by sequences, their correlation with step time, and the
profile's intercept: a flat time across shapes is a host-side launch floor, which a term of
kernel launches per step x launch cost would price only where the launches per step change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from twinserve.backends.sim.fitted import PROFILES_DIR, FittedCostModel

NAME = "smollm2-135m-h200-bf16"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else PROFILES_DIR / f"{NAME}.steps.csv"
    df = pd.read_csv(path)
    eager = df[df.num_prefill_tokens > 0].assign(tokens=lambda d: d.num_prefill_tokens + d.num_decode_seqs,
                                                 seqs=lambda d: d.num_prefill_seqs + d.num_decode_seqs)
    print(f"{path.name}: {len(eager)} eager steps of {len(df)}")
    for col, bins in (("tokens", [0, 64, 256, 1024, 4096]), ("seqs", [0, 1, 4, 16, 64])):
        by = eager.groupby(pd.cut(eager[col], bins), observed=True).step_time_s.agg(["count", "median"])
        print(f"median step time by {col}: " + ", ".join(f"{i}: {r['median'] * 1e3:.1f} ms ({int(r['count'])})"
                                                       for i, r in by.iterrows()))
        print(f"  correlation of step time with {col}: {np.corrcoef(eager[col], eager.step_time_s)[0, 1]:+.3f}")
    if path.parent == PROFILES_DIR:
        prof = FittedCostModel.load(f"builtin:{NAME}")
        print(f"profile intercept (eager regime): {prof.intercept_s * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
