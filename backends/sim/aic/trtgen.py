"""TensorRT-LLM's TRTLLM MoE backend (trtllm-gen kernels) for FP8 block-scaled and NVFP4 experts, priced where
aic's TensorRT-LLM table times another kernel.

Why it matters: InferenceX's non-MTP DeepSeek-R1 FP8 B200 TensorRT-LLM script writes `moe_config: backend:
TRTLLM` below 256 clients (SemiAnalysisAI/InferenceX benchmarks/dsr1_fp8_b200_trt.sh @0a919c5 and @4a98d80:
`MOE_BACKEND="TRTLLM"`, DEEPGEMM only at 1k/8k with 256+ clients), and nvidia-master.yaml @0a919c5 runs that
configuration (dsr1-fp8-b200-trt) from `release:1.2.0rc6.post2`. The MTP script of `release:1.2.0rc6.post3`
(InferenceX PR #632; benchmarks/single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788) writes TRTLLM too, DEEPGEMM only
with attention DP (sim/validate_recipes.py `_dsr1_fp8_b200_trt_mtp_rc6`). aic's TensorRT-LLM B200 tables (1.3.0rc20
moe_perf) time FP8 block-scaled experts on DeepGEMM only (kernel_source `deepgemm`, the one source of its
`fp8_block` rows), which at decode sizes is about twice trtllm-gen's time.

TensorRT-LLM's TRTLLM backend runs FP8 block-scaled experts on trtllm-gen: `TRTLLMGenFusedMoE` calls
`torch.ops.trtllm.fp8_block_scale_moe_runner` when the checkpoint has DeepSeek FP8 block scales
(NVIDIA/TensorRT-LLM tensorrt_llm/_torch/modules/fused_moe/fused_moe_trtllm_gen.py, a stored copy whose commit the
library's index does not name: "TRTLLMGenFusedMoE only supports fp8_block_scaling, nvfp4, ..."); the deployment
guide's support matrix lists DEEPGEMM only for FP8 on B200, but the code and the scripts above run this.

The same kernels are measured in aic's SGLang 0.5.14 B200 table: kernel_source `sglang_flashinfer_trtllm_moe`,
FlashInfer's `trtllm_fp8_block_scale_moe`, which wraps TensorRT-LLM's trtllm-gen block-scale MoE runner. Check
of that kinship on the precision both tables hold for both engines: DeepSeek-R1's NVFP4 experts at MoE TP 8,
16 / 32 tokens, 0.063 / 0.080 ms a layer in SGLang's flashinfer-trtllm rows and 0.060 / 0.080 ms in
TensorRT-LLM's own trtllm-gen (`moe_torch_flow_min_latency`) rows. For the FP8 block-scaled experts, aic's
SGLang table answers the model's own MoE op (same shape, layout, token distribution) from those rows only
(DeepSeek-R1's shape holds no other kernel at fp8_block in it).

The transfer: per MoE layer, the step's MoE op is priced on the SGLang table instead of the TensorRT-LLM one;
the difference, times the MoE layers, is added to the step (negative: faster). In aic's generation graph the
routed experts sit in an Overlap with the shared expert; the difference is taken on the routed branch, which
is the longer one at every shape of these rows (the shared expert is one 2,048-wide expert against eight).
Nothing is fitted.

NVFP4 experts. aic's TensorRT-LLM table times DeepSeek-R1's NVFP4 experts on two kernels at every token count:
`moe_torch_flow_min_latency`, which aic's collector times with `moe_backend = "trtllm"` (TRTLLMGenFusedMoE, the
comment there: "trtllm gen"), and `moe_torch_flow_cutlass` (the CUTLASS backend; ai-dynamo/aiconfigurator
collector/trtllm/collect_moe.py @006afd7, `run_moe_torch`). aic's engine answers a gated NVFP4 query from the
trtllm-gen rows up to 128 tokens after attention-DP gathering and from the CUTLASS rows above (its
`moe_kernel_source` note: "moe_torch_flow_min_latency requires gated NVFP4 and at most 128 tokens after
attention-DP gathering"): CUTLASS is TensorRT-LLM's default MoE backend. A launch that sets `moe_config: backend:
TRTLLM` runs trtllm-gen at every count (SemiAnalysisAI/InferenceX benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2:
TRTLLM without attention DP, CUTLASS with it); above 128 tokens trtllm-gen's rows are 1.5-2.5x faster than
CUTLASS's (B200, MoE TP 8, 256 / 1,024 tokens: 0.158 / 0.191 against 0.294 / 0.397 ms a layer). The transfer
here reads the same table's trtllm-gen rows above 128 gathered tokens (linear in the token count between its
points, as aic interpolates), and leaves aic's own answer at or below (where it already is trtllm-gen's).

CUTLASS NVFP4 (`aic_nvfp4_moe_kernel` 'cutlass'). aic's two NVFP4 kernel_sources are two MoE classes: its collector
(collect_moe.py @006afd7 and @8545222, `run_moe_torch`) times `moe_torch_flow_min_latency` with
`moe_backend = "trtllm"` (TRTLLMGenFusedMoE, DeepseekV3Gate routing, `do_finalize=False`) and
`moe_torch_flow_cutlass` with "cutlass" (CutlassFusedMoE, RenormalizeMoeRoutingMethod, finalize included); both
from 16-bit activations (the NVFP4 input quantize timed), after an autotune pass, CUDA-graphed. TensorRT-LLM's
CUTLASS backend has no small-batch switch to trtllm-gen at the rows' versions: `get_moe_cls` maps CUTLASS to
CutlassFusedMoE alone (tensorrt_llm/_torch/modules/fused_moe/create_moe.py @01f8de5) and CutlassFusedMoE.run_moe
passes `min_latency_mode=False` to `torch.ops.trtllm.fused_moe` (fused_moe_cutlass.py, a stored copy of the
NVLinkOneSided era whose commit the library's index does not name); DeepSeek-V3's CUTLASS min-latency mode
(`_enable_min_latency_mode`: NVFP4, CUTLASS, at most 128 tokens) left modeling_deepseekv3.py with "Refactor
CutlassFusedMoE" (NVIDIA/TensorRT-LLM b558232ce1, PR #5344, 2025-06-19), before 1.0. So a launch that sets CUTLASS
runs CUTLASS at every count, and this transfer prices every gathered count on CUTLASS rows. B200's are read from
aic's GB200 table (NVFP4_CUTLASS_TABLE_SYSTEM: its note gives why); elsewhere the system's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# 'triton': vLLM's Triton fused-MoE on FP8 block-scaled experts (backends/sim/aic/vllm_triton.py).
FP8_MOE_KERNELS = ("default", "trtllm", "triton")
# aic's TensorRT-LLM kernel_source of its trtllm-gen NVFP4 MoE rows, and the gathered token count up to which its
# engine already answers from them (collector/trtllm/collect_moe.py @006afd7; the module docstring).
NVFP4_TRTGEN_SOURCE = "moe_torch_flow_min_latency"
NVFP4_TRTGEN_DEFAULT_MAX_TOKENS = 128
# aic's database holding FlashInfer's trtllm-gen FP8 block-scale MoE rows (B200: moe/sglang/0.5.14).
TRTGEN_DATABASE = ("sglang", "0.5.14")
# TensorRT-LLM's CUTLASS MoE backend on NVFP4 experts (`aic_nvfp4_moe_kernel` 'cutlass'): aic's kernel_source of its
# CutlassFusedMoE rows, and the system whose TensorRT-LLM table (same aic version) prices them where this one's is
# not used. B200 -> GB200: the same Blackwell GPU, and the two 1.3.0rc20 tables agree everywhere else (median
# B200 / GB200 1.03-1.07 over every kernel_source and dtype they share, the NVFP4 trtllm-gen rows included), but
# B200's CUTLASS NVFP4 rows at DeepSeek-R1's shape do not scale with EP (MoE TP 1, 128 tokens, ms a layer: EP 2 /
# 4 / 8 = 0.449 / 0.454 / 0.272 against GB200's 0.435 / 0.239 / 0.139) and read 1.7-1.95x GB200's at MoE TP 1
# (EP 1, 4, 8, 16; EP 2 agrees) and 1.6x at MoE TP 4 EP 1, while agreeing (1.0-1.07x) at MoE TP 8 EP 1. The
# module docstring ("CUTLASS NVFP4") gives the sources.
NVFP4_CUTLASS_SOURCE = "moe_torch_flow_cutlass"
NVFP4_CUTLASS_TABLE_SYSTEM = {"b200_sxm": "gb200"}
NVFP4_MOE_KERNELS = ("default", "cutlass")


@dataclass(slots=True, frozen=True)
class TrtgenMoe:
    """The model's FP8 block-scaled expert op (aic op JSON, one layer) and its MoE layer count."""

    op: str
    layers: int


