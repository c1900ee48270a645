"""Split-KV reduction: merge per-segment partial attention outputs into the final rows.

Flash-Decoding (Dao et al., 2023, "Flash-Decoding for long-context inference") splits a
long context into segments processed in parallel; each segment leaves a normalised output
and its base-2 log-sum-exp, and this kernel reweights them exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reduce_splits_kernel(
    partial_ptr,
    lse_ptr,
    out_ptr,
    query_start_loc_ptr,
    num_seqs,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    # Grid: (num_tokens, num_q_heads). Padding rows past the last sequence are left as is.
    token = tl.program_id(0)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        return
    token = token.to(tl.int64)
    splits = tl.arange(0, SPLITS_PAD).to(tl.int64)
    s_ok = splits < NUM_SPLITS
    lse = tl.load(lse_ptr + splits * stride_ls + token * stride_lt + head, mask=s_ok, other=float("-inf"))
    # Split 0 always covers key position 0, so the max is finite for every real row.
    weight = tl.exp2(lse - tl.max(lse, 0))
    offs_d = tl.arange(0, DIM_PAD)
    mask = s_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    part = tl.load(
        partial_ptr + splits[:, None] * stride_ps + token * stride_pt + head * stride_ph + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    # Empty splits stored zeros and weigh exp2(-inf) = 0, so they drop out.
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def launch_reduce_splits(
    partial: torch.Tensor,
    lse: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    """Reduce ``partial`` ``[splits, tokens, heads, dim]`` with ``lse`` ``[splits, tokens, heads]``."""
    num_splits, num_tokens, num_heads, head_dim = partial.shape
    if num_tokens == 0:
        return
    _reduce_splits_kernel[(num_tokens, num_heads)](
        partial,
        lse,
        out,
        query_start_loc,
        query_start_loc.shape[0] - 1,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        DIM_PAD=triton.next_power_of_2(head_dim),
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
    )
