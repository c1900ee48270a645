"""B200 FP8 1k/1k TensorRT-LLM disaggregated development rows past 256 clients: their decode workers capped at the
recipes' max_batch_size (sim/validate_inferencex.py _DECODE_BATCH) against uncapped (as main had them before), in
one process; prints each measurement's TPOT / TTFT (measured, before, after), then the error summaries
(docs/validate-accuracy.md, trtdttft). Development rows only (issue 49).

    python experiments/b200_fp8_decode_caps.py [--min-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows

_MATRIX = validate_rows._matrix_workers


def _uncapped(row, *args):
    """The row's workers with no decode cap past 256 clients (main before trtdttft)."""
    ix = _MATRIX(row, *args)
    return None if ix is None or int(row["concurrency"]) <= 256 else replace(ix, decode_batch=0)


def _rows(lo: int) -> pd.DataFrame:
    return dev_rows("trtllm", "DeepSeek-R1", lo, mode="disagg", system="b200_sxm", precision="fp8", isl=1024, osl=1024)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-clients", type=int, default=257, help="only rows of at least this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    d = ab_rows(_rows(args.min_clients), mock.patch.object(validate_rows, "_matrix_workers", _uncapped), out=args.out)
    if len(d):
        print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
