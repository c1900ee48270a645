"""How many of aiconfigurator-core's measured rows `simulate validate` expresses, without simulating any.

Counts per split: expressible as given, expressible with an assumed or inferred layout (the
`layout` column), and each reason for the rest, digits folded so like reasons group.

    python experiments/validate_coverage.py [--assume-disagg entry|kv_fit_rate|kv_fit|one_each|none] [--cost-model roofline|aic]
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter

from twinserve.sim.validate import expressible, row_record
from twinserve.sim.validate_layouts import DEFAULT_DISAGG_ASSUMPTION, DISAGG_ASSUMPTIONS
from twinserve.sim.validate_rows import load_rows


def main() -> None:
    """Print the coverage table and the reasons."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assume-disagg", choices=DISAGG_ASSUMPTIONS + ("none",), default=DEFAULT_DISAGG_ASSUMPTION,
                    help="how rows without worker counts are expressed (none: not at all)")
    ap.add_argument("--cost-model", default="roofline", help="roofline or aic (aic refuses linear attention)")
    args = ap.parse_args()
    disagg = None if args.assume_disagg == "none" else args.assume_disagg
    t0 = time.perf_counter()
    df = load_rows()
    reasons, layouts = [], []
    for _, row in df.iterrows():
        reasons.append(expressible(row, args.cost_model, disagg=disagg))
        layouts.append(row_record(row, disagg=disagg)["layout"])
    df["reason"], df["layout"] = reasons, layouts
    ok = df["reason"] == ""
    print(f"{len(df)} rows, --assume-disagg {args.assume_disagg}, --cost-model {args.cost_model}, "
          f"{time.perf_counter() - t0:.0f} s")
    print("| split | rows | expressible | as given | assumed or inferred layout |")
    print("|---|---|---|---|---|")
    for split, part in (("dev", df[df["split"] == "dev"]), ("heldout", df[df["split"] == "heldout"]), ("all", df)):
        e = part["reason"] == ""
        given = e & (part["layout"] == "")
        print(f"| {split} | {len(part)} | {int(e.sum())} ({e.mean():.1%}) | {int(given.sum())} | "
              f"{int((e & ~given).sum())} |")
    print("\nassumed or inferred, by kind:")
    kinds = Counter(re.sub(r"\d+", "N", s) for s in df.loc[ok & (df["layout"] != ""), "layout"])
    for k, v in kinds.most_common():
        print(f"  {v:5d}  {k}")
    print("\nnot expressible:")
    for k, v in Counter(re.sub(r"\d+(\.\d+)?", "N", r)[:150] for r in df.loc[~ok, "reason"]).most_common():
        print(f"  {v:5d}  {k}")


if __name__ == "__main__":
    main()
