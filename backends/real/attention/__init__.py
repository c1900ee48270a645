"""Attention backends behind one interface: PyTorch paged (CPU default) and Triton (CUDA default)."""

from __future__ import annotations

import torch

from ....core.errors import InvalidConfigError
from .backend import AttentionBackend, AttentionMetadata
from .torch_paged import TorchPagedAttention

BACKENDS = ("torch", "triton")


def get_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """The backend called name, or the device's default when name is None or "auto"."""
    if name in (None, "auto"):
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchPagedAttention()
    if name == "triton":
        from .triton_backend import TritonPagedAttention

        return TritonPagedAttention()
    raise InvalidConfigError("attention_backend", name, f"one of {BACKENDS} or 'auto'")


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "TorchPagedAttention",
           "get_attention_backend"]
