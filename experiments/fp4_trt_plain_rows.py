"""DeepSeek-R1 B200 FP4 TensorRT-LLM aggregated development rows that run the non-MTP script: each simulated with its
recipe as sim/validate_recipes.py gives it (the script's --max_num_tokens: _dsr1_fp4_b200_trt, _dsr1_fp4_b200_trt_rc6)
and with main's (_dsr1_trt: the attention-DP balance only), in one process; prints each measurement's TPOT / TTFT
(measured, before, after), then the error summaries (docs/validate-accuracy.md, trtagg). With --kernel, a third
study each: the scripts' MoE backend as well (TRTLLM experts where the script sets TRTLLM; not carried in the tree).
Development rows only (issue 49).

    python experiments/fp4_trt_plain_rows.py [--min-clients N] [--max-clients N] [--kernel] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_recipes, validate_rows
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_recipes import row_recipe
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, dev_rows, distinct_measurements, error_summary, records_frame

_KEY = ("trtllm", "DeepSeek-R1", "b200_sxm", "fp4")
_OLD = validate_recipes._dsr1_trt


def _without():
    """main's recipes for these rows: _dsr1_trt for both the image-less / rc2 rows and the rc6.post2 ones."""
    images = {k: v for k, v in validate_recipes.PRECISION_IMAGES.items() if k != (*_KEY, "1.2.0rc6.post2")}
    return (mock.patch.dict(validate_recipes.RECIPES, {_KEY: _OLD}),
            mock.patch.object(validate_recipes, "PRECISION_IMAGES", images))


def _script_kernel(isl: int, osl: int, conc: int, attention_dp: bool, version: str) -> str:
    """'trtllm' where the row's script sets MOE_BACKEND TRTLLM, '' (aic's table) where CUTLASS."""
    if version == "1.2.0rc6.post2":  # single_node/dsr1_fp4_b200_trt.sh @34bc7c4: CUTLASS under attention DP
        return "" if attention_dp else "trtllm"
    # dsr1_fp4_b200_trt.sh @6320e9b: CUTLASS from 256 clients at 1k prompts, above 32 at 8k
    cutlass = conc >= 256 if isl == 1024 else conc > 32
    return "" if cutlass else "trtllm"


def _with_kernel(row: pd.Series) -> dict[str, float]:
    """The row's prediction with the tree's recipe plus its script's MoE backend."""
    own = validate_recipes.row_recipe
    kernel = _script_kernel(int(row["isl"]), int(row["osl"]), int(row["concurrency"]),
                            float(row.get("attention_dp_size") or 1) > 1, str(row["backend_version"]))
    with mock.patch.object(validate_rows, "row_recipe", lambda r: replace(own(r), fp8_moe_kernel=kernel)):
        r = simulate_row((row.to_dict(), "aic"))
    return {"tpot_kernel": r["pred_tpot_ms"], "ttft_kernel": r["pred_ttft_ms"]}


def _rows(lo: int, hi: int) -> pd.DataFrame:
    df = dev_rows("trtllm", "DeepSeek-R1", lo, hi, mode="agg", system="b200_sxm", precision="fp4")
    plain = df.apply(lambda r: "dsr1_fp4_b200_trt.sh" in row_recipe(r).source, axis=1)
    return df[plain]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-clients", type=int, default=1, help="only rows of at least this many clients")
    ap.add_argument("--max-clients", type=int, default=256, help="only rows of at most this many clients")
    ap.add_argument("--kernel", action="store_true", help="also simulate each row with its script's MoE backend")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in distinct_measurements(_rows(args.min_clients, args.max_clients)).iterrows():
        rec = {"id": row["id"], "conc": int(row["concurrency"]), "version": str(row["backend_version"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, *_without()))
        if args.kernel:
            rec.update(_with_kernel(row))
        out.append(rec)
        print(f"{rec['id'][-48:]:48s} {rec['version'][:14]:14s} c{rec['conc']:<4d} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if len(d):
        print(f"{len(d)} measurements: {ab_summary(d)}")
        for v, g in d.groupby("version"):
            print(f"  {v} ({len(g)}): {ab_summary(g)}")
        if args.kernel:
            f = error_summary
            print(f"with the scripts' MoE backend too: TPOT {f(d.tpot_kernel / d.meas_tpot - 1)} | "
                  f"TTFT {f(d.ttft_kernel / d.meas_ttft - 1)}")


if __name__ == "__main__":
    main()
