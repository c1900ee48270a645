"""How long `simulate validate` takes over every expressible row, projected from a timed sample.

    python experiments/validate_speed.py --sample 40 --top 5 [--cost-model aic] [--full] [--out t.jsonl]
    python experiments/validate_speed.py --project t.jsonl [more.jsonl ...]

Times rows one by one in this process (pin it: `taskset -c 1`), after the same dedupe the command
does (rows with equal studies run once). The sample is systematic in cost order: the unique studies
sorted by sim.validate_cli.cost_estimate, every k-th of the rest after the `--top` costliest,
which are all timed. Projection: the top rows' own seconds plus each sampled row's seconds times
the k rows it stands for; wall on W workers = max(total / W, the longest row). --full runs every
request out (sim.validate.STOP_AT_WINDOW off) to compare. Prints each row's seconds and predicted
TTFT/TPOT, then the projection (docs/validate-speed.md). The few costliest rows weigh most and a
systematic sample has one of them at best, so --project fits log(seconds) on log N, OSL, ISL and
disaggregation over every timed row (JSON lines with id and wall_s or cpu_s), predicts the rest
(Duan's smearing for the log bias), and schedules all of them longest first on --workers.
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


def slice_ratios(pairs: list[str]) -> float:
    """c in CPU(reduced) / CPU(full) = c / g, the median over experiments/reduce_compare.py's pairs."""
    import numpy as np

    lines = [json.loads(x) for f in pairs for x in open(f)]
    return float(np.median([d["cpu_s_replicas"] / d["cpu_s_none"] * d["g"] for d in lines]))


def project(files: list[str], cost_model: str, workers: int, column: str, pairs: list[str] | None = None) -> None:
    """Fit seconds per row on the timed rows, predict the untimed ones, print the wall on workers.

    pairs (reduce_compare.py's JSON lines): also project `--reduce replicas`, each sliceable row's
    seconds (timed unreduced or predicted) times c / g, c fitted on the pairs.
    """
    import numpy as np
    import pandas as pd

    rows = pd.DataFrame(unique_rows(cost_model))
    timed: dict[str, float] = {}
    for f in files:
        for line in open(f):
            d = json.loads(line)
            if d.get("pred_tpot_ms") is not None and d.get(column) is not None:
                timed[d["id"]] = d[column]
    rows["timed"] = rows["id"].map(timed)
    k = rows.dropna(subset=["timed"])

    def x(d: pd.DataFrame) -> np.ndarray:
        return np.c_[np.ones(len(d)), np.log(d["concurrency"].astype(float)), np.log(d["osl"].astype(float)),
                     np.log(d["isl"].astype(float)), (d["mode"] == "disagg").astype(float)]
    coef, *_ = np.linalg.lstsq(x(k), np.log(k["timed"]), rcond=None)
    fitted = x(k) @ coef
    smear = float(np.mean(np.exp(np.log(k["timed"]) - fitted)))
    seconds = rows["timed"].fillna(pd.Series(np.exp(x(rows) @ coef) * smear, index=rows.index))
    loads = [0.0] * workers
    for v in sorted(seconds, reverse=True):  # longest first, each to the least-loaded worker
        loads[loads.index(min(loads))] += v
    top = seconds.sort_values(ascending=False)
    print(f"{len(k)} timed of {len(rows)} unique studies; fit r = {np.corrcoef(fitted, np.log(k['timed']))[0, 1]:.2f}"
          f" (log {column} = {coef[0]:.2f} + {coef[1]:.2f} log N + {coef[2]:.2f} log OSL + {coef[3]:.2f} log ISL"
          f" + {coef[4]:.2f} disagg)")
    print(f"projected worker seconds {seconds.sum():,.0f} ({column}); the 50 costliest rows "
          f"{top.head(50).sum() / seconds.sum():.0%}; on {workers} workers {max(loads) / 60:,.1f} min")
    if pairs:
        from twinserve.sim.validate_reduce import slice_factor
        from twinserve.sim.validate_rows import row_study

        c = slice_ratios(pairs)
        g = pd.Series([slice_factor(row_study(pd.Series(r), cost_model), int(r["concurrency"]))
                       for r in rows.to_dict("records")], index=rows.index)
        scaled = seconds * np.where(g > 1, np.minimum(1.0, c / g), 1.0)
        loads = [0.0] * workers
        for v in sorted(scaled, reverse=True):
            loads[loads.index(min(loads))] += v
        share = seconds[g > 1].sum() / seconds.sum()
        print(f"--reduce replicas: {int((g > 1).sum())} sliceable studies holding {share:.0%} of the seconds, "
              f"CPU x {c:.2f} / g; projected worker seconds {scaled.sum():,.0f}; on {workers} workers"
              f" {max(loads) / 60:,.1f} min")


