"""The slot for the Triton kernels of ``twinserve.kernels.ops`` (chosen automatically on CUDA)."""

from __future__ import annotations

import torch

from twinserve.backends.real.attention.backend import AttentionMetadata


class TritonPagedAttention:
    """Calls the kernels' store_kv and unified paged_attention; K/V layout as the torch path."""

    name = "triton"
    # Launch shapes depend only on tensor shapes and the host hints the graph runner fixes.
    supports_cuda_graphs = True

    def __init__(self) -> None:
        from twinserve.kernels import ops  # imported lazily: triton is heavy and GPU-oriented

        self._ops = ops

    def plan(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int) -> None:
        """Nothing to precompute: the kernels read the metadata tensors directly."""
        meta.plan = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, sliding_window: int | None = None) -> torch.Tensor:
        """store_kv then paged_attention over the flat batch."""
        self._ops.store_kv(key, value, key_cache, value_cache, meta.slot_mapping)
        return self._ops.paged_attention(query, key_cache, value_cache, meta.block_tables,
                                         meta.query_start_loc, meta.seq_lens, scale,
                                         meta.max_query_len, meta.max_seq_len,
                                         sliding_window=sliding_window)
