"""vLLM's Triton fused-MoE kernel for FP8 block-scaled experts (`aic_fp8_moe_kernel` 'triton'), priced where aic's
vLLM table for the GPU times another kernel.

Why it matters: InferenceX's MiniMax-M2.5 FP8 B200 rows of image vllm/vllm-openai:v0.17.0 ran
benchmarks/single_node/minimaxm2.5_fp8_b200.sh with `export VLLM_USE_FLASHINFER_MOE_FP8=0` and `export
VLLM_MOE_USE_DEEP_GEMM=0` (SemiAnalysisAI/InferenceX @07e171a; PR #947, 2026-04-03, removed both lines when it moved
the configuration to v0.19.0; vllm-project/recipes#272, 2026-03-11, gives the same two for B200 FP8 from InferenceX
#757). vLLM v0.17.0 then selects its Triton experts for MiniMax-M2.5's block-FP8 checkpoint on SM100, step by step
(vllm-project/vllm v0.17.0, the PyPI sdist, vllm/model_executor/layers/fused_moe/oracle/fp8.py
`select_fp8_moe_backend`; quantization/fp8.py calls it with kFp8Static128BlockSym x kFp8Dynamic128Sym and
allow_vllm_cutlass=False):
- `_get_priority_backends`: AITER, FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, DEEPGEMM, VLLM_CUTLASS, TRITON, MARLIN, ...
  (its Hopper reordering applies to capability 9.0 only);
- VLLM_USE_FLASHINFER_MOE_FP8 set to 0 (`envs.is_set`) removes both FlashInfer backends; VLLM_MOE_USE_DEEP_GEMM set
  to 0 removes DEEPGEMM and BATCHED_DEEPGEMM; allow_vllm_cutlass False removes both VLLM_CUTLASS;
- AITER is not supported off ROCm (rocm_aiter_fused_moe.py `_supports_current_device`); TRITON's TritonExperts
  (fused_moe.py) supports block FP8 from capability 8.9, SiLU, and any parallel layout but FlashInfer's all-to-all:
  the standard-format Triton experts (no data parallelism, so no all-to-all kernels) are the kernel the rows ran.
Defaults would not have run it: FlashInfer's TRTLLM FP8 experts refuse MiniMax's routing (sigmoid with a score
bias and no expert groups is RoutingMethodType.Unspecified: fused_moe/config.py `get_routing_method_type`;
experts/trtllm_fp8_moe.py accepts DeepSeekV3 / Renormalize / RenormalizeNaive), FlashInfer CUTLASS takes block
FP8 on 9.0 only, and DeepGEMM (installed by the image's docker/Dockerfile) would come next.

aic's vLLM 0.24.0 B200 table, the one the model prices with, times MiniMax's block-FP8 experts on FlashInfer's
TRTLLM kernel only (kernel_source 'vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic'). Its vLLM 0.19.0
B200 table times them on vLLM's Triton path: kernel_source 'vllm_fused_moe', which aic's collector for vLLM >= 0.14
(ai-dynamo/aiconfigurator collector/vllm/collect_moe_v1.py) measures by calling vLLM's `fused_experts` with a
block-FP8 quant config, and vLLM 0.19.0's `fused_experts` always dispatches to the Triton kernel
(fused_moe.py `dispatch_fused_experts_func`). 0.19.0 is the table nearest the rows' v0.17.0 image; its 0.22.0
table of the same source agrees within a few per cent at MiniMax's shape. At that shape (MoE TP 1 x EP 2, power
law 1.2, ms a layer) Triton takes 0.12 / 0.49 / 0.82 at 8 / 128 / 1,024 tokens against TRTLLM's 0.09 / 0.25 / 0.45.

The transfer is trtgen.py's: per MoE layer, the step's expert op priced on that table instead of the model's own,
the difference times the MoE layers added to the step. Nothing is fitted.
"""

from __future__ import annotations

# The aic vLLM database per system that times vLLM's Triton fused-MoE on FP8 block-scaled experts (kernel_source
# 'vllm_fused_moe'; module doc). Only B200 has rows that run it; another system is refused by name.
TRITON_DATABASES = {"b200_sxm": ("vllm", "0.19.0")}
