"""DeepSeek-R1 TensorRT-LLM aggregated MTP development rows whose launch passes the MTP scripts' step budget
(sim/validate_recipes.py mtp_script_max_num_tokens: ((MTP+1) x CONC + ISL + 127) / 64 x 64, no attention DP; with
--attention-dp the attention-DP rows instead, whose budget is a rank's, MAX_BATCH_SIZE CONC / ranks:
rank_max_num_tokens): each simulated with its recipe as sim/validate_recipes.py gives it and with the budget patched out (TensorRT-LLM's
default, the state before), in one process; prints TTFT / TPOT errors. Rows picked by their configuration only
(backend, model, mode, the recipe's budget), the file's twin records of one measurement simulated once.
Development rows only (issue 49).

    python experiments/trt_mtp_budget_rows.py [--max-clients 256] [--attention-dp] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_layouts, validate_recipes, validate_rows
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, distinct_measurements, records_frame


def _touched(recipe, attention_dp: bool) -> bool:
    return recipe.mtp_rank_budget if attention_dp else recipe.max_num_tokens > 0


def _rows(max_clients: int, attention_dp: bool = False) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients) & (df["mode"] == "agg")]
    df = df[[_touched(validate_recipes.row_recipe(r), attention_dp) for _, r in df.iterrows()]]
    return distinct_measurements(df)


def _without_budget():
    """The rows' recipes with the scripts' budget patched out (the state before)."""
    own = validate_recipes.row_recipe

    def plain(row):
        return replace(own(row), max_num_tokens=0, mtp_rank_budget=False)
    return mock.patch.object(validate_rows, "row_recipe", plain)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=256, help="only rows of at most this many clients")
    ap.add_argument("--attention-dp", action="store_true", help="the attention-DP rows (a rank's budget)")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in _rows(args.max_clients, args.attention_dp).iterrows():
        recipe = validate_recipes.row_recipe(row)
        ranks = validate_layouts.aggregated_layout(row)[1]
        budget = (validate_recipes.rank_max_num_tokens(recipe, int(row["concurrency"]), int(row["isl"]), ranks)
                  if args.attention_dp else recipe.max_num_tokens)
        rec = {"id": row["id"], "system": row["system"], "precision": row["precision"],
               "image": row["backend_version"], "isl": int(row["isl"]), "osl": int(row["osl"]),
               "conc": int(row["concurrency"]), "budget": budget,
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, _without_budget()))
        out.append(rec)
        print(f"{rec['system']:8s} {rec['precision']} {rec['image']:15s} {rec['isl']}/{rec['osl']} c{rec['conc']:<4d} "
              f"budget {rec['budget']:5d} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return
    d["clients"] = pd.cut(d.conc, [0, 8, 32, 128, 256], labels=["<=8", "16-32", "64-128", "256"])
    for what, g in [("all", d)] + [(str(k), g) for k, g in d.groupby("clients", observed=True)]:
        print(f"{what} {len(g)} rows: {ab_summary(g)}")


if __name__ == "__main__":
    main()
