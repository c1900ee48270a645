"""Host-side cost of an engine per step and per scheduled sequence, by the kind of engine.

cuda_graph_cpp: a C++ runtime replaying CUDA graphs (TensorRT-LLM's benchmarks);
eager_python: a Python scheduler launching kernels eagerly (this project's engine, vLLM-style);
cuda_graph_python: a Python scheduler replaying CUDA graphs (vLLM V1 and SGLang as served in 2025-26).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineProfile:
    """Fixed host seconds per step and per scheduled sequence."""

    name: str
    step_overhead_s: float
    per_seq_overhead_s: float
    description: str


ENGINE_PROFILES: dict[str, EngineProfile] = {p.name: p for p in (
    EngineProfile("cuda_graph_cpp", 0.5e-3, 2e-6,
                  "C++ runtime replaying CUDA graphs (TensorRT-LLM)"),
    EngineProfile("eager_python", 1.5e-3, 10e-6,
                  "Python scheduler, eager kernel launches (vLLM-style)"),
    # Fitted on the vLLM and SGLang development rows of aiconfigurator-core's silicon_sample.csv
    # (Llama-3.1-70B, gpt-oss-120b, DeepSeek-R1, Qwen3-32B; experiments/rows_tpot.py): a flat
    # optimum over 0.5-1.2 ms a step, 2-10 us a sequence.
    EngineProfile("cuda_graph_python", 0.8e-3, 10e-6,
                  "Python scheduler replaying CUDA graphs (vLLM V1, SGLang)"),
)}
