"""TensorRT-LLM's attention-DP balance (core/sched/batch_policy.py AdpBalance) on the DeepSeek-R1 TensorRT-LLM
aggregated attention-DP development rows: each row simulated with the balance off and on, interleaved, in one
process; prints TTFT / TPOT errors and CPU seconds. Development rows only (issue 49).

    python experiments/adp_balance_rows.py [--max-clients 128] [--cost-model aic|roofline]
"""

from __future__ import annotations

import argparse
import dataclasses
from unittest import mock

import pandas as pd

from twinserve.sim import validate_recipes, validate_rows
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows, row_plan


def _adp_rows(max_clients: int, cost_model: str) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(df["mode"] != "disagg") & (pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients)]
    keep = []
    for i, row in df.iterrows():
        try:
            cfg = row_plan(row, cost_model).cfg
        except Exception:  # not expressible: not this experiment's business
            continue
        if cfg.engine.data_parallel_size > 1:
            keep.append(i)
    return df.loc[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=128,
                    help="only rows of at most this many clients (default 128)")
    ap.add_argument("--cost-model", default="aic", choices=("aic", "roofline"),
                    help="the step prices: aiconfigurator's measured kernels (default) or the roofline")
    args = ap.parse_args()
    rows = _adp_rows(args.max_clients, args.cost_model)
    real = validate_recipes.row_recipe
    out = []
    for _, row in rows.iterrows():
        rec = {"id": row["id"], "sys": row["system"], "ver": row["backend_version"], "isl": row["isl"],
               "osl": row["osl"], "conc": row["concurrency"], "meas_ttft": row["silicon_ttft_ms"],
               "meas_tpot": row["silicon_tpot_ms"]}
        for label, balance in (("off", False), ("on", True)):
            def patched(r, _b=balance):
                recipe = real(r)
                return recipe if _b else dataclasses.replace(recipe, adp_balance_iters=0)
            # validate_rows reads row_recipe by its own name: both names patched for this row.
            with mock.patch.object(validate_recipes, "row_recipe", patched), \
                    mock.patch.object(validate_rows, "row_recipe", patched):
                pred = simulate_row((row.to_dict(), args.cost_model))
            rec[f"ttft_{label}"] = pred["pred_ttft_ms"]
            rec[f"tpot_{label}"] = pred["pred_tpot_ms"]
            rec[f"cpu_{label}"] = pred["sim_cpu_s"]
        out.append(rec)
        r = rec
        print(f"{r['id'][:70]:70s} c{int(r['conc']):<4d} meas {r['meas_ttft']:7.0f} ms  "
              f"off {r['ttft_off']:7.0f} ({r['ttft_off'] / r['meas_ttft'] - 1:+.0%})  "
              f"on {r['ttft_on']:7.0f} ({r['ttft_on'] / r['meas_ttft'] - 1:+.0%})  "
              f"tpot {r['tpot_off'] / r['meas_tpot'] - 1:+.0%} -> {r['tpot_on'] / r['meas_tpot'] - 1:+.0%}  "
              f"cpu {r['cpu_off']:.2f} -> {r['cpu_on']:.2f} s", flush=True)
    d = pd.DataFrame(out)
    if len(d):
        for label in ("off", "on"):
            e = d[f"ttft_{label}"] / d["meas_ttft"] - 1
            t = d[f"tpot_{label}"] / d["meas_tpot"] - 1
            print(f"balance {label}: {len(d)} rows, TTFT median |err| {e.abs().median():.1%} (bias {e.median():+.1%}), "
                  f"TPOT median |err| {t.abs().median():.1%}, CPU {d[f'cpu_{label}'].sum():.1f} s")


if __name__ == "__main__":
    main()
