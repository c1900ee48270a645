"""TensorRT-LLM's NVFP4 dense GEMMs as its autotuner runs them, where aic's TensorRT-LLM table times the untuned
fallback kernel.

What the engine runs. TensorRT-LLM's NVFP4 Linear (`NVFP4LinearMethod.apply`, tensorrt_llm/_torch/modules/
linear.py) quantizes the activations (`fp4_quantize`) and calls `torch.ops.trtllm.nvfp4_gemm`, whose
`NVFP4GemmUnifiedRunner` (tensorrt_llm/_torch/custom_ops/torch_custom_ops.py) asks the AutoTuner to choose among
CUTLASS tactics, cuBLASLt algorithms and, for M <= 8, a CUDA-core kernel (default `allowed_backends`
"cutlass,cublaslt,cuda_core"), per power-of-two M bucket. Outside an `autotune()` context the AutoTuner does not
profile: `AutoTuner.choose_one` returns the cached choice or, on a miss, tactic -1 (NVIDIA/TensorRT-LLM
tensorrt_llm/_torch/autotuner.py @000a01d: "Early return if it's not tuning, use cache found one or fallback one"),
which the unified runner maps to CUTLASS's default configuration (`("cutlass", -1)`). A served model is tuned:
the PyTorch executor runs `_run_autotuner_warmup` under `autotune()` at start-up (`enable_autotuner` defaults on;
tensorrt_llm/_torch/pyexecutor/model_engine.py), before it captures CUDA graphs. InferenceX's Llama-3.1-70B FP4
B200 script leaves that default (SemiAnalysisAI/InferenceX benchmarks/70b_fp4_b200_trt_docker.sh @c2faa3d).

What aic timed. aic's TensorRT-LLM collector builds a `Linear` with `QuantAlgo.NVFP4` and times `forward` with no
`autotune()` anywhere (ai-dynamo/aiconfigurator collector/trtllm/collect_gemm.py @8bf15d3, `run_gemm`: one "dry
run to init", then the timed loop; kernel_source `torch_flow`, the one source of the nvfp4 rows in
systems/data/b200_sxm/gemm/trtllm/1.3.0rc20): the fallback. Its small-M rows read like it: Llama-3.1-70B's
8192 x 8192 at M = 4 takes 22.5 us (1.7 TB/s of weight bytes) where its own FP8 row takes 26.1 us for twice the
bytes, and 8192 x 65536 reads 2.2 TB/s at every M up to 64.

The stand-in. aic holds no tuned TensorRT-LLM NVFP4 GEMM. The only other NVFP4 dense GEMM it timed on these GPUs
is its SGLang 0.5.14 table's, with the same scope (dynamic activation quantization + GEMM): FlashInfer's `mm_fp4`
on its CuTe-DSL backend on SM100 / SM103, SGLang's own dispatch there (kernel_source
`sglang_flashinfer_cutedsl_nvfp4`; collector/sglang/collect_gemm.py, `run_gemm`'s nvfp4 branch). Each NVFP4 GEMM
op of the step is priced at the lower of the two tables' answers: the autotuner's choice is never slower than the
fallback it can pick, so aic's own answer bounds it above, and where the SGLang row is faster it stands in for the
tuned choice (an assumption: that the tuned TensorRT-LLM kernel is about as fast). It is another
library's kernel, not TensorRT-LLM's (which picks CUTLASS, cuBLASLt or CUDA-core); no measured row was used to
choose it. Ops inside an Overlap group (the shared experts beside the routed ones in aic's generation graph) keep
aic's price.
"""

from __future__ import annotations

import json
from typing import Any

# aic's database whose NVFP4 GEMM rows stand in for TensorRT-LLM's tuned ones (the module docstring).
NVFP4_GEMM_DATABASE = ("sglang", "0.5.14")


def nvfp4_gemm_ops(graph: str) -> str:
    """The top-level NVFP4 GEMM ops of an aic op list (JSON), as an op list; '' when it has none."""
    ops = [e for e in json.loads(graph) if "Gemm" in e and e["Gemm"].get("quant_mode") == "nvfp4"]
    return json.dumps(ops) if ops else ""


def tuned_delta_ms(own: Any, standin: Any, ops: str, tokens: int) -> float:
    """Milliseconds the NVFP4 GEMM ops `ops` lose at `tokens` rows when each is priced at the lower of its own
    table's answer (`own`, an aic evaluator) and the stand-in's (`standin`): 0 or negative."""
    a = own(ops, is_context=True, batch_size=1, s=1, x=tokens)
    b = standin(ops, is_context=True, batch_size=1, s=1, x=tokens)
    if [r[0] for r in a] != [r[0] for r in b]:
        raise ValueError(f"the two tables priced different ops: {[r[0] for r in a]} / {[r[0] for r in b]}")
    return sum(min(0.0, rb[1] - ra[1]) for ra, rb in zip(a, b))
