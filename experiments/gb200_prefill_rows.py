"""DeepSeek-R1 GB200 FP4 TensorRT-LLM disaggregated development rows: their prefill ("ctx") workers simulated with
the recipe's batch caps a rank (sim/validate_inferencex.py _PREFILL_CAPS, 8k/1k: `max_batch_size: 2`,
`max_num_tokens: 16640` per attention-DP rank, each request placed on one rank) and the recipe's TRTLLM experts
(sim/validate_recipes.py DISAGG_TRTGEN_PREFILL_WORKERS), and with each patched out, in one process; prints TTFT /
TPOT errors and, from Little's law, the prompt tokens a second each prefill worker ran (measured: clients x mean
ISL / (TTFT + mean OSL x TPOT) / prefill workers; the same from the predictions). Rows picked by configuration only;
twin records of one measurement simulated once; rows whose entry ran MTP past 256 clients (recorded, not
simulated) left out unless --mtp-unsimulated asks for them alone. Development rows only (issue 49).

    python experiments/gb200_prefill_rows.py [--isl N] [--min-clients N] [--max-clients N] [--variants ...]
        [--mtp-unsimulated] [--out CSV]
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_inferencex import inferencex_workers
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import distinct_measurements, error_summary, records_frame

_MATRIX = validate_rows._matrix_workers


def _no_caps(row, *args):
    ix = _MATRIX(row, *args)
    return None if ix is None else replace(ix, prefill_caps=(0, 0))


VARIANTS = {
    "before": (True, True),  # (caps patched out, TRTLLM experts patched out)
    "caps": (False, True),
    "kernel": (True, False),
    "after": (False, False),
}


def _rows(isl: int, lo: int, hi: int, mtp_unsimulated: bool = False) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    c = pd.to_numeric(df["concurrency"], errors="coerce")
    df = df[(c >= lo) & (c <= hi) & (df["mode"] == "disagg") & (df["system"] == "gb200") & (df["precision"] == "fp4")]
    if isl:
        df = df[df["isl"].astype(int) == isl]
    keep = []
    for _, r in df.iterrows():
        ix = inferencex_workers(r)
        simulated = ix is not None and (ix.mtp == 0 or ix.simulates_mtp(int(r["concurrency"])))
        keep.append(ix is not None and simulated != mtp_unsimulated)
    df = df[keep]
    return distinct_measurements(df).sort_values(["isl", "concurrency"])


def _run(row: pd.Series, variant: str) -> dict:
    no_caps, no_kernel = VARIANTS[variant]
    with contextlib.ExitStack() as st:
        if no_caps:
            st.enter_context(mock.patch.object(validate_rows, "_matrix_workers", _no_caps))
        if no_kernel:
            st.enter_context(mock.patch.object(validate_rows, "disagg_prefill_trtgen", lambda r, ep: False))
        return simulate_row((row.to_dict(), "aic"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isl", type=int, default=0, help="only rows of this ISL (0: all)")
    ap.add_argument("--min-clients", type=int, default=0, help="only rows of at least this many clients")
    ap.add_argument("--max-clients", type=int, default=100000, help="only rows of at most this many clients")
    ap.add_argument("--variants", nargs="+", default=["before", "after"], choices=list(VARIANTS),
                    help="which to simulate: before (caps and TRTLLM experts patched out), caps, kernel, after")
    ap.add_argument("--mtp-unsimulated", action="store_true",
                    help="instead: the rows whose entry ran MTP at more clients than are simulated with drafts "
                         "(sim/validate_inferencex.py MTP_SIMULATED_MAX_CLIENTS)")
    ap.add_argument("--out", default="", help="write the per-row figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in _rows(args.isl, args.min_clients, args.max_clients, args.mtp_unsimulated).iterrows():
        ix = inferencex_workers(row)
        isl, osl = 0.9 * int(row["isl"]), 0.9 * int(row["osl"])  # lengths on [0.8 L, L]: the mean
        rec = {"id": row["id"], "isl": int(row["isl"]), "osl": int(row["osl"]), "conc": int(row["concurrency"]),
               "prefill": f"{ix.prefill.count}x adp{ix.prefill.tp}", "decode": f"{ix.decode.count}x ep{ix.decode.ep}",
               "mtp": ix.mtp, "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}

        def tok_s(ttft: float, tpot: float) -> float:  # Little's law: prompt tokens a second a prefill worker
            return rec["conc"] * isl / ((ttft + osl * tpot) / 1000) / ix.prefill.count
        rec["meas_tok_s"] = tok_s(rec["meas_ttft"], rec["meas_tpot"])
        line = (f"{rec['isl']}/{rec['osl']} c{rec['conc']:<5d} P {rec['prefill']:8s} D {rec['decode']:9s} "
                f"mtp{rec['mtp']} meas TTFT {rec['meas_ttft']:6.0f} TPOT {rec['meas_tpot']:6.2f} "
                f"{rec['meas_tok_s'] / 1e3:5.1f}k tok/s |")
        for v in args.variants:
            p = _run(row, v)
            rec[f"ttft_{v}"], rec[f"tpot_{v}"] = p["pred_ttft_ms"], p["pred_tpot_ms"]
            rec[f"tok_s_{v}"] = tok_s(p["pred_ttft_ms"], p["pred_tpot_ms"])
            line += f" {v} {rec[f'ttft_{v}']:6.0f} {rec[f'tpot_{v}']:6.2f} {rec[f'tok_s_{v}'] / 1e3:5.1f}k"
        out.append(rec)
        print(line, flush=True)
    d = records_frame(out, args.out)
    if not len(d):
        return

    f = error_summary
    for what, g in [("all", d), ("<= 256 clients", d[d.conc <= 256]), ("> 256 clients", d[d.conc > 256])]:
        if len(g):
            print(f"{what} {len(g)} rows: " + " | ".join(
                f"{v} TPOT {f(g[f'tpot_{v}'] / g.meas_tpot - 1)} TTFT {f(g[f'ttft_{v}'] / g.meas_ttft - 1)}"
                for v in args.variants))


if __name__ == "__main__":
    main()
