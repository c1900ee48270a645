"""PyTorch references for the paged KV cache kernels, written to be read as the spec.

Cache layout "nhd" (the engine's default): ``[num_blocks, block_size, num_kv_heads, head_dim]``.
Cache layout "hnd": ``[num_blocks, num_kv_heads, block_size, head_dim]``.
A slot is ``block_id * block_size + offset``. Query head ``h`` reads KV head
``h // (num_q_heads // num_kv_heads)`` (query heads of a group are contiguous).
"""

from __future__ import annotations

import torch

LAYOUTS = ("nhd", "hnd")


def cache_block_size(cache: torch.Tensor, layout: str = "nhd") -> int:
    """Tokens per block of a cache tensor in the given layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown cache layout {layout!r}; use one of {LAYOUTS}")
    return cache.shape[1] if layout == "nhd" else cache.shape[2]


def _as_nhd(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """View a cache as ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown cache layout {layout!r}; use one of {LAYOUTS}")
    return cache if layout == "nhd" else cache.transpose(1, 2)


def ref_store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: str = "nhd",
) -> None:
    """Write token ``t``'s K/V ``[num_kv_heads, head_dim]`` to slot ``slot_mapping[t]``; -1 skips."""
    kc = _as_nhd(key_cache, layout)
    vc = _as_nhd(value_cache, layout)
    block_size = kc.shape[1]
    for t in range(key.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        block_id, offset = divmod(slot, block_size)
        kc[block_id, offset] = key[t]
        vc[block_id, offset] = value[t]


def gather_sequence_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, layout: str = "nhd", start: int = 0
) -> torch.Tensor:
    """One sequence's cached tokens ``start .. seq_len - 1`` in logical order: ``[n, num_kv_heads, head_dim]``.

    Blocks wholly before ``start`` are not read (a sliding window may have freed them).
    """
    nhd = _as_nhd(cache, layout)
    block_size = nhd.shape[1]
    first = start // block_size
    num_blocks = -(-seq_len // block_size)
    blocks = nhd[block_table_row[first:num_blocks].long()]
    return blocks.reshape(-1, nhd.shape[2], nhd.shape[3])[start - first * block_size:seq_len - first * block_size]


def ref_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    split_kv: bool | None = None,
    layout: str = "nhd",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of a flat varlen batch of new tokens over their paged KV cache.

    Sequence ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]``; its
    ``j``-th new token sits at position ``context_len + j`` (``context_len = seq_len -
    query_len``) and attends to cache positions ``0 .. context_len + j``. The new tokens'
    K/V must already be in the cache. Rows past ``query_start_loc[-1]`` are set to zero.
    With ``sliding_window=W`` a token at position ``p`` sees only positions ``p - W + 1 .. p``
    (transformers' sliding mask), and positions below every new token's window are never read,
    so their blocks may be freed. ``max_query_len``, ``max_seq_len`` and ``split_kv`` only matter to kernels.
    """
    del max_query_len, max_seq_len, split_kv
    num_q_heads = query.shape[1]
    num_kv_heads = _as_nhd(key_cache, layout).shape[2]
    group = num_q_heads // num_kv_heads
    result = torch.zeros_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        query_len = q_end - q_start
        if query_len == 0:
            continue
        context_len = seq_len - query_len
        lo = 0 if sliding_window is None else max(0, context_len - sliding_window + 1)
        k = gather_sequence_kv(key_cache, block_tables[i], seq_len, layout, lo).float()
        v = gather_sequence_kv(value_cache, block_tables[i], seq_len, layout, lo).float()
        k = k.repeat_interleave(group, dim=1)  # [seq_len, num_q_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # [query_len, num_q_heads, head_dim]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = context_len + torch.arange(query_len).unsqueeze(1)
        k_pos = torch.arange(lo, seq_len).unsqueeze(0)
        hidden = k_pos > q_pos
        if sliding_window is not None:
            hidden |= k_pos <= q_pos - sliding_window
        scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        result[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
