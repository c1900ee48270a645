"""How long `simulate validate` takes over every expressible row, projected from a timed sample.

    python experiments/validate_speed.py --sample 40 --top 5 [--cost-model aic] [--full] [--out t.jsonl]

Times rows one by one in this process (pin it: `taskset -c 1`), after the same dedupe the command
does (rows with equal studies run once). The sample is systematic in cost order: the unique studies
sorted by sim.validate_cli.cost_estimate, every k-th of the rest after the `--top` costliest,
which are all timed. Projection: the top rows' own seconds plus each sampled row's seconds times
the k rows it stands for; wall on W workers = max(total / W, the longest row). --full runs every
request out (sim.validate.STOP_AT_WINDOW off) to compare. Prints each row's seconds and predicted
TTFT/TPOT, then the projection (docs/validate-speed.md).
"""

from __future__ import annotations

import argparse
import json
import time

import twinserve.sim.validate as V
from twinserve.sim.validate import expressible, simulate_row
from twinserve.sim.validate_cli import cost_estimate, study_key
from twinserve.sim.validate_rows import load_rows


def unique_rows(cost_model: str) -> list[dict]:
    """The expressible rows, one per study, costliest first."""
    seen: set[str] = set()
    out = []
    for _, row in load_rows().iterrows():
        if expressible(row, cost_model):
            continue
        key = study_key(row, cost_model)
        if key not in seen:
            seen.add(key)
            out.append(row.to_dict())
    return sorted(out, key=cost_estimate, reverse=True)


def main() -> None:
    """Time the sample and print the projection."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=40, help="rows sampled below the top ones")
    p.add_argument("--top", type=int, default=5, help="costliest rows, all timed")
    p.add_argument("--cost-model", default="roofline", help="roofline or aic")
    p.add_argument("--workers", type=int, default=2, help="worker processes the projection assumes")
    p.add_argument("--full", action="store_true", help="run every request out (no stop at the window)")
    p.add_argument("--out", default="", help="also write one JSON line per row here")
    args = p.parse_args()
    V.STOP_AT_WINDOW = not args.full
    rows = unique_rows(args.cost_model)
    top, rest = rows[:args.top], rows[args.top:]
    k = max(1, len(rest) // max(args.sample, 1))
    picked = [(r, 1) for r in top] + [(rest[i], k) for i in range(k // 2, len(rest), k)]
    print(f"{len(rows)} unique studies; timing {args.top} costliest + every {k}th of the rest "
          f"({len(picked) - args.top} rows)", flush=True)
    sink = open(args.out, "a") if args.out else None
    total = longest = cpu_total = 0.0
    for row, weight in picked:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            res = simulate_row((row, args.cost_model))
        except Exception as e:  # noqa: BLE001 - a failing row is reported, not fatal
            res = {"error": f"{type(e).__name__}: {e}"}
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0  # a quiet core's wall: this process's own CPU seconds
        total += wall * weight
        cpu_total += cpu * weight
        longest = max(longest, wall)
        line = {"id": row["id"], "wall_s": wall, "cpu_s": cpu, "weight": weight, "estimate": cost_estimate(row),
                **{c: res.get(c) for c in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_all_ms", "error")}}
        print(f"{wall:8.2f} s wall {cpu:8.2f} s CPU x{weight:<3d} {row['id']}", flush=True)
        if sink:
            sink.write(json.dumps(line) + "\n")
            sink.flush()
    print(f"projected worker seconds: {total:,.0f} wall, {cpu_total:,.0f} CPU; on {args.workers} workers: "
          f"{max(total / args.workers, longest) / 60:,.1f} min here, {cpu_total / args.workers / 60:,.1f} min "
          f"on quiet cores (longest row {longest:,.0f} s)")


if __name__ == "__main__":
    main()
