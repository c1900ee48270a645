"""DeepSeek-R1 GB200 FP4 TensorRT-LLM disaggregated development rows whose decode workers run at EP > 8 (sim/
validate_recipes.py WIDE_EP_WORKERS: TensorRT-LLM's WIDEEP MoE backend there): each simulated with the decode
workers' MoE block as aic's large-EP one (backends/sim/aic/graph.py _wide_ep_generation_ops) and with that patched
out (aic's fused dispatch / MoE / combine), in one process; prints TTFT / TPOT errors and the decode rows a rank
the measured figures imply (Little's law: clients x OSL x TPOT / (TTFT + OSL x TPOT) over the decode ranks).
Rows picked by their configuration only (backend, model, GPU, precision, decode layout), twin records of one
measurement simulated once; rows whose InferenceX entry ran MTP past 256 clients (recorded, not simulated) are
left out. Development rows only (issue 49).

    python experiments/wide_ep_rows.py [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_inferencex import inferencex_workers
from twinserve.sim.validate_recipes import disagg_wide_ep
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, distinct_measurements, records_frame


def _rows(max_clients: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(pd.to_numeric(df["concurrency"], errors="coerce") <= max_clients) & (df["mode"] == "disagg")
            & (df["system"] == "gb200") & (df["precision"] == "fp4")]
    keep = []
    for _, r in df.iterrows():
        ix = inferencex_workers(r)
        conc = int(r["concurrency"])
        keep.append(ix is not None and disagg_wide_ep(r, ix.decode.ep) and (ix.mtp == 0 or ix.simulates_mtp(conc)))
    df = df[keep]
    return distinct_measurements(df)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=100000, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in _rows(args.max_clients).iterrows():
        ix = inferencex_workers(row)
        rec = {"id": row["id"], "isl": int(row["isl"]), "osl": int(row["osl"]), "conc": int(row["concurrency"]),
               "decode": f"{ix.decode.count}x ep{ix.decode.ep}", "mtp": ix.mtp,
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        o = 0.9 * rec["osl"]  # lengths on [0.8 L, L]: the mean
        ranks = ix.decode.count * ix.decode.tp
        rec["meas_rows_a_rank"] = rec["conc"] * o * rec["meas_tpot"] / (rec["meas_ttft"] + o * rec["meas_tpot"]) / ranks
        rec.update(before_after(row, mock.patch.object(validate_rows, "disagg_wide_ep", lambda r, ep: False)))
        out.append(rec)
        print(f"{rec['isl']}/{rec['osl']} c{rec['conc']:<5d} D {rec['decode']:9s} mtp{rec['mtp']} "
              f"rows/rank {rec['meas_rows_a_rank']:5.1f} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return

    for what, g in [("all", d), ("<= 256 clients", d[d.conc <= 256]), ("> 256 clients", d[d.conc > 256])]:
        if len(g):
            print(f"{what} {len(g)} rows: {ab_summary(g)}")


if __name__ == "__main__":
    main()
