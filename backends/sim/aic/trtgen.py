"""TensorRT-LLM's TRTLLM MoE backend (trtllm-gen kernels) for FP8 block-scaled experts, priced where aic's
TensorRT-LLM table times another kernel.

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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FP8_MOE_KERNELS = ("default", "trtllm")
# aic's database holding FlashInfer's trtllm-gen FP8 block-scale MoE rows (B200: moe/sglang/0.5.14).
TRTGEN_DATABASE = ("sglang", "0.5.14")


@dataclass(slots=True, frozen=True)
class TrtgenMoe:
    """The model's FP8 block-scaled expert op (aic op JSON, one layer) and its MoE layer count."""

    op: str
    layers: int


def trtgen_moe(token_graph: str) -> TrtgenMoe | None:
    """The FP8 block-scaled expert op of a step graph (aic op JSON); None when it has none."""
    for entry in json.loads(token_graph):
        (kind, fields), = entry.items()
        if kind != "Moe" or fields.get("quant_mode") != "fp8_block":
            continue
        return TrtgenMoe(json.dumps([{kind: {**fields, "scale_factor": 1.0}}]), round(fields["scale_factor"]))
    return None


def trtgen_delta_ms(own: Any, other: Any, moe: TrtgenMoe, tokens: int) -> float:
    """Milliseconds the trtllm-gen experts add to a step of `tokens` rows over the DeepGEMM table, all MoE
    layers (negative where trtllm-gen is faster): layers x (other table - own table)."""
    def price(evaluate: Any) -> float:
        return sum(row[1] for row in evaluate(moe.op, is_context=True, batch_size=1, s=1, x=tokens))
    return moe.layers * (price(other) - price(own))
