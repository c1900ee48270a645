"""DeepSeek-R1 B200 FP4 TensorRT-LLM aggregated development rows whose scripts set `moe_config: backend: CUTLASS`
(attention DP; benchmarks/dsr1_fp4_b200_trt.sh @6320e9b from 256 clients at 1k prompts, above 32 at 8k): their NVFP4
experts priced on aic's CUTLASS rows at every gathered count (aic_nvfp4_moe_kernel 'cutlass', B200's from aic's GB200
table) against aic's own choice (trtllm-gen up to 128 gathered tokens, B200's CUTLASS rows above), in one process;
prints each measurement's TPOT / TTFT (measured, before, after), then the summaries by layout
(docs/validate-accuracy.md, nvfp4moe). Development rows only (issue 49).

    python experiments/nvfp4_cutlass_rows.py [--max-clients N] [--all] [--own-table] [--out CSV]

--own-table prices B200's CUTLASS experts from B200's own aic rows (NVFP4_CUTLASS_TABLE_SYSTEM emptied) instead.
"""

from __future__ import annotations

import argparse
from unittest import mock

from twinserve.sim import validate_rows
# this folder (experiments/row_ab.py)
from row_ab import ab_rows, ab_summary, dev_rows

_APPLY = validate_rows.apply_kernels


def _aic_choice(recipe, engine, cost_model):
    """The recipe's kernels with the NVFP4 experts left to aic's own choice (main before nvfp4moe)."""
    _APPLY(recipe, engine, cost_model)
    engine.aic_nvfp4_moe_kernel = "default"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-clients", type=int, default=10**9, help="only rows of at most this many clients")
    ap.add_argument("--all", action="store_true", help="every B200 FP4 aggregated row, not only the CUTLASS ones")
    ap.add_argument("--own-table", action="store_true", help="B200's CUTLASS rows from B200's own aic table")
    ap.add_argument("--out", default="", help="write the per-measurement figures to this CSV")
    args = ap.parse_args()
    from twinserve.sim.validate_recipes import row_recipe
    df = dev_rows("trtllm", "DeepSeek-R1", 0, args.max_clients, mode="agg", system="b200_sxm", precision="fp4")
    if not args.all:
        df = df[[row_recipe(r).nvfp4_moe_kernel == "cutlass" for _, r in df.iterrows()]]
    from twinserve.backends.sim.aic import trtgen
    with mock.patch.dict(trtgen.NVFP4_CUTLASS_TABLE_SYSTEM, clear=args.own_table):
        d = ab_rows(df, mock.patch.object(validate_rows, "apply_kernels", _aic_choice), out=args.out)
    if len(d):
        lay = {r["id"]: f"tp{int(r['tp_size'])} adp{int(r['attention_dp_size'] or 1)} ep{int(r['moe_ep_size'] or 1)}"
               for _, r in df.iterrows()}
        d["layout"] = d["id"].map(lay)
        for par, g in d.groupby("layout"):
            print(f"{par} ({len(g)}): {ab_summary(g)}")
        print(f"all ({len(d)}): {ab_summary(d)}")


if __name__ == "__main__":
    main()
