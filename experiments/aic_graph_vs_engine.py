"""Our measured-backend step (backends/sim/aic) against aiconfigurator-core's compiled engine, op by op.

    python experiments/aic_graph_vs_engine.py deepseek-ai/DeepSeek-R1 --hw H200 --backend vllm --tp 8 \
        --quant fp8 --kv fp8 --rows 32 --isl 1024 --osl 1024 [--dp 1] [--ep 1] [--per-op]

Prints aic's decode step (`EngineHandle.decode_step_per_op`, its own model class for the model's
architecture) beside ours at the same shape (decode rows at ISL + OSL/2 of context), and one-request
prefill steps (`predict_prefill_latency`) beside ours. No measured rows are read: this compares two
prices of the same kernels (docs/validate-accuracy.md, "against aic's own graph").
"""

from __future__ import annotations

import argparse
import logging
import warnings


def main() -> None:
    """Compare one shape's decode and prefill prices."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_path", help="a model path aiconfigurator-core ships a config for")
    ap.add_argument("--hw", default="H200", help="twinserve hardware name")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "sglang", "trtllm"],
                    help="aiconfigurator database and engine model to compare with")
    ap.add_argument("--tp", type=int, default=1, help="attention tensor parallel size")
    ap.add_argument("--dp", type=int, default=1, help="attention data parallel")
    ap.add_argument("--ep", type=int, default=1, help="expert parallel")
    ap.add_argument("--quant", default="none", help="none | fp8 | int4 | nvfp4 | mxfp4")
    ap.add_argument("--kv", default="auto", help="auto | fp8")
    ap.add_argument("--rows", type=int, default=32, help="decode rows per attention rank")
    ap.add_argument("--isl", type=int, default=1024,
                    help="input length (tokens): the decode step's context is ISL + OSL / 2")
    ap.add_argument("--osl", type=int, default=1024,
                    help="output length (tokens): the decode step's context is ISL + OSL / 2")
    ap.add_argument("--per-op", action="store_true", help="list each op's price")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from aiconfigurator_core.sdk.engine import EngineHandle

    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.aic.mapping import fp8_gemm_mode, held_mxfp4_mode, quant_modes, static_fp8_checkpoint
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.catalog import get_hardware
    from twinserve.backends.sim.parallel import Parallelism
    from twinserve.backends.sim.precision import Precision

    m = resolve_row_model(args.model_path).with_precision(Precision("bfloat16", args.quant, args.kv))
    c = AicCostModel(m, get_hardware(args.hw), backend=args.backend,
                     parallel=Parallelism(args.tp, args.dp, args.ep, 1))
    modes = held_mxfp4_mode(c.database, fp8_gemm_mode(c.database, quant_modes(m.precision, m.is_moe, c.system,
                                                                           args.backend, m.experts_only_quantization),
                                                      static_fp8_checkpoint(m.name, m.is_moe)))  # as priced
    modes = {k: v.name for k, v in modes.items()}
    engine = EngineHandle.compile(
        args.model_path, c.system, args.backend, backend_version=c.version, tp_size=args.tp,
        attention_dp_size=args.dp, moe_tp_size=args.tp * args.dp // args.ep if m.is_moe else None,
        moe_ep_size=args.ep if m.is_moe else None, gemm_quant_mode=modes["gemm"],
        moe_quant_mode=modes.get("moe"), kvcache_quant_mode=modes["generation_attention"],
        fmha_quant_mode=modes["fmha"])
    b, ctx = args.rows, args.isl + args.osl // 2
    aic_ops = engine.decode_step_per_op(b, args.isl, args.osl)
    aic_ms = sum(r[1] for r in aic_ops)
    ours_ms = c.step_time(0, 0, 0, 0.0, b * args.dp, b * args.dp * ctx) * 1e3
    print(f"{c.describe()}, {m.name} TP {args.tp} DP {args.dp} EP {args.ep} {m.precision.label()}")
    print(f"decode, {b} rows a rank at {ctx} tokens: aic {aic_ms:.3f} ms, ours {ours_ms:.3f} ms "
          f"({ours_ms / aic_ms:.3f})")
    if args.per_op:
        ev, g = c._eval, c.graph
        kv = -(-(ctx + 1) // 16) * 16
        ours = [r for js, kw in ((g.decode_tokens, dict(is_context=True, batch_size=1, s=1, x=b)),
                                 (g.logits, dict(is_context=True, batch_size=1, s=1, x=b)),
                                 (g.generation_attn, dict(is_context=False, batch_size=b, s=kv)))
                for r in ev(js, **kw)]
        for who, rows in (("aic", aic_ops), ("ours", ours)):
            for r in rows:
                print(f"  {who:<4} {r[0]:<36} {r[1]:9.4f} ms")
    for isl in (1024, 4096, 8192):
        try:
            a = engine.predict_prefill_latency(1, isl)
        except Exception as err:  # aic's tables lack this prefill shape: say so and go on
            print(f"prefill {isl}: aic has no price ({str(err)[:120]})")
            continue
        o = c.step_time(isl, 1, 0, isl * isl / 2, 0, 0) * 1e3
        print(f"prefill, one request of {isl}: aic {a:.2f} ms, ours {o:.2f} ms ({o / a:.3f})")


if __name__ == "__main__":
    main()
