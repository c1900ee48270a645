"""DeepSeek-R1 B200 FP4 TensorRT-LLM aggregated MTP development rows (images 1.2.0rc6.post3 and 1.1.0rc2.post2, the
layouts benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2 ran): each simulated with its recipe as sim/validate_recipes.py
gives it (TRTLLM experts without attention DP: trtllm-gen NVFP4 rows at every token count, backends/sim/aic/trtgen.py)
and with the recipe's MoE backend patched out (aic's own default: CUTLASS above 128 gathered tokens), in one process;
prints TTFT / TPOT errors. Rows picked by their configuration only (backend, model, GPU, precision, image,
clients), the file's twin records of one measurement simulated once. Development rows only (issue 49).

    python experiments/fp4_trtgen_rows.py [--max-clients 128] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_recipes
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, records_frame

IMAGES = ("1.2.0rc6.post3", "1.1.0rc2.post2")


def _rows(max_clients: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients) & (df["system"] == "b200_sxm")
            & (df["precision"] == "fp4") & (df["mode"] == "agg") & df["backend_version"].isin(IMAGES)]
    df = df[[validate_recipes.row_recipe(r).mtp > 0 for _, r in df.iterrows()]]
    same = df[["backend_version", "isl", "osl", "concurrency", "silicon_tpot_ms", "silicon_ttft_ms"]].astype(str)
    return df[~same.duplicated().to_numpy()]


def _without_kernel():
    """The recipe with its MoE backend patched out (the state before)."""
    own = validate_recipes._dsr1_b200_trt_mtp

    def plain(*a, **k):
        return replace(own(*a, **k), fp8_moe_kernel="")
    key = ("trtllm", "DeepSeek-R1", "b200_sxm", "1.2.0rc6.post3")
    return (mock.patch.object(validate_recipes, "_dsr1_b200_trt_mtp", plain),
            mock.patch.dict(validate_recipes.MTP_IMAGES, {key: plain}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=128, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in _rows(args.max_clients).iterrows():
        rec = {"id": row["id"], "image": row["backend_version"], "isl": int(row["isl"]), "osl": int(row["osl"]),
               "conc": int(row["concurrency"]), "adp": int(row.get("attention_dp_size") or 1),
               "kernel": validate_recipes.row_recipe(row).fp8_moe_kernel,
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, *_without_kernel()))
        out.append(rec)
        print(f"{rec['image']:15s} {rec['isl']}/{rec['osl']} c{rec['conc']:<4d} adp{rec['adp']:<3d} "
              f"{rec['kernel'] or 'default':8s} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return

    for what, g in [("all", d)] + list(d.groupby("kernel")):
        print(f"{what or 'default'} {len(g)} rows: {ab_summary(g)}")


if __name__ == "__main__":
    main()
