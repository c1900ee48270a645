"""DeepSeek-R1 B200 (or H200) TensorRT-LLM aggregated development rows of image 1.1.0rc2.post2: the MTP
configurations' scripts where the row's layout and count, or its measurement date, tell it ran them
(sim/validate_recipes.py `fp4_b200_rc2_runs_mtp`, `fp8_b200_rc2_runs_mtp`, `fp8_h200_rc2_runs_mtp`, RC2_MTP_SWEEPS)
against the reading before (B200 FP4: told by layout only; B200 FP8: the plain recipe `_dsr1_trt` for every row;
H200 FP8: `_dsr1_trt` up to 64 clients, MTP_IMAGES' rule past 64), in one process; prints each measurement's
TPOT / TTFT (measured, before, after), then the error summaries (docs/validate-accuracy.md, trtb200agg and
h200rc2). Development rows only (issue 49).

    python experiments/b200_rc2_mtp_rows.py [--system b200_sxm|h200_sxm] [--precision fp4|fp8] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

from twinserve.sim import validate_recipes
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows

# The LAYOUT_IMAGES entries each system's "before" leaves out (B200 FP4's layout rule predates the day rule).
_NEW = {"b200_sxm": ("fp8",), "h200_sxm": ("fp8",)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="", choices=["", "fp4", "fp8"], help="one precision (default: both)")
    ap.add_argument("--system", default="b200_sxm", choices=sorted(_NEW), help="the GPU (default b200_sxm)")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    rows = dev_rows("trtllm", "DeepSeek-R1", mode="agg", system=args.system, precision=args.precision,
                    backend_version="1.1.0rc2.post2")
    new = {("trtllm", "DeepSeek-R1", args.system, p, "1.1.0rc2.post2") for p in _NEW[args.system]}
    before = {k: v for k, v in validate_recipes.LAYOUT_IMAGES.items() if k not in new}
    d = ab_rows(rows, mock.patch.dict(validate_recipes.LAYOUT_IMAGES, before, clear=True),
                mock.patch.object(validate_recipes, "RC2_MTP_SWEEPS", ()), out=args.out)
    if len(d):
        print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
