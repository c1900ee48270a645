"""Reduced (a 1/g slice of a disaggregated cluster) against full runs of the same rows.

    taskset -c 1 python experiments/reduce_compare.py --rows dev --max-cost 2e9 --limit 30 --out r.jsonl
    python experiments/reduce_compare.py --report r.jsonl

Picks the sliceable rows (sim/validate_reduce.py: g = gcd(P, D, N) > 1) of the split, one per study,
cheapest first up to --max-cost (sim.validate_cli.cost_estimate), spread evenly to --limit rows;
runs each under --reduce none and replicas in this process (CPU seconds each), writes one JSON line
per row; --report prints median and max |reduced / full - 1| of TTFT and TPOT and the CPU ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from twinserve.sim.validate import expressible, simulate_row
from twinserve.sim.validate_cli import cost_estimate, study_key
from twinserve.sim.validate_reduce import slice_factor
from twinserve.sim.validate_rows import load_rows, row_study


def sliceable(split: str, cost_model: str, max_cost: float, min_cost: float = 0.0) -> list[tuple[dict, int]]:
    """(row, g) of the split's sliceable rows, one per study, cheapest first, min_cost < cost <= max_cost."""
    seen: set[str] = set()
    out = []
    df = load_rows()
    df = df[(df["mode"] == "disagg") & ((df["split"] == split) if split != "all" else True)]
    for _, row in df.iterrows():
        if expressible(row, cost_model) or not min_cost < cost_estimate(row.to_dict()) <= max_cost:
            continue
        g = slice_factor(row_study(row, cost_model), int(row["concurrency"]))
        key = study_key(row, cost_model)
        if g > 1 and key not in seen:
            seen.add(key)
            out.append((row.to_dict(), g))
    return sorted(out, key=lambda rg: cost_estimate(rg[0]))


def report(files: list[str]) -> None:
    """Median and max |reduced / full - 1| of TTFT and TPOT, and the CPU ratio, over the rows."""
    d = pd.DataFrame([json.loads(x) for f in files for x in open(f)])
    for m in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_engine_ms"):
        diff = d[f"{m}_replicas"] / d[f"{m}_none"] - 1
        worst = d.loc[diff.abs().idxmax(), "id"]
        print(f"{m}: {len(d)} rows, median |diff| {np.median(diff.abs()):.2%}, max {diff.abs().max():.2%} "
              f"({worst}), signed median {diff.median():+.2%}")
    print(f"CPU: reduced {d['cpu_s_replicas'].sum():.1f} s / full {d['cpu_s_none'].sum():.1f} s = "
          f"{d['cpu_s_replicas'].sum() / d['cpu_s_none'].sum():.2f} summed; per row median "
          f"{np.median(d['cpu_s_replicas'] / d['cpu_s_none']):.2f}; by g: "
          + ", ".join(f"g={g}: {(x['cpu_s_replicas'] / x['cpu_s_none']).median():.2f} ({len(x)})"
                      for g, x in d.groupby("g")))


def main() -> None:
    """Run the pairs, or report on them."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="dev", help="dev, heldout or all")
    p.add_argument("--cost-model", default="roofline", help="roofline or aic")
    p.add_argument("--window", default=None, help="the validate window (default: validate's)")
    p.add_argument("--max-cost", type=float, default=2e9, help="skip rows above this cost_estimate")
    p.add_argument("--min-cost", type=float, default=0.0, help="skip rows at or below this cost_estimate")
    p.add_argument("--limit", type=int, default=30, help="rows, spread evenly over the sliceable ones")
    p.add_argument("--out", default="", help="one JSON line per row")
    p.add_argument("--report", nargs="+", default=None, metavar="JSONL", help="print the differences only")
    args = p.parse_args()
    if args.report:
        report(args.report)
        return
    rows = sliceable(args.rows, args.cost_model, args.max_cost, args.min_cost)
    if args.limit < len(rows):
        rows = [rows[i] for i in np.unique(np.linspace(0, len(rows) - 1, args.limit).round().astype(int))]
    print(f"{len(rows)} sliceable rows", flush=True)
    sink = open(args.out, "a") if args.out else None
    for row, g in rows:
        line = {"id": row["id"], "g": g, "concurrency": int(row["concurrency"]), "cost": cost_estimate(row)}
        for reduce in ("replicas", "none"):
            options = {"reduce": reduce, **({"window": args.window} if args.window else {})}
            c0 = time.process_time()
            res = simulate_row((row, args.cost_model, options))
            line[f"cpu_s_{reduce}"] = time.process_time() - c0
            for c in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_engine_ms", "estimator", "reduction"):
                line[f"{c}_{reduce}"] = res.get(c)
        print(json.dumps(line), flush=True)
        if sink:
            sink.write(json.dumps(line) + "\n")
            sink.flush()


if __name__ == "__main__":
    main()
