"""TensorRT-LLM NVFP4 development rows with their dense GEMMs priced as the engine's autotuner runs them
(backends/sim/aic/nvfp4_gemm.py) against aic's untuned TensorRT-LLM rows alone (main before fp4gemm), in one
process; prints each measurement's TPOT / TTFT (measured, before, after), then the error summaries per group
(docs/validate-accuracy.md, fp4gemm). Development rows only (issue 49).

    python experiments/nvfp4_gemm_rows.py [--model Llama-3.1-70B] [--system b200_sxm] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, dev_rows, distinct_measurements, records_frame


def _rows(model: str, system: str, max_clients: int) -> pd.DataFrame:
    return dev_rows("trtllm", model, hi=max_clients, precision="fp4", system=system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Llama-3.1-70B", help="development model")
    ap.add_argument("--system", default="b200_sxm", help="aic system ('' for every one)")
    ap.add_argument("--max-clients", type=int, default=128, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    # Before: no NVFP4 GEMM op found, so no stand-in is read (aic's TensorRT-LLM answer alone).
    untuned = mock.patch("twinserve.backends.sim.aic.cost_model.nvfp4_gemm_ops", lambda graph: "")
    out = []
    for _, row in distinct_measurements(_rows(args.model, args.system, args.max_clients)).iterrows():
        rec = {"id": row["id"], "system": row["system"], "mode": row["mode"], "conc": int(row["concurrency"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        rec.update(before_after(row, untuned))
        out.append(rec)
        print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    for key, g in d.groupby(["system", "mode"]) if len(d) else ():
        print(f"{' '.join(key)}, {len(g)} measurements: {ab_summary(g)}")


if __name__ == "__main__":
    main()
