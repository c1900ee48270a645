"""`simulate validate` under two what-ifs, for before/after figures (docs/validate-accuracy.md).

--mixed: every engine's rows with batch_policy "mixed" and no prefill cap (the code before SGLang's
lock step was modelled: sim/validate_engines.py). --spread-gap-lengths: the gap-analysis rows
(harness aic_gap) draw lengths on [0.8 L, L] as InferenceX's do (the protocol before Dec 4; they
now run at exact ISL/OSL). --aic-host-profile: `--cost-model aic` rows priced as before Dec 5 (vLLM
and SGLang with the engine profile's host time, no kernel scale). --aic-kernel-only: `--cost-model
aic` rows without host time or kernel scale (backends/sim/aic/cost_model.SERVING_TERMS off).
--disagg-ttft-prefill: disaggregated rows count TTFT at the prefill replica's first token (before Dec 5
midday; they now count it at the decode replica's first step, sim/disagg.py). --no-recipes: every row
with its engine's defaults, no InferenceX recipe flags (before 2026-12-05 10:00; sim/validate_recipes.py).
Every other argument goes to `simulate validate`:

    python experiments/validate_variants.py --mixed -- --silicon --rows dev --backend sglang --out before
"""

from __future__ import annotations

import argparse
import sys

from twinserve.sim import validate_protocol as vp
from twinserve.sim import validate_rows
from twinserve.sim.cli import main as simulate_main


def main(argv: list[str] | None = None) -> int:
    """Apply the what-ifs, then run `simulate validate` with the remaining arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mixed", action="store_true", help="every engine mixes prefill and decode (no lock step)")
    p.add_argument("--spread-gap-lengths", action="store_true",
                   help="gap-analysis rows with lengths on [0.8 L, L] (the protocol before Dec 4)")
    p.add_argument("--aic-kernel-only", action="store_true",
                   help="aic rows priced by kernel time only (no serving terms; before Dec 4 evening)")
    p.add_argument("--aic-host-profile", action="store_true",
                   help="aic rows as before 2026-12-05: vLLM and SGLang pay the cuda_graph_python profile's "
                        "host time, no kernel scale; TensorRT-LLM kernels only")
    p.add_argument("--disagg-ttft-prefill", action="store_true",
                   help="disaggregated rows' TTFT at the prefill replica's first token (before 2026-12-05 midday)")
    p.add_argument("--no-recipes", action="store_true",
                   help="no InferenceX recipe flags: every row with its engine's defaults (before 2026-12-05 10:00)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of `simulate validate` (after --)")
    args = p.parse_args(argv)
    if args.mixed:
        validate_rows._engine_batching = lambda backend, hw: ("mixed", 0)
    if args.spread_gap_lengths:
        design = validate_rows.run_design

        def run_design(row, window=vp.DEFAULT_WINDOW):
            d = design(row, window)
            return vp.BENCHMARK if d is vp.GAP_BENCHMARK else d

        validate_rows.run_design = run_design  # the study's lengths; the counts are the same
    if args.aic_kernel_only:
        from twinserve.backends.sim.aic.cost_model import ServingTerms
        validate_rows.aic_serving_terms = lambda backend: ServingTerms()
    if args.aic_host_profile:
        from twinserve.backends.sim.aic.cost_model import ServingTerms
        from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
        prof = ENGINE_PROFILES["cuda_graph_python"]
        old = {b: ServingTerms(step_s=prof.step_overhead_s, per_seq_s=prof.per_seq_overhead_s)
               for b in ("vllm", "sglang")}
        validate_rows.aic_serving_terms = lambda backend: old.get(backend, ServingTerms())
    if args.disagg_ttft_prefill:
        plan = validate_rows.row_plan

        def row_plan(*a, **kw):
            out = plan(*a, **kw)
            out.cfg.cluster.disagg_first_token = "prefill"
            return out

        validate_rows.row_plan = row_plan  # row_study reads the module's row_plan at call time
    if args.no_recipes:
        from twinserve.sim.validate_recipes import DEFAULT
        validate_rows.row_recipe = lambda row: DEFAULT  # row_plan reads the module's name at call time
    rest = [a for a in args.rest if a != "--"]
    return simulate_main(["validate", *rest])


if __name__ == "__main__":
    sys.exit(main())
