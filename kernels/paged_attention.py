"""Unified paged-attention Triton kernel: prefill chunks and decode tokens in one launch.

FlashAttention-2 online softmax (Dao, 2023, arXiv:2307.08691) over block-table KV tiles as in
PagedAttention (Kwon et al., SOSP 2023). GQA: a KV head's query heads are packed with BLOCK_Q tokens
into one BLOCK_M-row tile, so each KV tile is read once per group and every ``tl.dot`` is >= 16 wide.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q: tl.constexpr):
    # Tile starts query_start_loc[i] // BLOCK_Q + i strictly increase in i, so a binary search
    # maps a flat tile id to its sequence.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, FP32_IEEE: tl.constexpr):
    # fp32 inputs would silently run in tf32 on NVIDIA; the references are exact fp32.
    if FP32_IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _paged_attention_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    out_ptr,
    lse_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    qk_scale_log2,
    num_seqs,
    window,
    stride_qt,
    stride_qh,
    stride_os,
    stride_ot,
    stride_oh,
    stride_ls,
    stride_lt,
    stride_cache_block,
    stride_cache_pos,
    stride_cache_head,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP32_IEEE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    # Grid: (num_tokens // BLOCK_Q + num_seqs, num_kv_heads, NUM_SPLITS) — padded shapes only.
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_tile = tile_id - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m // GROUP < BLOCK_Q) & (q_idx < query_len)
    offs_d = tl.arange(0, DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    token = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        query_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = context_len + q_idx

    # Keys this tile can see end at the last valid query's position (exclusive bound).
    kv_end = context_len + tl.minimum((q_tile + 1) * BLOCK_Q, query_len)
    num_kv_tiles = tl.cdiv(kv_end, BLOCK_N)
    # With a sliding window, keys before the window are never loaded (their blocks may be freed).
    kv_lo = 0
    if HAS_WINDOW:
        kv_lo = tl.maximum(context_len + q_tile * BLOCK_Q - window + 1, 0)
    first_tile = kv_lo // BLOCK_N
    if NUM_SPLITS == 1:
        tile_lo = first_tile
        tile_hi = num_kv_tiles
    else:
        tiles_per_split = tl.cdiv(num_kv_tiles - first_tile, NUM_SPLITS)
        tile_lo = first_tile + split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, num_kv_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_cache_head
    for kv_tile in range(tile_lo, tile_hi):
        offs_n = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = (offs_n < kv_end) & (offs_n >= kv_lo)
        block_id = tl.load(table_row + offs_n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_off = block_id * stride_cache_block + (offs_n % BLOCK_SIZE) * stride_cache_pos + head_off
        k = tl.load(
            key_cache_ptr + kv_off[None, :] + offs_d[:, None],
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        s = _dot(q, k, FP32_IEEE) * qk_scale_log2
        visible = (offs_n[None, :] <= q_pos[:, None]) & row_ok[:, None]
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep m = -inf; shift them by 0 to avoid inf - inf.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            value_cache_ptr + kv_off[:, None] + offs_d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_IEEE)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_mask = row_ok[:, None] & d_ok[None, :]
    dst = out_ptr + split.to(tl.int64) * stride_os + token[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(dst + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=out_mask)
    if NUM_SPLITS > 1:
        # Log-sum-exp in base 2 lets the reduction weight each split's normalised output.
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + split.to(tl.int64) * stride_ls + token * stride_lt + head, lse, mask=row_ok)


def launch_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    cache_strides: tuple[int, int, int],
    block_size: int,
    num_kv_heads: int,
    block_m: int,
    block_n: int,
    num_splits: int,
    num_warps: int,
    num_stages: int,
    sliding_window: int | None = None,
) -> None:
    """Launch the kernel (``sliding_window`` W: keys at most W - 1 back); with ``num_splits > 1`` ``out`` is
    ``[splits, tokens, heads, dim]`` fp32.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    group = num_q_heads // num_kv_heads
    block_q = block_m // group
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_splits)
    if num_splits > 1:
        assert lse is not None and out.dim() == 4
        out_strides = (out.stride(0), out.stride(1), out.stride(2))
        lse_arg, lse_strides = lse, (lse.stride(0), lse.stride(1))
    else:
        out_strides = (0, out.stride(0), out.stride(1))
        lse_arg, lse_strides = out, (0, 0)
    _paged_attention_kernel[grid](
        query,
        key_cache,
        value_cache,
        out,
        lse_arg,
        block_tables,
        query_start_loc,
        seq_lens,
        scale * LOG2_E,
        num_seqs,
        sliding_window or 0,
        query.stride(0),
        query.stride(1),
        *out_strides,
        *lse_strides,
        *cache_strides,
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        FP32_IEEE=query.dtype == torch.float32,
        HAS_WINDOW=sliding_window is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )

