"""SGLang disaggregated DeepSeek-R1 development rows whose InferenceX entry ran MTP: drafting at the depth their
srt-slurm recipes give (sim/validate_inferencex.py SGLANG_MTP_STEPS) against the entries' depth "not given" (not
simulated: main before sglmtp), in one process. Only the rows whose layout note or drafting differs between the two
are simulated; prints each measurement's TPOT / TTFT (measured, before, after), then the error summaries per system /
precision / ISL-OSL and overall (docs/validate-accuracy.md, sglmtp). Development rows only (issue 49).

    python experiments/sglang_mtp_rows.py [--system b200_sxm] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.core.errors import TwinserveError
from twinserve.sim import validate_inferencex as vi
from twinserve.sim.validate_rows import row_plan
# this folder (experiments/row_ab.py)
from row_ab import ab_figures, ab_summary, before_after, dev_rows, distinct_measurements, records_frame


def depth_not_given() -> mock._patch:
    """TABLE as main had it: every SGLang MTP entry's depth MTP_DEPTH_NOT_GIVEN."""
    old = {k: tuple(replace(e, mtp=vi.MTP_DEPTH_NOT_GIVEN) if k[0] == "sglang" and e.mtp > 0 else e for e in v)
           for k, v in vi.TABLE.items()}
    return mock.patch.dict(vi.TABLE, old)


def _plan(row: pd.Series) -> tuple[str, int]:
    try:
        p = row_plan(row, "aic")
    except TwinserveError as err:
        return f"not expressible: {err}", 0
    spec = p.cfg.speculative
    return p.layout, spec.num_speculative_tokens if spec.enabled else 0


def _rows(system: str, hi: int) -> pd.DataFrame:
    return dev_rows("sglang", "DeepSeek-R1", hi=hi, mode="disagg", system=system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="", help="only this system's rows (b200_sxm, h100_sxm, h200_sxm)")
    ap.add_argument("--max-clients", type=int, default=10**9, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    out = []
    for _, row in distinct_measurements(_rows(args.system, args.max_clients)).iterrows():
        with depth_not_given():
            before = _plan(row)
        after = _plan(row)
        if before == after:
            continue
        rec = {"id": row["id"], "system": row["system"], "precision": row["precision"],
               "isl_osl": f"{int(row['isl'])}/{int(row['osl'])}", "conc": int(row["concurrency"]),
               "meas_ttft": row["silicon_ttft_ms"], "meas_tpot": row["silicon_tpot_ms"],
               "depth": after[1], "layout": after[0],
               # "depth": the row's entry was an MTP one of depth not given; "pick": an assumed entry whose pick
               # (most decode workers, then the deepest MTP) now falls on an MTP entry over a plain one
               "kind": "depth" if "depth not given" in before[0] else "pick"}
        try:
            rec.update(before_after(row, depth_not_given()))
        except TwinserveError as err:
            print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} not simulated: {str(err)[:80]}", flush=True)
            continue
        out.append(rec)
        print(f"{rec['id'][:75]:75s} c{rec['conc']:<5d} d{rec['depth']} {ab_figures(rec)}", flush=True)
    d = records_frame(out, args.out)
    if len(d):
        for key, g in d.groupby(["kind", "system", "precision", "isl_osl"]):
            print(f"{' '.join(key):34s} {len(g):3d} {ab_summary(g)}")
        for key, g in d.groupby("kind"):
            print(f"{key:34s} {len(g):3d} {ab_summary(g)}")
        print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
