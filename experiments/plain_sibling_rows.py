"""DeepSeek-R1 disaggregated development rows beside a db-dump-twinned plain run of their configuration, client count
and measured day (sim/validate_twins.py add_plain_siblings): the plain entries of that twin's layout dropped from
their fits (after) against kept (before, main: the entries' MTP not known, run plain), in one process. Also every
H100 DeepSeek-R1 disaggregated development row (--h100), summarised per layout (docs/validate-accuracy.md,
h100dis). Development rows only (issue 49).

    python experiments/plain_sibling_rows.py [--h100] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.sim import validate_inferencex
from twinserve.sim.validate_rows import parallelism
from twinserve.sim.validate_twins import PLAIN_SIBLING
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows


def _kept(key, fits, row):
    """main before h100dis: the fits as the row's own columns give them."""
    return fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h100", action="store_true", help="every H100 DeepSeek-R1 disaggregated development row")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    rows = pd.concat([dev_rows(b, "DeepSeek-R1", mode="disagg") for b in ("trtllm", "sglang")])
    if args.h100:
        rows = rows[rows["system"] == "h100_sxm"]
    else:
        rows = rows[rows[f"{PLAIN_SIBLING}decode_num_workers"].notna()]
    label = {r["id"]: (r["system"], r["backend"], parallelism(r, disagg="entry")) for _, r in rows.iterrows()}
    d = ab_rows(rows, mock.patch.object(validate_inferencex, "_not_plain_sibling", _kept), out=args.out)
    if not len(d):
        return
    d["group"] = d["id"].map(label)
    for g, part in d.groupby("group"):
        print(f"{' '.join(g):55s} n={len(part):3d} {ab_summary(part)}")
    moved = d[(d.tpot_before - d.tpot_after).abs() > 1e-9]
    print(f"{'all':55s} n={len(d):3d} {ab_summary(d)}")
    print(f"{'moved':55s} n={len(moved):3d} {ab_summary(moved)}")


if __name__ == "__main__":
    main()
