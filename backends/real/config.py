"""Engine arguments, named as vLLM names them, and how they become the scheduler's config."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ...core.errors import InvalidConfigError

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64}


@dataclass(slots=True)
class EngineArgs:
    """Everything that configures the real engine; unknown keywords are a typed error."""

    model: str = "smollm2"
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # KV cache size: a fixed block count wins, else GiB on CPU, else a share of GPU memory.
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    attention_backend: str = "auto"
    policy: str = "fcfs"
    preemption: str = "auto"
    max_logprobs: int = 20
    # CPU only: a transposed copy of the weights that makes batch-1 decode faster (more memory).
    small_batch_weights: bool = True
    # CUDA: no CUDA graphs for decode steps (they are captured per batch-size bucket otherwise).
    enforce_eager: bool = False
    # CSV or JSONL (by suffix) of per-step shapes and times, for the cost-model fit.
    step_log_path: str | None = None

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> "EngineArgs":
        """Build from keyword arguments, naming any that are unknown."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidConfigError(unknown[0], kwargs[unknown[0]], f"one of the engine args {sorted(known)}")
        if model is not None:
            kwargs["model"] = model
        return cls(**kwargs)

    def resolve_device(self) -> torch.device:
        """'auto' -> cuda when present, else cpu."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        """'auto' -> fp32 on CPU (exact), bf16 on CUDA."""
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        if self.dtype not in _DTYPES:
            raise InvalidConfigError("dtype", self.dtype, f"'auto' or one of {sorted(_DTYPES)}")
        return _DTYPES[self.dtype]
