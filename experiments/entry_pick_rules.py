"""Which InferenceX entry should a disaggregated row run when several could be its run? Development rows only.

A DeepSeek-R1 / gpt-oss-120b disaggregated row without worker counts that no single entry of InferenceX's
matrix is (sim/validate_inferencex.py) either fits several entries that disagree on the workers, or fits none
at its client count while entries of its configuration and shape exist at others (the nearest are taken:
validate_inferencex.pick_pool). This script simulates each such DEVELOPMENT row (held-out rows are never read) once per
distinct entry, then scores rules that pick one entry without reading the row's measured figures, beside the
`kv_fit_rate` count assumption. The rule validate_inferencex.assumed_entry applies is the one chosen here.

    python experiments/entry_pick_rules.py [--max-concurrency 1024] [--workers 2] [--cost-model aic|roofline]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable
from unittest import mock

import pandas as pd

import twinserve.sim.validate_inferencex as vi
from twinserve.sim.runner import PointFailure, run_jobs
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_layouts import missing_worker_counts
from twinserve.sim.validate_rows import load_rows
from twinserve.sim.validate_twins import twin_of


def _entries(row: pd.Series) -> tuple[str, list[vi.Entry]]:
    """('fit' | 'near', the distinct entries that could be the row's run) for a row assumed_entry would pick for."""
    if vi.inferencex_workers(row) is not None:
        return "", []
    fits, at_count = vi.pick_pool(row)  # what assumed_entry picks from
    distinct = {(e.prefill, e.decode, e.mtp): e for e in fits}
    return "fit" if at_count else "near", list(distinct.values())


def _simulate(job: tuple[dict, vi.Entry | None, str]) -> dict[str, Any]:
    """The row's prediction with `entry` as its only fitting entry (None: the kv_fit_rate count assumption)."""
    row, entry, cost_model = job
    if entry is None:
        return simulate_row((row, cost_model, {"disagg": "kv_fit_rate"}))
    with mock.patch.object(vi, "candidates", lambda _row: [entry]):
        return simulate_row((row, cost_model, {"disagg": "kv_fit_rate"}))


Rule = Callable[[pd.DataFrame], pd.Series]
RULES: dict[str, Rule] = {
    "most decode workers, then deepest MTP (chosen)": lambda x: x.sort_values(["decode", "mtp"]).iloc[-1],
    "most decode workers, then no MTP": lambda x: x.assign(plain=-x["mtp"].clip(lower=0))
    .sort_values(["decode", "plain"]).iloc[-1],
    "deepest MTP, then most decode workers": lambda x: x.sort_values(["mtp", "decode"]).iloc[-1],
    "fewest decode workers, then deepest MTP": lambda x: x.sort_values(["decode", "mtp"], ascending=[True, False])
    .iloc[0],
    "no MTP first, then fewest decode workers": lambda x: x.sort_values(["mtp", "decode"]).iloc[0],
    "the first entry listed": lambda x: x.sort_values("order").iloc[0],
}


def main() -> None:
    """Print each rule's errors on the rows, by how their entries were found."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-concurrency", type=int, default=1024, help="leave out rows with more clients (run time)")
    ap.add_argument("--workers", type=int, default=2, help="processes")
    ap.add_argument("--cost-model", choices=("aic", "roofline"), default="aic", help="step prices")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = load_rows()
    df = df[(df["split"] == "dev") & (df["mode"] == "disagg") & (df["concurrency"] <= args.max_concurrency)]
    jobs, meta = [], []
    for _, row in df.iterrows():
        if not missing_worker_counts(row) or twin_of(row):
            continue
        how, entries = _entries(row)
        if not entries:
            continue
        for order, e in enumerate([None, *entries]):
            jobs.append((row.to_dict(), e, args.cost_model))
            meta.append({"row": row["id"], "how": how, "order": order - 1, "decode": e.decode.count if e else 0,
                         "mtp": e.mtp if e else 0, "meas_tpot": row["silicon_tpot_ms"],
                         "meas_ttft": row["silicon_ttft_ms"]})
    out = run_jobs(_simulate, jobs, [{"row": m["row"]} for m in meta], args.workers, None, "entries", True)
    recs = []
    for m, r in zip(meta, out):
        if isinstance(r, PointFailure) or not r.get("pred_tpot_ms"):
            continue
        recs.append({**m, "tpot": r["pred_tpot_ms"] / m["meas_tpot"] - 1, "ttft": r["pred_ttft_ms"] / m["meas_ttft"] - 1})
    res = pd.DataFrame(recs)
    base, cand = res[res["order"] < 0].set_index("row"), res[res["order"] >= 0]
    print(f"{cand['row'].nunique()} development rows ({(cand.groupby('row')['how'].first() == 'fit').sum()} fitting "
          f"several entries, the rest none at their client count), {len(jobs)} simulations, "
          f"{time.perf_counter() - t0:.0f} s wall, --cost-model {args.cost_model}")
    print("| rule | rows | TPOT median abs err | TPOT within 20% | TPOT signed median | TTFT median abs err |")
    print("|---|---|---|---|---|---|")
    for sub, label in ((cand, "all"), (cand[cand["how"] == "fit"], "fit"), (cand[cand["how"] == "near"], "near")):
        rows = sub["row"].unique()
        picks = {"kv_fit_rate counts (before)": base.loc[base.index.intersection(rows)]}
        for name, rule in RULES.items():
            picks[name] = sub.groupby("row").apply(rule, include_groups=False)
        for name, p in picks.items():
            t = p["tpot"]
            print(f"| {label}: {name} | {len(p)} | {t.abs().median():.1%} | {(t.abs() <= 0.2).mean():.0%} | "
                  f"{t.median():+.1%} | {p['ttft'].abs().median():.1%} |")


if __name__ == "__main__":
    main()
