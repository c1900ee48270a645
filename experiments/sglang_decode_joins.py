"""SGLang disaggregated DeepSeek-R1 development rows: the decode replicas taking their transferred requests into
their decode steps (sim/validate_engines.py SGLANG_DECODE_JOINS "mixed", SGLANG_DECODE_JOIN_ROW "decode") against
a step of their own that no rank decodes in (SGLang's prefill_first, the joiner's token a one-token prefill row: main
before sglcap), in one process; prints each measurement's TPOT / TTFT (measured, before, after) and CPU seconds, then
the error summaries (docs/validate-accuracy.md, sglcap). Development rows only (issue 49).

    python experiments/sglang_decode_joins.py [--system gb200] [--min-clients N] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.sim import validate_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows


def _rows(system: str, lo: int, hi: int) -> pd.DataFrame:
    return dev_rows("sglang", "DeepSeek-R1", lo, hi, mode="disagg", system=system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="", help="only this system's rows (gb200, gb300, b200_sxm, ...)")
    ap.add_argument("--min-clients", type=int, default=1, help="only rows of at least this many clients")
    ap.add_argument("--max-clients", type=int, default=10**9, help="only rows of at most this many clients")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    old = (mock.patch.object(validate_rows, "SGLANG_DECODE_JOINS", "prefill_first"),
           mock.patch.object(validate_rows, "SGLANG_DECODE_JOIN_ROW", "prefill"))
    d = ab_rows(_rows(args.system, args.min_clients, args.max_clients), *old, out=args.out)
    if len(d):
        print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
