"""SGLang disaggregated DeepSeek-R1 development rows: the decode replicas taking their transferred requests into
their decode steps (sim/validate_engines.py SGLANG_DECODE_JOINS "mixed", SGLANG_DECODE_JOIN_ROW "decode") against
a step of their own that no rank decodes in (SGLang's prefill_first, the joiner's token a one-token prefill row: main
before sglcap), in one process; prints each measurement's TPOT / TTFT (measured, before, after) and CPU seconds, then
the error summaries (docs/validate-accuracy.md, sglcap). Development rows only (issue 49).

    python experiments/sglang_decode_joins.py [--system gb200] [--min-clients N] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import pandas as pd

from twinserve.core.errors import TwinserveError
from twinserve.sim import validate_rows
from twinserve.sim.validate_cli import select_rows
from twinserve.sim.validate_rows import load_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, distinct_measurements, records_frame


def _rows(system: str, lo: int, hi: int) -> pd.DataFrame:
    df = select_rows(load_rows(), backend="sglang", model="DeepSeek-R1", rows="dev")
    c = pd.to_numeric(df["concurrency"], errors="coerce")
    keep = (df["mode"] == "disagg") & (c >= lo) & (c <= hi)
    if system:
        keep &= df["system"] == system
    return df[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="", help="only this system's rows (gb200, gb300, b200_sxm, ...)")
    ap.add_argument("--min-clients", type=int, default=1, help="only rows of at least this many clients")
    ap.add_argument("--max-clients", type=int, default=10**9, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    out = []
    old = (mock.patch.object(validate_rows, "SGLANG_DECODE_JOINS", "prefill_first"),
           mock.patch.object(validate_rows, "SGLANG_DECODE_JOIN_ROW", "prefill"))
    for _, row in distinct_measurements(_rows(args.system, args.min_clients, args.max_clients)).iterrows():
        rec = {"id": row["id"], "conc": int(row["concurrency"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"]}
        c0 = time.process_time()
        try:
            rec.update(before_after(row, *old))
        except TwinserveError as err:  # a row the simulator cannot express (validate reports it the same way)
            print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} not simulated: {str(err)[:80]}", flush=True)
            continue
        rec["cpu_s"] = time.process_time() - c0
        out.append(rec)
        print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} {ab_figures(rec)}  cpu {rec['cpu_s']:5.1f}", flush=True)
    d = records_frame(out, args.out)
    if len(d):
        print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
