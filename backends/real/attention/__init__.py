"""Attention backends behind one interface: PyTorch paged (CPU default) and Triton (CUDA default)."""

from __future__ import annotations

import torch

from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.attention.backend import AttentionBackend, AttentionMetadata
from twinserve.backends.real.attention.torch_paged import TorchPagedAttention

BACKENDS = ("torch", "triton")


def backend_name(name: str | None, device_type: str) -> str:
    """The backend a name asks for on this kind of device ("auto": triton on CUDA, else torch)."""
    if name in (None, "auto"):
        return "triton" if device_type == "cuda" else "torch"
    return name


def get_attention_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """The backend called name, or the device's default when name is None or "auto"."""
    name = backend_name(name, device.type)
    if name == "torch":
        return TorchPagedAttention()
    if name == "triton":
        from twinserve.backends.real.attention.triton_backend import TritonPagedAttention

        return TritonPagedAttention()
    raise InvalidConfigError("attention_backend", name, f"one of {BACKENDS} or 'auto'")


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "TorchPagedAttention",
           "get_attention_backend"]
