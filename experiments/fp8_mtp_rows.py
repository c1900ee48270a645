"""DeepSeek-R1 B200 FP8 TensorRT-LLM MTP development rows (image 1.2.0rc6.post3): each simulated with its recipe
as sim/validate_recipes.py PRECISION_IMAGES gives it (the script of InferenceX PR #632: TRTLLM experts without
attention DP) and with that entry patched out (the older DEEPGEMM script's recipe, aic's TensorRT-LLM DeepGEMM
table), in one process; prints TTFT / TPOT errors. Rows picked by their configuration only (backend, model,
GPU, precision, image, clients), the file's twin records of one measurement simulated once. Development rows
only (issue 49).

    python experiments/fp8_mtp_rows.py [--max-clients 128] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.sim import validate_recipes
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, distinct_measurements, records_frame

KEY = ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8", "1.2.0rc6.post3")


def _rows(max_clients: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients) & (df["system"] == "b200_sxm")
            & (df["precision"] == "fp8") & (df["mode"] == "agg") & (df["backend_version"] == KEY[-1])]
    return distinct_measurements(df)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=128, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    others = {k: v for k, v in validate_recipes.PRECISION_IMAGES.items() if k != KEY}
    out = []
    for _, row in _rows(args.max_clients).iterrows():
        rec = {"id": row["id"], "isl": int(row["isl"]), "osl": int(row["osl"]), "conc": int(row["concurrency"]),
               "adp": int(row.get("attention_dp_size") or 1), "kernel": validate_recipes.row_recipe(row).fp8_moe_kernel,
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, mock.patch.dict(validate_recipes.PRECISION_IMAGES, others, clear=True)))
        out.append(rec)
        print(f"{rec['isl']}/{rec['osl']} c{rec['conc']:<4d} adp{rec['adp']:<3d} {rec['kernel'] or 'default':8s} "
              f"{ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return

    for what, g in [("all", d)] + list(d.groupby("kernel")):
        print(f"{what or 'default'} {len(g)} rows: {ab_summary(g)}")


if __name__ == "__main__":
    main()
