"""One step's operations for a ModelSpec, as aiconfigurator-core op objects, grouped by how they are queried.

The layer is aic's own (sdk/models/llama.py and moe.py lay it out the same way): per layer two
add-norms, the QKV and output GEMMs, the dense MLP (gate/up, activation, down) or aic's MoE block
(router, experts, dispatch), two all-reduces under TP; the embedding (and its all-reduce) once; the
LM head over one row per sequence. Attention is split into full and sliding-window layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinserve.backends.sim.catalog import ModelSpec


@dataclass(slots=True)
class StepGraph:
    """aic op lists (as the engine's JSON) of one model at one TP, by query shape."""

    tokens: str            # linear layers, norms, MoE, all-reduces: x = the step's tokens
    logits: str            # the LM head: x = the step's sequences
    context_attn: list[tuple[str, int]]     # (ops JSON, window) per attention kind
    generation_attn: list[tuple[str, int]]
    names: tuple[str, ...]  # every op's name, for reports


def _moe_ops(model: ModelSpec, tp: int, ep: int, modes: dict[str, Any], backend: str, phase: str) -> list:
    """aic's MoE block (router GEMM, shared experts, dispatch + experts + combine) for one phase."""
    from aiconfigurator_core.sdk.config import ModelConfig
    from aiconfigurator_core.sdk.models.blocks.moe import MoEBlockShape, build_moe_block_ops
    from aiconfigurator_core.sdk.models.helpers import power_law_distribution
    cfg = ModelConfig(tp_size=tp, moe_tp_size=tp // ep, moe_ep_size=ep, gemm_quant_mode=modes["gemm"],
                      moe_quant_mode=modes["moe"])
    shape = MoEBlockShape(hidden_size=model.hidden_size, moe_inter_size=model.moe_intermediate_size,
                          topk=model.num_experts_per_tok, num_experts=model.num_experts,
                          num_shared_experts=model.num_shared_experts, num_moe_layers=model.num_layers)
    # aic's MOEModel routes tokens by a power law of exponent 1.2 (models/moe.py).
    dist = power_law_distribution(cfg.workload_distribution, 1.2)
    return build_moe_block_ops(phase, shape, cfg, modes["moe"], dist, scale_factor=model.num_layers,
                               backend_name=backend, inference_phase=phase)


def build_graph(model: ModelSpec, tp: int, modes: dict[str, Any], backend: str, database: Any,
                ep: int = 1) -> StepGraph:
    """The op lists of one step of `model` on one GPU of a TP group (expert parallel `ep` within it)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.operations.attention import resolved_lane_order_for_op
    m = model
    h, d, layers = m.hidden_size, m.head_dim, m.num_layers
    heads = m.num_heads // tp
    kv_heads = m.kv_heads_per_gpu(tp)
    gq, kvq, fmha = modes["gemm"], modes["generation_attention"], modes["fmha"]
    token_ops = [
        ops.Embedding("embedding", 1, m.vocab_size // tp, h, 0.3),
        ops.ElementWise("add_norm_1", layers, 2 * h, 2 * h, 0.8),
        ops.GEMM("qkv_gemm", layers, heads * d + 2 * kv_heads * d, h, gq),
        ops.GEMM("proj_gemm", layers, h, heads * d, gq, low_precision_input=True),
        ops.ElementWise("add_norm_2", layers, 2 * h, 2 * h, 0.8),
    ]
    if m.is_moe:
        token_ops += _moe_ops(m, tp, ep, modes, backend, "context")
    else:
        inter = m.intermediate_size // tp
        token_ops += [
            ops.GEMM("gate_ffn1_gemm", layers, 2 * inter, h, gq),
            ops.ElementWise("act_gate", layers, 2 * inter, inter, 0.8),
            ops.GEMM("ffn2_gemm", layers, h, inter, gq, low_precision_input=True),
        ]
    token_ops += [ops.CustomAllReduce("embedding_ar", 1, h, tp), ops.CustomAllReduce("ar_1", layers, h, tp),
                  ops.CustomAllReduce("ar_2", layers, h, tp)]
    logits = ops.GEMM("logits_gemm", 1, m.vocab_size // tp, h, common.GEMMQuantMode.bfloat16)
    sliding = m.num_sliding_layers if m.sliding_window else 0
    kinds = [(layers - sliding, 0), (sliding, m.sliding_window)]
    # The attention kernel lanes (FlashAttention 3, FlashInfer, ...) the backend version runs, as
    # aic's compile_engine resolves them against the database.
    ctx_lanes = resolved_lane_order_for_op(database, "_context_attention_data", None)
    gen_lanes = resolved_lane_order_for_op(database, "_generation_attention_data", None)
    ctx, gen = [], []
    for n, window in kinds:
        if not n:
            continue
        c = ops.ContextAttention("context_attention", n, heads, kv_heads, kvq, fmha, window_size=window,
                                 head_size=d)
        c._lane_order = ctx_lanes
        g = ops.GenerationAttention("generation_attention", n, heads, kv_heads, kvq, window_size=window,
                                    head_size=d)
        g._lane_order = gen_lanes
        ctx.append((build_ops_json([c]), window))
        gen.append((build_ops_json([g]), window))
    names = tuple(op._name if hasattr(op, "_name") else str(op) for op in token_ops) + ("logits_gemm",)
    return StepGraph(build_ops_json(token_ops), build_ops_json([logits]), ctx, gen, names)