def main() -> None:
    """Time the sample and print the projection."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=40, help="rows sampled below the top ones")
    p.add_argument("--top", type=int, default=5, help="costliest rows, all timed")
    p.add_argument("--cost-model", default="roofline", help="roofline or aic")
    p.add_argument("--workers", type=int, default=2, help="worker processes the projection assumes")
    p.add_argument("--window", default=None, help="benchmark (default: estimated past 64 clients), benchmark-full "
                   "or steady (sim/validate_protocol.py)")
    p.add_argument("--reduce", default=None, help="replicas: 1/g slices of disaggregated clusters "
                   "(sim/validate_reduce.py), or none (the default)")
    p.add_argument("--estimate-waves", type=int, default=None, metavar="K",
                   help="K of the rows estimated from their first waves (default: by their clients)")
    p.add_argument("--cheap-first", action="store_true", help="time the sampled rows cheapest first")
    p.add_argument("--ids", nargs="+", default=None, metavar="ID",
                   help="time these rows (validation ids) instead of a sample, in the order given")
    p.add_argument("--full", action="store_true", help="run every request out (no stop at the window)")
    p.add_argument("--out", default="", help="also write one JSON line per row here")
    p.add_argument("--project", nargs="+", default=None, metavar="JSONL",
                   help="no timing: project the full set from these timed rows")
    p.add_argument("--column", default="wall_s", help="with --project: wall_s or cpu_s")
    p.add_argument("--pairs", nargs="+", default=None, metavar="JSONL",
                   help="with --project: reduce_compare.py's pairs, to also project --reduce replicas")
    args = p.parse_args()
    if args.project:
        project(args.project, args.cost_model, args.workers, args.column, args.pairs)
        return
    V.STOP_AT_WINDOW = not args.full
    rows = unique_rows(args.cost_model)
    top, rest = rows[:args.top], rows[args.top:]
    k = max(1, len(rest) // max(args.sample, 1))
    picked = [(r, 1) for r in top] + [(rest[i], k) for i in range(k // 2, len(rest), k)]
    if args.cheap_first:  # an interrupted run still leaves a spread of timed rows
        picked = picked[::-1]
    if args.ids:  # the same rows on two revisions (old vs new code, alternating)
        by_id = {r["id"]: r for r in load_rows().to_dict("records")}
        picked = [(by_id[i], 1) for i in args.ids]
    options = {"window": args.window} if args.window else {}
    if args.reduce:
        options["reduce"] = args.reduce
    if args.estimate_waves:
        options["waves"] = args.estimate_waves
    print(f"{len(rows)} unique studies; timing {args.top} costliest + every {k}th of the rest "
          f"({len(picked) - args.top} rows)", flush=True)
    sink = open(args.out, "a") if args.out else None
    total = longest = cpu_total = 0.0
    for row, weight in picked:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            res = simulate_row((row, args.cost_model, options))
        except Exception as e:  # noqa: BLE001 - a failing row is reported, not fatal
            res = {"error": f"{type(e).__name__}: {e}"}
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0  # a quiet core's wall: this process's own CPU seconds
        total += wall * weight
        cpu_total += cpu * weight
        longest = max(longest, wall)
        line = {"id": row["id"], "wall_s": wall, "cpu_s": cpu, "weight": weight, "estimate": cost_estimate(row),
                **{c: res.get(c) for c in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_all_ms", "estimator",
                                                    "reduction", "error")}}
        print(f"{wall:8.2f} s wall {cpu:8.2f} s CPU x{weight:<3d} {row['id']}", flush=True)
        if sink:
            sink.write(json.dumps(line) + "\n")
            sink.flush()
    print(f"projected worker seconds: {total:,.0f} wall, {cpu_total:,.0f} CPU; on {args.workers} workers: "
          f"{max(total / args.workers, longest) / 60:,.1f} min here, {cpu_total / args.workers / 60:,.1f} min "
          f"on quiet cores (longest row {longest:,.0f} s)")


if __name__ == "__main__":
    main()
