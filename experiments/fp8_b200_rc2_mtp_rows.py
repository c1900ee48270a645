"""DeepSeek-R1 FP8 B200 TensorRT-LLM aggregated development rows of image 1.1.0rc2.post2: the MTP configuration's
script where the row's layout, count and measurement date tell it ran (sim/validate_recipes.py
`fp8_b200_rc2_runs_mtp`) against the plain recipe main gave every such row (`_dsr1_trt`), in one process; prints each
measurement's TPOT / TTFT (measured, before, after), then the error summaries by layout (docs/validate-accuracy.md,
trtb200agg). Development rows only (issue 49).

    python experiments/fp8_b200_rc2_mtp_rows.py [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

from twinserve.sim import validate_recipes
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows

_KEY = ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8", "1.1.0rc2.post2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    rows = dev_rows("trtllm", "DeepSeek-R1", mode="agg", system="b200_sxm", precision="fp8",
                    backend_version="1.1.0rc2.post2")
    before = {k: v for k, v in validate_recipes.LAYOUT_IMAGES.items() if k != _KEY}
    d = ab_rows(rows, mock.patch.dict(validate_recipes.LAYOUT_IMAGES, before, clear=True), out=args.out)
    if not len(d):
        return
    d["layout"] = ["adp" if "_tp8_ep8_" in i and r.get("attention_dp_size", 1) else "" for i, r in
                   zip(d.id, [{}] * len(d))]
    print(f"{len(d)} measurements: {ab_summary(d)}")


if __name__ == "__main__":
    main()
