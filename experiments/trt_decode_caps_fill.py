"""DeepSeek-R1 TensorRT-LLM disaggregated development rows whose decode workers' `max_batch_size` this branch read
from the recipes (sim/validate_inferencex.py _DECODE_BATCH: B200 FP4, B200 FP8 8k/1k, B300, H100, GB200 entries that
main 8ea3e44 left at 0): capped at the recipes' batch against uncapped (main's table), in one process; prints each
measurement's TPOT / TTFT (measured, before, after), then the error summaries per system (docs/validate-accuracy.md,
"caps"). Only the rows whose entry was untranscribed on main and whose slots are fewer than its clients are run (the
others predict the same float: a cap at or above the clients binds nothing). Development rows only (issue 49).

    python experiments/trt_decode_caps_fill.py [--system S] [--max-clients N] [--list] [--out CSV]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from unittest import mock

import pandas as pd

from twinserve.sim import validate_inferencex as vi
from twinserve.sim.validate_rows import _matrix_workers
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows

# main 8ea3e44's _DECODE_BATCH for the keys this branch filled: 0 = untranscribed (no cap simulated).
MAIN = {
    ("trtllm", "b200_sxm", "fp4", 1024, 1024): (0, 0, 1, 32, 0, 0, 0, 0, 0, 1, 32, 0),
    ("trtllm", "b200_sxm", "fp4", 8192, 1024): (8, 16, 1, 8, 0, 0, 0, 1, 8, 0, 0, 0, 0),
    ("trtllm", "b200_sxm", "fp8", 8192, 1024): (8, 32, 8, 16, 8, 0, 0, 1, 32, 32, 16, 128, 64, 256, 0),
    ("trtllm", "b300_sxm", "fp4", 1024, 1024): (0, 0, 1, 32, 0, 0, 0, 0, 1, 4, 64, 0, 0, 0),
    ("trtllm", "b300_sxm", "fp8", 1024, 1024): (1, 16, 0, 0, 0, 0, 0, 0, 0, 64, 64, 0, 0),
    ("trtllm", "b300_sxm", "fp4", 8192, 1024): (0, 8, 1, 4, 16, 0, 32, 16, 1, 2, 0, 0, 0),
    ("trtllm", "b300_sxm", "fp8", 8192, 1024): (16, 1, 4, 8, 16, 0, 16, 2, 32, 0, 64, 0, 0),
    ("trtllm", "h100_sxm", "fp8", 1024, 1024): ((1, 2, 8, 16, 32), 4, 0, 0, 0, (1, 2, 8, 16), (4, 8, 16, 32), 0),
    ("trtllm", "h100_sxm", "fp8", 8192, 1024): ((1, 2, 8), 4, 8, (1, 2, 8), 64, 0),
    ("trtllm", "gb200", "fp4", 1024, 1024): (4, 8, 0, 0, 0, 0, 0, 0, 32, 1, 0, 0),
    ("trtllm", "gb200", "fp4", 1024, 8192): (4, 1, 4, 0, 0, 0, 0, 1, 4, 8, 0, 0, 0, 0),
    ("trtllm", "gb200", "fp4", 8192, 1024): (8, 4, 0, 0, 0, (16, 16, 16, 1), 0, 0, 0, 0),
    ("trtllm", "gb200", "fp8", 1024, 1024): (0, 0, 0, (8, 4, 2), 0, 0, (32, 8), (8, 1)),
    ("trtllm", "gb200", "fp8", 1024, 8192): (0, (16, 2), 2, 0, 0, (8, 1)),
    ("trtllm", "gb200", "fp8", 8192, 1024): (0, 0, 0, 0, 2, (4, 2), 0, 0, 0, 0, (16, 4, 1)),
}


def _main_table() -> dict:
    """TABLE's entries for MAIN's keys as main had them: the filled entries' batches emptied again."""
    return {key: tuple(e if b else replace(e, batch=()) for e, b in zip(vi.TABLE[key], old))
            for key, old in MAIN.items()}


def moved(row: pd.Series) -> bool:
    """Whether the row's decode cap is one this branch read (main: none) and binds (fewer slots than clients)."""
    ix = _matrix_workers(row)
    if ix is None or not ix.decode_slots() or ix.decode_slots() * ix.decode.count >= int(row["concurrency"]):
        return False
    with mock.patch.dict(vi.TABLE, _main_table()):
        old = _matrix_workers(row)
    return old is not None and not old.decode_slots()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="", help="only this system's rows (gb200, b200_sxm, b300_sxm, h100_sxm)")
    ap.add_argument("--min-clients", type=int, default=0, help="only rows of at least this many clients")
    ap.add_argument("--max-clients", type=float, default=float("inf"),
                    help="only rows of at most this many clients (default: every row)")
    ap.add_argument("--list", action="store_true", help="list the rows that move, simulate nothing")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    df = dev_rows("trtllm", "DeepSeek-R1", args.min_clients, args.max_clients, mode="disagg", system=args.system)
    df = df[[moved(r) for _, r in df.iterrows()]]
    if args.list:
        print(df[["id", "system", "precision", "isl", "osl", "concurrency"]].to_string())
        return
    d = ab_rows(df, mock.patch.dict(vi.TABLE, _main_table()), out=args.out)
    if len(d):
        sys_of = df.set_index("id")["system"]
        d["system"] = d["id"].map(sys_of)
        for s, g in d.groupby("system"):
            print(f"{s}: {len(g)} measurements: {ab_summary(g)}")
        print(f"all: {len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
