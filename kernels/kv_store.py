"""Triton kernel that writes new tokens' K/V into their paged-cache slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_pos,
    stride_cache_head,
    num_kv_heads,
    head_dim,
    block_size,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    # One program per token moves all its KV heads at once; the grid is the padded
    # token count, so padding slots (-1) are masked off rather than trimmed on the host.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    block_id = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    # The slot test is broadcast through a tensor: a scalar mask operand is rejected by
    # the interpreter ("mask has unsupported dtype").
    mask = (heads < num_kv_heads) & (dims < head_dim) & ((heads * 0 + slot) >= 0)
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    dst = block_id * stride_cache_block + offset * stride_cache_pos + heads * stride_cache_head + dims
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def launch_store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    cache_strides: tuple[int, int, int],
    block_size: int,
) -> None:
    """Launch the store kernel; ``cache_strides`` = (block, position, head) in elements."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        cache_strides[0],
        cache_strides[1],
        cache_strides[2],
        num_kv_heads,
        head_dim,
        block_size,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )
