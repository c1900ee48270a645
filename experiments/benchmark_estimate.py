"""The K-wave estimate of the benchmark's 10 N means against the full run, on development rows.

    python experiments/benchmark_estimate.py --min-clients 16 --max-clients 256 --budget 600 --out e.jsonl

Runs each chosen development row's full 10 N closed loop once (cheapest first, until --budget
seconds), then computes the estimate for K = 2..5 from the same per-request table: a run stopped
after K N requests gives those requests exactly the full run's figures (sim.validate.run_to_window),
so the estimate needs no second run. Prints per row and per K the TTFT and TPOT difference
(estimate / full - 1), then the max and median |difference| per K (docs/validate-speed.md).
"""

from __future__ import annotations

import argparse
import json
import time

import pandas as pd

from twinserve.sim.validate import expressible, run_to_window
from twinserve.sim.validate_cli import cost_estimate
from twinserve.sim.validate_estimate import wave_estimate
from twinserve.sim.validate_rows import load_rows, row_study

KS = (2, 3, 4, 5)
VARIANTS = [(k, 1) for k in KS] + [(3, 2), (4, 2), (5, 2)]  # (waves K, tail waves averaged)


def main() -> None:
    """Time full runs of the chosen rows and print the estimate's differences per K."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-clients", type=int, default=16, help="rows of at least N clients")
    p.add_argument("--max-clients", type=int, default=256, help="rows of at most N clients")
    p.add_argument("--budget", type=float, default=600.0, help="stop starting rows after this many seconds")
    p.add_argument("--every", type=int, default=1, help="take every k-th candidate in cost order (a spread)")
    p.add_argument("--clients", type=int, nargs="*", default=None, help="only rows of these client counts")
    p.add_argument("--skip", type=int, default=0, help="leave out the first k candidates (resume)")
    p.add_argument("--drain-ks", type=int, nargs="*", default=[3, 4],
                   help="K of the drain variants, each its own run of K + 1 waves")
    p.add_argument("--out", default=None, help="JSON lines, one per row")
    a = p.parse_args()
    rows = load_rows()
    dev = rows[(rows["split"] == "dev") & rows["concurrency"].between(a.min_clients, a.max_clients)]
    if a.clients:
        dev = dev[dev["concurrency"].isin(a.clients)]
    cand = sorted((r.to_dict() for _, r in dev.iterrows()), key=cost_estimate)[a.skip::a.every]
    t_start, diffs = time.perf_counter(), []
    out = open(a.out, "w") if a.out else None
    for row in cand:
        if time.perf_counter() - t_start > a.budget:
            break
        if expressible(pd.Series(row), "roofline"):
            continue
        conc = int(row["concurrency"])
        t0 = time.process_time()
        try:
            req = run_to_window(row_study(pd.Series(row), "roofline", window="benchmark"), 10 * conc, False)
        except Exception as e:  # a row that does not fit: skipped, as the command reports it
            print(f"skip {row['id']}: {type(e).__name__}", flush=True)
            continue
        cpu = time.process_time() - t0
        full = wave_estimate(req, conc, 10, 10)
        rec = {"id": row["id"], "N": conc, "isl": int(row["isl"]), "osl": int(row["osl"]), "cpu_s": cpu,
               "full_ttft_ms": full["ttft_ms"], "full_tpot_ms": full["tpot_ms"]}
        for k, tail in VARIANTS:
            est = wave_estimate(req, conc, 10, k, tail)
            rec[f"d_ttft_k{k}t{tail}"] = est["ttft_ms"] / full["ttft_ms"] - 1
            rec[f"d_tpot_k{k}t{tail}"] = est["tpot_ms"] / full["tpot_ms"] - 1
        if conc >= 32:  # the drain variant needs its own run of K + 1 waves (and times the estimate)
            from twinserve.sim.validate_estimate import drain_study
            cfg = row_study(pd.Series(row), "roofline", window="benchmark")
            for k in a.drain_ks:
                t0 = time.process_time()
                short = run_to_window(drain_study(cfg, conc, k), (k + 1) * conc, False)
                rec[f"cpu_s_k{k}d"] = time.process_time() - t0
                est = wave_estimate(short, conc, 10, k, 1, drain=True)
                rec[f"d_ttft_k{k}d"] = est["ttft_ms"] / full["ttft_ms"] - 1
                rec[f"d_tpot_k{k}d"] = est["tpot_ms"] / full["tpot_ms"] - 1
            t0 = time.process_time()
            run_to_window(cfg, 3 * conc, True)
            rec["cpu_s_k3"] = time.process_time() - t0
        diffs.append(rec)
        print(json.dumps(rec), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
    d = pd.DataFrame(diffs)
    if d.empty:
        print("no row ran (none expressible, or the budget was spent)")
        return
    for n_lo in sorted({16, 32, 64, 128, 256, 512, 1024} & set(range(a.min_clients, a.max_clients + 1))):
        part = d[d["N"] >= n_lo]
        for k, tail in VARIANTS + [(k, "d") for k in a.drain_ks]:
            col = f"k{k}t{tail}" if tail != "d" else f"k{k}d"
            if f"d_ttft_{col}" not in part:
                continue
            t, q = part[f"d_ttft_{col}"].abs(), part[f"d_tpot_{col}"].abs()
            print(f"N>={n_lo} K={k} tail={tail} rows {len(part)}: TTFT |diff| median {t.median():.2%} "
                  f"max {t.max():.2%}; "
                  f"TPOT |diff| median {q.median():.2%} max {q.max():.2%}")


if __name__ == "__main__":
    main()
