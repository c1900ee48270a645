"""The one interface every attention backend implements, and the per-step metadata it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where each new token of a flat varlen batch lives and what it attends to.

    Decodes come first, then prefill chunks; the *_cpu lists repeat the numbers on the host for
    backends that plan in Python.
    """

    num_tokens: int
    num_decodes: int
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs], context + new tokens
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    max_query_len: int
    max_seq_len: int
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    # Precomputed once per step, reused by every layer.
    plan: Any = None
    # Per KV cache group (several groups only): the same batch with that group's block tables
    # and slot mapping; group 0 is this metadata itself.
    groups: list["AttentionMetadata"] | None = None


class AttentionBackend(Protocol):
    """Stores the step's K/V in the paged cache and computes causal attention over it."""

    name: str

    def plan(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int) -> None:
        """Precompute per-step work shared by all layers (sets meta.plan)."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, sliding_window: int | None = None) -> torch.Tensor:
        """query [T, Hq, D], key/value [T, Hkv, D], caches [blocks, block_size, Hkv, D] -> [T, Hq, D];
        a sliding-window layer passes its window W and reads only each token's last W positions."""
