"""Disaggregated MTP development rows with the decode workers' verify rows priced as their cost model prices them
(sim/disagg.py _Discounted forwards prices_verify: under aic, k + 1 decode rows on the generation graph) against
main before it (every verify row a (k + 1)-token chunk on aic's context graph), in one process; prints each
measurement's TPOT / TTFT (measured, before, after), then the error summaries per system and precision
(docs/validate-accuracy.md, mtpshared). Only rows whose study drafts (MTP simulated). Development rows only.

    python experiments/disagg_verify_rows.py [--backend trtllm] [--system gb200] [--precision fp4] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows


def _drafting(df: pd.DataFrame) -> pd.DataFrame:
    """The disaggregated rows of `df` whose study speculates (an InferenceX entry that ran MTP)."""
    from twinserve.core.errors import TwinserveError
    from twinserve.sim.validate_rows import row_study
    keep = []
    for _, row in df.iterrows():
        try:
            cfg = row_study(row, "aic")
        except TwinserveError:
            keep.append(False)
            continue
        keep.append(cfg.cluster.num_prefill_replicas > 0 and cfg.speculative.enabled)
    return df[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="trtllm", help="engine of the rows")
    ap.add_argument("--system", default="gb200", help="aic system ('' for every one)")
    ap.add_argument("--precision", default="", help="fp4 or fp8 ('' for both)")
    ap.add_argument("--max-clients", type=int, default=1 << 30, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    rows = _drafting(dev_rows(args.backend, "DeepSeek-R1", hi=args.max_clients, system=args.system,
                              precision=args.precision, mode="disagg"))
    # Before: the wrapper hides the inner model's verify pricing (main before mtpshared).
    hidden = mock.patch("twinserve.sim.disagg._Discounted.prices_verify", False)
    d = ab_rows(rows, hidden, out="")
    if len(d):
        d = d.merge(rows[["id", "system", "precision"]], on="id")
        if args.out:
            d.to_csv(args.out, index=False)
        for key, g in d.groupby(["system", "precision"]):
            print(f"{' '.join(key)}, {len(g)} measurements: {ab_summary(g)}")


if __name__ == "__main__":
    main()
