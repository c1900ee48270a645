"""Precision under vLLM's names: dtype, quantization, kv_cache_dtype.

As vLLM does (docs.vllm.ai, "Quantization"): fp8 stores layer weights in 1 byte and runs W8A8
GEMMs where the GPU can; int4 is weight-only (AWQ/GPTQ, group 128); kv fp8 stores K/V in 1 byte.
nvfp4 (vLLM: modelopt_fp4) is 4-bit E2M1 with an FP8 scale per 16 weights, W4A4 at the FP4 peak
where the GPU has one (Blackwell), dequantized to 16 bits elsewhere. mxfp4 is gpt-oss's checkpoint:
4-bit with an E8M0 scale per 32 (OCP MX spec v1.0) on the MoE experts only; vLLM's Mxfp4Config keeps
the other linear layers in 16 bits and runs the experts W4A8 (MXFP8 activations, FlashInfer) on
Blackwell, so at the FP8 peak there, dequantized to 16 bits elsewhere.
Embeddings, LM head, activations and all-reduces stay 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("bfloat16", "float16")
QUANTIZATIONS = ("none", "fp8", "int4", "nvfp4", "mxfp4", "modelopt_fp4")
KV_CACHE_DTYPES = ("auto", "fp8")
# vLLM's option values that name a format we already price.
QUANTIZATION_ALIASES = {"modelopt_fp4": "nvfp4"}

# int4 group-wise: 4 bits + (16-bit scale + 4-bit zero) / 128 weights per weight.
_INT4_BYTES = (4 + 20 / 128) / 8
# NVFP4: 4 bits + one FP8 (E4M3) scale per 16 weights (the per-tensor FP32 scale is negligible).
NVFP4_BYTES = (4 + 8 / 16) / 8
# MXFP4: 4 bits + one E8M0 scale per 32 weights.
MXFP4_BYTES = (4 + 8 / 32) / 8
_WEIGHT_BYTES = {"none": 2.0, "fp8": 1.0, "int4": _INT4_BYTES, "nvfp4": NVFP4_BYTES, "mxfp4": MXFP4_BYTES}


@dataclass(slots=True, frozen=True)
class Precision:
    """The data types of one deployment, with vLLM's option names and values."""

    dtype: str = "bfloat16"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name, allowed in (("dtype", DTYPES), ("quantization", QUANTIZATIONS),
                              ("kv_cache_dtype", KV_CACHE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.quantization in QUANTIZATION_ALIASES:
            object.__setattr__(self, "quantization", QUANTIZATION_ALIASES[self.quantization])

    @property
    def weight_bytes(self) -> float:
        """Bytes per layer weight in memory (MoE experts: expert_weight_bytes)."""
        return 2.0 if self.quantization == "mxfp4" else _WEIGHT_BYTES[self.quantization]

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per routed-expert weight in memory."""
        return _WEIGHT_BYTES[self.quantization]

    @property
    def kv_bytes(self) -> int:
        """Bytes per K or V element."""
        return 1 if self.kv_cache_dtype == "fp8" else 2

    @property
    def fp8_gemm(self) -> bool:
        """True when the GEMMs can run on FP8 tensor cores (weights and activations in FP8)."""
        return self.quantization == "fp8"

    @property
    def fp4_gemm(self) -> bool:
        """True when the GEMMs can run on FP4 tensor cores (NVFP4 weights and activations)."""
        return self.quantization == "nvfp4"

    def gemm_kind(self, experts: bool = False) -> str:
        """The tensor-core format the linear layers (or the routed experts) want: fp4, fp8 or 16."""
        if self.quantization == "nvfp4":
            return "fp4"
        if self.quantization == "fp8" or (experts and self.quantization == "mxfp4"):
            return "fp8"
        return "16"

    def label(self) -> str:
        """A short name for reports, e.g. 'bfloat16', 'fp8 (kv fp8)'."""
        w = self.dtype if self.quantization == "none" else self.quantization
        return w + (" (kv fp8)" if self.kv_cache_dtype == "fp8" else "")
