"""Precision under vLLM's names: dtype, quantization, kv_cache_dtype.

As vLLM does (docs.vllm.ai, "Quantization"): fp8 stores layer weights in 1 byte and runs W8A8
GEMMs where the GPU can; int4 is weight-only (AWQ/GPTQ, group 128); kv fp8 stores K/V in 1 byte.
Embeddings, LM head, activations and all-reduces stay 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("bfloat16", "float16")
QUANTIZATIONS = ("none", "fp8", "int4")
KV_CACHE_DTYPES = ("auto", "fp8")

# int4 group-wise: 4 bits + (16-bit scale + 4-bit zero) / 128 weights per weight.
_INT4_BYTES = (4 + 20 / 128) / 8


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

    @property
    def weight_bytes(self) -> float:
        """Bytes per layer weight in memory."""
        return {"none": 2.0, "fp8": 1.0, "int4": _INT4_BYTES}[self.quantization]

    @property
    def kv_bytes(self) -> int:
        """Bytes per K or V element."""
        return 1 if self.kv_cache_dtype == "fp8" else 2

    @property
    def fp8_gemm(self) -> bool:
        """True when the GEMMs can run on FP8 tensor cores (weights and activations in FP8)."""
        return self.quantization == "fp8"

    def label(self) -> str:
        """A short name for reports, e.g. 'bfloat16', 'fp8 (kv fp8)'."""
        w = self.dtype if self.quantization == "none" else self.quantization
        return w + (" (kv fp8)" if self.kv_cache_dtype == "fp8" else "")
