"""Rotary position embeddings with the scaling variants HF Llama configs use.

Sources: RoFormer (Su et al., 2021); Llama 3.1 (Meta, 2024); position interpolation
(Chen et al., 2023); dynamic NTK; YaRN (Peng et al., 2023).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from twinserve.core.errors import UnsupportedModelError


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def _yarn_inv_freq(base: float, dim: int, s: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    factor = float(s["factor"])
    orig = int(s.get("original_max_position_embeddings") or max_pos)
    mscale = s.get("attention_factor")
    if mscale is None:
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    beta_fast, beta_slow = float(s.get("beta_fast", 32)), float(s.get("beta_slow", 1))

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(orig / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolate = 1.0 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv, float(mscale)


def rope_inv_freq(base: float, dim: int, scaling: dict[str, Any] | None, max_pos: int,
                  max_len: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin multiplier for a config's RoPE variant."""
    if scaling is None:
        return _default_inv_freq(base, dim), 1.0
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return _default_inv_freq(base, dim), 1.0
    if kind == "linear":
        return _default_inv_freq(base, dim) / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(_default_inv_freq(base, dim), scaling), 1.0
    if kind == "dynamic":
        # Dynamic NTK: a batch mixes lengths, so the base is fixed for the longest length admitted.
        factor = float(scaling["factor"])
        if max_len > max_pos:
            base = base * ((factor * max_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return _default_inv_freq(base, dim), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(base, dim, scaling, max_pos)
    raise UnsupportedModelError(f"rope_type={kind!r} is not supported; use default, linear, "
                                "llama3, dynamic or yarn")


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables indexed by each token's position."""

    def __init__(self, head_dim: int, base: float, scaling: dict[str, Any] | None,
                 max_position_embeddings: int, max_len: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq, mult = rope_inv_freq(base, head_dim, scaling, max_position_embeddings, max_len)
        positions = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", (emb.cos() * mult).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * mult).to(dtype), persistent=False)
        self.half = head_dim // 2

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, D] for positions [T]; computed once per step, used by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def forward(self, cos_sin: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] by the looked-up cos/sin."""
        cos, sin = cos_sin
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.half
        rotated = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        return x * cos + rotated * sin
