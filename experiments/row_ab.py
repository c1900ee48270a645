"""What the development-row before/after scripts share (fp8_mtp_rows.py, trtgen_rows.py, fp4_trtgen_rows.py,
wide_ep_rows.py, gb200_prefill_rows.py, trt_mtp_budget_rows.py, b200_fp8_decode_caps.py, nvfp4_gemm_rows.py,
sglang_decode_joins.py, trt_decode_caps_fill.py, ...): one
simulation per measurement, a row's predictions without and with the change, and the error summary they print.
Imported from this folder (a script's own folder is on sys.path, as validate_memory.py imports validate_speed)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import pandas as pd

# The columns that tell one measurement from another: the file's twin records of one run agree on them.
MEASUREMENT = ["isl", "osl", "concurrency", "silicon_tpot_ms", "silicon_ttft_ms"]


def dev_rows(backend: str, model: str, lo: int = 0, hi: float = float("inf"), **equal: Any) -> pd.DataFrame:
    """The development rows of `backend` and `model` whose concurrency is in [lo, hi] and whose columns equal
    `equal`'s values (a column given '' is not filtered: an option left empty)."""
    from twinserve.sim.validate_cli import select_rows
    from twinserve.sim.validate_rows import load_rows
    df = select_rows(load_rows(), backend=backend, model=model, rows="dev")
    c = pd.to_numeric(df["concurrency"], errors="coerce")
    keep = (c >= lo) & (c <= hi)
    for col, want in equal.items():
        if want != "":
            keep &= df[col].astype(type(want)) == want
    return df[keep]


def distinct_measurements(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of `df`, one per measurement (twin records simulated once)."""
    same = df[MEASUREMENT].astype(float).round(6)
    return df[~same.duplicated().to_numpy()]


def error_summary(err: pd.Series) -> str:
    """Median |error| (signed median, share within 20%) of relative errors pred / meas - 1."""
    return f"{err.abs().median():.1%} ({err.median():+.1%}, {(err.abs() <= 0.2).mean():.0%} within 20%)"


def records_frame(records: list[dict], out: str) -> pd.DataFrame:
    """The per-row records as a frame, written to `out` as CSV where given."""
    d = pd.DataFrame(records)
    if out:
        d.to_csv(out, index=False)
    return d


def before_after(row: pd.Series, *without: Any) -> dict[str, float]:
    """The row's predictions under aic with the context managers `without` entered (the change patched out:
    tpot_before, ttft_before) and as the tree stands (tpot_after, ttft_after), in this process."""
    from twinserve.sim.validate import simulate_row
    with ExitStack() as stack:
        for patch in without:
            stack.enter_context(patch)
        old = simulate_row((row.to_dict(), "aic"))
    new = simulate_row((row.to_dict(), "aic"))
    return {"tpot_before": old["pred_tpot_ms"], "ttft_before": old["pred_ttft_ms"],
            "tpot_after": new["pred_tpot_ms"], "ttft_after": new["pred_ttft_ms"]}


def ab_figures(rec: dict) -> str:
    """A row's measured, before and after TPOT (ms) and TTFT (ms), for its printed line."""
    return (f"TPOT {rec['meas_tpot']:6.2f} {rec['tpot_before']:6.2f} {rec['tpot_after']:6.2f}  "
            f"TTFT {rec['meas_ttft']:6.0f} {rec['ttft_before']:6.0f} {rec['ttft_after']:6.0f}")


def ab_summary(g: pd.DataFrame) -> str:
    """A group's TPOT and TTFT error summaries before -> after (error_summary)."""
    f = error_summary
    return (f"TPOT {f(g.tpot_before / g.meas_tpot - 1)} -> {f(g.tpot_after / g.meas_tpot - 1)} | "
            f"TTFT {f(g.ttft_before / g.meas_ttft - 1)} -> {f(g.ttft_after / g.meas_ttft - 1)}")


def ab_rows(df: pd.DataFrame, *without: Any, out: str = "") -> pd.DataFrame:
    """Each measurement of `df` (distinct_measurements) before and after (before_after with `without`), its line
    printed as it ends, with its CPU seconds; a row the simulator cannot express is printed and left out, as
    validate reports it. The records as records_frame gives them (written to `out` where given)."""
    from twinserve.core.errors import TwinserveError
    records = []
    for _, row in distinct_measurements(df).iterrows():
        rec = {"id": row["id"], "conc": int(row["concurrency"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        c0 = time.process_time()
        try:
            rec.update(before_after(row, *without))
        except TwinserveError as err:
            print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} not simulated: {str(err)[:80]}", flush=True)
            continue
        rec["cpu_s"] = time.process_time() - c0
        records.append(rec)
        print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} {ab_figures(rec)}  cpu {rec['cpu_s']:5.1f}", flush=True)
    return records_frame(records, out)