def trtgen_moe(token_graph: str, quant: str = "fp8_block") -> TrtgenMoe | None:
    """The expert op of a step graph (aic op JSON) at this quant mode ('fp8_block', 'nvfp4'); None when it has
    none."""
    for entry in json.loads(token_graph):
        (kind, fields), = entry.items()
        if kind != "Moe" or fields.get("quant_mode") != quant:
            continue
        return TrtgenMoe(json.dumps([{kind: {**fields, "scale_factor": 1.0}}]), round(fields["scale_factor"]))
    return None


def trtgen_delta_ms(own: Any, other: Any, moe: TrtgenMoe, tokens: int) -> float:
    """Milliseconds the trtllm-gen experts add to a step of `tokens` rows over the DeepGEMM table, all MoE
    layers (negative where trtllm-gen is faster): layers x (other table - own table)."""
    def price(evaluate: Any) -> float:
        return sum(row[1] for row in evaluate(moe.op, is_context=True, batch_size=1, s=1, x=tokens))
    return moe.layers * (price(other) - price(own))


class Nvfp4Trtgen:
    """An evaluator (aic's call shape: ops JSON, is_context, batch_size, s, x) of one NVFP4 expert op that answers
    from given (tokens, ms a layer) points of one aic kernel_source above `own_max_tokens` gathered tokens and from
    `own` (aic's engine) at or below: aic's trtllm-gen rows above NVFP4_TRTGEN_DEFAULT_MAX_TOKENS (the TRTLLM
    backend), or CUTLASS rows at every count (own_max_tokens 0: the CUTLASS backend)."""

    def __init__(self, own: Any, points: list[tuple[int, float]],
                 own_max_tokens: int = NVFP4_TRTGEN_DEFAULT_MAX_TOKENS) -> None:
        if len(points) < 2:
            raise ValueError("NVFP4 MoE rows: fewer than two token counts at this layout")
        self.own, self.points, self.own_max_tokens = own, sorted(points), own_max_tokens

    def latency_ms(self, tokens: float) -> float:
        """One layer's milliseconds at `tokens` gathered tokens, linear between the table's points (and on
        the last two past its ends)."""
        pts = self.points
        i = next((k for k in range(1, len(pts)) if pts[k][0] >= tokens), len(pts) - 1)
        (t0, y0), (t1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (tokens - t0) / (t1 - t0)

    def __call__(self, ops: str, is_context: bool, batch_size: int, s: int, x: int) -> list:
        (entry,) = json.loads(ops)
        (kind, fields), = entry.items()
        gathered = x * int(fields.get("attention_dp_size") or 1)
        if gathered <= self.own_max_tokens:
            return self.own(ops, is_context=is_context, batch_size=batch_size, s=s, x=x)
        return [(fields["name"], float(fields.get("scale_factor", 1.0)) * self.latency_ms(gathered))]


def nvfp4_trtgen_points(database: Any, moe: TrtgenMoe, source: str = NVFP4_TRTGEN_SOURCE,
                        system: str = "") -> list[tuple[int, float]]:
    """(tokens, ms a layer) of aic's TensorRT-LLM NVFP4 rows of one kernel_source (trtllm-gen by default) at the
    op's shape, layout and routing, from this database's system's table or `system`'s (same aic version)."""
    import os
    import pandas as pd
    (entry,) = json.loads(moe.op)
    (_, f), = entry.items()
    path = os.path.join(database.systems_root, "data", system or database.system, "moe", "trtllm", database.version,
                        "moe_perf.parquet")
    d = pd.read_parquet(path, columns=["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size",
                                       "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution",
                                       "latency"])
    d = d[(d.kernel_source == source) & (d.moe_dtype == "nvfp4") & (d.hidden_size == f["hidden_size"])
          & (d.inter_size == f["inter_size"]) & (d.topk == f["topk"]) & (d.num_experts == f["num_experts"])
          & (d.moe_tp_size == f["moe_tp_size"]) & (d.moe_ep_size == f["moe_ep_size"])
          & (d.distribution == f["workload_distribution"])]
    return [(int(t), float(v)) for t, v in d.groupby("num_tokens").latency.mean().items()]
