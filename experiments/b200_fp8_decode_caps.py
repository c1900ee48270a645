"""B200 FP8 1k/1k TensorRT-LLM disaggregated development rows past 256 clients: their decode workers capped at the
recipes' max_batch_size (sim/validate_inferencex.py _DECODE_BATCH, this branch) against uncapped (as main had them),
in one process; prints each row's predicted TTFT / TPOT and their errors, then the medians (docs/validate-accuracy.md,
trtdttft). Each client count's rows share one study, simulated once a variant. Development rows only (issue 49).

    python experiments/b200_fp8_decode_caps.py [--min-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows

_MATRIX = validate_rows._matrix_workers


def _uncapped(row, *args):
    """The row's workers with no decode cap past 256 clients (main before this branch)."""
    ix = _MATRIX(row, *args)
    return None if ix is None or int(row["concurrency"]) <= 256 else replace(ix, decode_batch=0)


def _rows(lo: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="trtllm", model="DeepSeek-R1", rows="dev")
    c = pd.to_numeric(df["concurrency"], errors="coerce")
    return df[(df["mode"] == "disagg") & (df["system"] == "b200_sxm") & (df["precision"] == "fp8")
              & (df["isl"].astype(int) == 1024) & (df["osl"].astype(int) == 1024) & (c >= lo)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-clients", type=int, default=257)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    df = _rows(args.min_clients)
    out = []
    for conc, g in df.groupby(df["concurrency"].astype(int)):
        preds = {}
        for name, fn in (("before", _uncapped), ("after", _MATRIX)):
            with mock.patch.object(validate_rows, "_matrix_workers", fn):
                preds[name] = simulate_row((g.iloc[0].to_dict(), "aic"))
        for _, r in g.iterrows():
            rec = {"clients": conc, "row_id": r["id"], "meas_ttft": r["silicon_ttft_ms"], "meas_tpot": r["silicon_tpot_ms"]}
            for name, p in preds.items():
                rec[f"ttft_{name}"], rec[f"tpot_{name}"] = p["pred_ttft_ms"], p["pred_tpot_ms"]
                rec[f"err_ttft_{name}"] = p["pred_ttft_ms"] / r["silicon_ttft_ms"] - 1
                rec[f"err_tpot_{name}"] = p["pred_tpot_ms"] / r["silicon_tpot_ms"] - 1
            out.append(rec)
    frame = pd.DataFrame(out)
    with pd.option_context("display.width", 250):
        print(frame.drop(columns="row_id").round(3).to_string(index=False))
    for k in ("err_ttft_before", "err_ttft_after", "err_tpot_before", "err_tpot_after"):
        print(f"{k}: median |err| {frame[k].abs().median():.1%}, median {frame[k].median():+.1%}")
    if args.out:
        frame.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
