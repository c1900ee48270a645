"""GB300 DeepSeek-R1 TensorRT-LLM disaggregated development rows that the gb300wep change touches (a decode worker
past 256 clients, now capped at its recipe's max_batch_size; or a decode worker at EP > 8 on NVFP4, now aic's large-EP
block with GB200's NVLink all-to-all as a cross-system proxy), each measurement simulated in one process under
the variants asked for: 'before' (neither), 'caps' (the decode caps alone), 'after' (both, the tree as it stands).
Prints each measurement's TPOT / TTFT (measured, then each variant) and the error summaries. Development rows only
(issue 49).

    python experiments/gb300_wide_ep_rows.py [--variants before,caps,after] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import distinct_measurements, error_summary, records_frame

_MATRIX = validate_rows._matrix_workers
_WIDE = validate_rows.disagg_wide_ep


def _uncapped(row, *args):
    """The row's workers with no decode cap past 256 clients (main before gb300wep)."""
    ix = _MATRIX(row, *args)
    return None if ix is None else ix if int(row["concurrency"]) <= 256 else replace(ix, decode_batch=0)


def _fused_on_gb300(row, moe_ep):
    """No GB300 worker on the large-EP block (main before gb300wep)."""
    return False if str(row.get("system")) == "gb300" else _WIDE(row, moe_ep)


PATCHES = {"before": (("_matrix_workers", _uncapped), ("disagg_wide_ep", _fused_on_gb300)),
           "caps": (("disagg_wide_ep", _fused_on_gb300),),
           "after": ()}


def _touched(df: pd.DataFrame, max_clients: int) -> pd.DataFrame:
    c = pd.to_numeric(df["concurrency"], errors="coerce")
    keep = []
    for _, row in df.iterrows():
        ix = _MATRIX(row)
        wide = ix is not None and _WIDE(row, ix.decode.ep)
        keep.append(bool(ix is not None and (int(row["concurrency"]) > 256 or wide)))
    return df[pd.Series(keep, index=df.index) & (c <= max_clients)]


def main() -> None:
    from twinserve.sim.validate import simulate_row
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="before,caps,after", help="comma-separated: before, caps, after")
    ap.add_argument("--max-clients", type=int, default=1 << 30, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    variants = args.variants.split(",")
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    df = df[(df["mode"] == "disagg") & (df["system"] == "gb300")]
    out = []
    for _, row in distinct_measurements(_touched(df, args.max_clients)).iterrows():
        rec = {"id": row["id"], "precision": row["precision"], "conc": int(row["concurrency"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        for v in variants:
            with ExitStack() as stack:
                for name, fn in PATCHES[v]:
                    stack.enter_context(mock.patch.object(validate_rows, name, fn))
                got = simulate_row((row.to_dict(), "aic"))
            rec[f"tpot_{v}"], rec[f"ttft_{v}"] = got["pred_tpot_ms"], got["pred_ttft_ms"]
        out.append(rec)
        figs = "  ".join(f"{v} {rec[f'tpot_{v}']:6.2f} / {rec[f'ttft_{v}']:6.0f}" for v in variants)
        print(f"{rec['id'][:72]:72s} c{rec['conc']:<5d} meas {rec['meas_tpot']:6.2f} / {rec['meas_ttft']:6.0f}  "
              f"{figs}", flush=True)
    d = records_frame(out, args.out)
    for name, g in [("all", d)] + list(d.groupby("precision")):
        if len(g):
            print(f"{name} ({len(g)}): " + " | ".join(
                f"{v} TPOT {error_summary(g[f'tpot_{v}'] / g.meas_tpot - 1)} "
                f"TTFT {error_summary(g[f'ttft_{v}'] / g.meas_ttft - 1)}" for v in variants))


if __name__ == "__main__":
    main()
