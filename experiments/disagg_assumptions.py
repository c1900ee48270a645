"""Which worker-count assumption expresses the disaggregated rows that give none? Development rows only.

aiconfigurator-core's InferenceMAX dumps leave out how many prefill and decode workers ran
(sim/validate_layouts.py). This script takes a stratified sample of the DEVELOPMENT rows without
counts (DeepSeek-R1, gpt-oss-120b; held-out rows are never read), simulates each under every
assumption in DISAGG_ASSUMPTIONS (rows where two assumptions give the same study, i.e. the same worker
counts, layouts and drafts, run once), and prints TTFT and TPOT median |error| per assumption. The chosen one
is DEFAULT_DISAGG_ASSUMPTION.

    python experiments/disagg_assumptions.py [--rows 24] [--max-concurrency 1024] [--workers 2]
        [--cost-model roofline|aic]
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import numpy as np
import pandas as pd

from twinserve.sim.runner import PointFailure, run_jobs
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_layouts import DISAGG_ASSUMPTIONS, missing_worker_counts
from twinserve.sim.validate_rows import load_rows, row_plan


def sample(rows: int, max_conc: int) -> pd.DataFrame:
    """Development rows without worker counts, spread evenly over system x backend x ISL/OSL x concurrency."""
    df = load_rows()
    df = df[(df["split"] == "dev") & df.apply(missing_worker_counts, axis=1) & (df["concurrency"] <= max_conc)]
    df = df.sort_values(["system", "backend", "isl", "osl", "concurrency", "id"])
    return df.iloc[np.unique(np.linspace(0, len(df) - 1, rows).round().astype(int))]


def main() -> None:
    """Print the per-assumption errors on the sample."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24, help="rows in the stratified sample")
    ap.add_argument("--max-concurrency", type=int, default=1024, help="leave out rows with more clients (run time)")
    ap.add_argument("--workers", type=int, default=2, help="processes")
    ap.add_argument("--cost-model", choices=("roofline", "aic"), default="roofline", help="step prices")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = sample(args.rows, args.max_concurrency)
    jobs, keys, plans = [], [], {}
    for _, row in df.iterrows():
        seen: set[tuple] = set()
        for how in DISAGG_ASSUMPTIONS:
            try:
                plan = row_plan(row, args.cost_model, disagg=how)
            except Exception as e:  # noqa: BLE001 - a reason, printed
                plans[(row["id"], how)] = f"not expressible: {e}"
                continue
            spec = plan.cfg.speculative
            study = (plan.counts, repr(plan.cfg.cluster.replicas), spec.num_speculative_tokens if spec.enabled else 0)
            plans[(row["id"], how)] = study
            if study in seen:
                continue
            seen.add(study)
            jobs.append((row.to_dict(), args.cost_model, {"disagg": how}))
            keys.append((row["id"], study))
    out = run_jobs(simulate_row, jobs, [{"row": k[0]} for k in keys], args.workers, None, "assumptions", True)
    by_key = {k: r for k, r in zip(keys, out)}
    table: dict[str, dict[str, list[float]]] = {h: {"ttft": [], "tpot": []} for h in DISAGG_ASSUMPTIONS}
    for _, row in df.iterrows():
        line = [f"{row['id'][:72]:72s}"]
        for how in DISAGG_ASSUMPTIONS:
            study = plans.get((row["id"], how))
            res = by_key.get((row["id"], study)) if isinstance(study, tuple) else None
            if res is None or isinstance(res, PointFailure):
                line.append(f"{how}: -")
                continue
            et = res["pred_ttft_ms"] / row["silicon_ttft_ms"] - 1
            ep = res["pred_tpot_ms"] / row["silicon_tpot_ms"] - 1
            table[how]["ttft"].append(abs(et))
            table[how]["tpot"].append(abs(ep))
            (p, d), mtp = study[0], study[2]
            line.append(f"{how} {p}P{d}D{f' MTP {mtp}' if mtp else ''} ttft {et:+.0%} tpot {ep:+.0%}")
        print(" | ".join(line))
    print(f"\n{len(df)} development rows without worker counts (concurrency <= {args.max_concurrency}), "
          f"{len(jobs)} simulations, {time.perf_counter() - t0:.0f} s wall")
    print("| assumption | rows | TTFT median abs err | TPOT median abs err | TPOT within 20% |")
    print("|---|---|---|---|---|")
    for how, t in table.items():
        n = len(t["tpot"])
        if n:
            w20 = sum(e <= 0.2 for e in t["tpot"]) / n
            print(f"| {how} | {n} | {median(t['ttft']):.0%} | {median(t['tpot']):.0%} | {w20:.0%} |")


if __name__ == "__main__":
    main()
