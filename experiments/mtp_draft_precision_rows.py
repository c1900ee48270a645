"""FP4 DeepSeek-R1 development rows that draft with the MTP layer: the draft priced at NVFP4 (as main had it) against
16-bit (catalog.NVFP4_16BIT_MTP: NVIDIA's NVFP4 checkpoints keep the MTP layer out of quantization), in one
process; prints each measurement's TPOT / TTFT (measured, before, after), then the error summaries per backend and
system (docs/validate-accuracy.md, mtpdraft). Development rows only (issue 49).

    python experiments/mtp_draft_precision_rows.py [--backend trtllm|sglang] [--system S] [--max-clients N] [--out CSV]
"""

from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd

from twinserve.backends.sim import catalog
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows


def drafts_with_mtp(row: pd.Series) -> bool:
    """True where the row's study speculates with the model's own MTP layer."""
    from twinserve.core.errors import TwinserveError
    from twinserve.sim.specs import MTP_DRAFT
    from twinserve.sim.validate_rows import row_study
    try:
        spec = row_study(row, "aic").speculative
    except TwinserveError:
        return False
    return spec.enabled and spec.method == "draft_model" and spec.draft_model == MTP_DRAFT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="", help="trtllm or sglang ('' = both)")
    ap.add_argument("--system", default="", help="one system ('' = every one)")
    ap.add_argument("--max-clients", type=float, default=float("inf"),
                    help="only rows of at most this many clients (default: every row)")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    frames = []
    for backend in [args.backend] if args.backend else ["trtllm", "sglang"]:
        df = dev_rows(backend, "DeepSeek-R1", 0, args.max_clients, precision="fp4", system=args.system)
        df = df[[drafts_with_mtp(r) for _, r in df.iterrows()]]
        print(f"{backend}: {len(df)} FP4 rows draft with the MTP layer", flush=True)
        d = ab_rows(df, mock.patch.object(catalog, "NVFP4_16BIT_MTP", frozenset()))
        if len(d):
            d["backend"] = backend
            d["system"] = d["id"].map(df.set_index("id")["system"])
            frames.append(d)
    if not frames:
        return
    d = pd.concat(frames, ignore_index=True)
    if args.out:
        d.to_csv(args.out, index=False)
    for (backend, system), g in d.groupby(["backend", "system"]):
        print(f"{backend} {system} ({len(g)} measurements): {ab_summary(g)}")
    print(f"all ({len(d)} measurements): {ab_summary(d)}")


if __name__ == "__main__":
    main()
