"""TensorRT-LLM's TRTLLM (trtllm-gen) FP8 experts on the DeepSeek-R1 B200 FP8 development rows: every row up to
N clients whose study the change touches (sim/validate_recipes.py PRECISION_IMAGES, DISAGG_TRTGEN_WORKERS), each
simulated with it and with it patched out, in one process; prints TTFT / TPOT errors. Development rows only
(issue 49).

    python experiments/trtgen_rows.py [--max-clients 128] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.sim import validate_recipes, validate_rows
from twinserve.sim.config import replica_config
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows, row_plan
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, records_frame


def _touched(max_clients: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients) & (df["system"] == "b200_sxm")
            & (df["precision"] == "fp8")]
    keep = []
    for i, row in df.iterrows():
        try:
            cfg = row_plan(row, "aic").cfg
        except Exception:  # not expressible: not this experiment's business
            continue
        kernels = {cfg.engine.aic_fp8_moe_kernel}
        kernels |= {replica_config(cfg, j).engine.aic_fp8_moe_kernel for j in range(len(cfg.cluster.replicas or []))}
        if "trtllm" in kernels or "@0a919c5" in validate_recipes.row_recipe(row).source:
            keep.append(i)
    return df.loc[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=128, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in _touched(args.max_clients).iterrows():
        rec = {"id": row["id"], "mode": row["mode"], "conc": row["concurrency"],
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, mock.patch.dict(validate_recipes.PRECISION_IMAGES, clear=True),
                                mock.patch.object(validate_rows, "disagg_fp8_moe_kernel", lambda r, ep, adp: "default")))
        out.append(rec)
        print(f"{rec['id'][:75]:75s} c{int(rec['conc']):<4d} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return

    for mode, g in [("all", d)] + list(d.groupby("mode")):
        print(f"{mode} {len(g)} rows: {ab_summary(g)}")


if __name__ == "__main__":
    main()
