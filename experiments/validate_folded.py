"""`simulate validate` on the rows sim/validate_layouts.folded_layout reads as one node's TP x EP server.

    python experiments/validate_folded.py --rows dev|heldout [--limit N] [--max-clients N]
        [--cost-model roofline|aic] [--as-given] --out DIR

--as-given runs the same rows with their columns as the file gives them (tp_size = moe_tp x moe_ep
GPUs: the code before the fold). Writes DIR/validation.csv as `simulate validate` does, for
experiments/validate_compare.py.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path


def main() -> None:
    """Select the folded rows, run them, write validation.csv."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="dev", choices=["dev", "heldout"], help="which split")
    ap.add_argument("--limit", type=int, default=20, help="at most N rows, spread evenly")
    ap.add_argument("--max-clients", type=int, default=256, help="only rows of at most N clients")
    ap.add_argument("--cost-model", default="roofline", help="roofline or aic")
    ap.add_argument("--as-given", action="store_true", help="the file's columns as they are (no fold)")
    ap.add_argument("--out", required=True, help="output folder")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from twinserve.sim import validate_rows as vr
    from twinserve.sim.validate_cli import run_validation
    from twinserve.sim.validate_layouts import folded_layout
    rows = vr.load_rows()
    rows = rows[(rows["split"] == args.rows) & (rows["concurrency"] <= args.max_clients)]
    rows = rows[rows.apply(lambda r: folded_layout(r) is not None, axis=1)]
    if len(rows) > args.limit:
        rows = rows.iloc[[round(i * len(rows) / args.limit) for i in range(args.limit)]]
    if args.as_given:
        vr.folded_layout = lambda row: None  # validate_rows.workers/row_plan look it up at call time
    out = run_validation(rows, args.cost_model, 1, None, progress=False)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out.to_csv(Path(args.out) / "validation.csv", index=False)
    print(f"{len(rows)} rows -> {args.out}/validation.csv")


if __name__ == "__main__":
    main()
