"""Host-side argument checks: Triton's interpreter (and a GPU) read out of bounds silently."""

from __future__ import annotations

import os

import torch

from twinserve.kernels.reference import LAYOUTS

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class KernelArgumentError(ValueError):
    """A kernel argument has the wrong shape, dtype, device or value."""


def value_checks_enabled(device: torch.device) -> bool:
    """Value checks need a device-to-host copy: always on CPU, opt-in on GPU."""
    if device.type == "cpu":
        return True
    # Never while a CUDA graph is being captured: the copy to the host would invalidate the capture.
    return os.environ.get("TWINSERVE_KERNEL_CHECKS", "0") == "1" and not torch.cuda.is_current_stream_capturing()


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise KernelArgumentError(message)


def cache_geometry(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """Return (num_blocks, block_size, num_kv_heads, head_dim) after checking the cache pair."""
    _require(layout in LAYOUTS, f"unknown cache layout {layout!r}; use one of {LAYOUTS}")
    _require(key_cache.dim() == 4, f"key_cache must be 4-D, got shape {tuple(key_cache.shape)}")
    _require(
        key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride(),
        "key_cache and value_cache must have the same shape and strides",
    )
    _require(key_cache.dtype == value_cache.dtype, "key_cache and value_cache must share a dtype")
    _require(key_cache.dtype in SUPPORTED_DTYPES, f"unsupported cache dtype {key_cache.dtype}")
    _require(key_cache.stride(3) == 1, "the cache's head_dim axis must be contiguous (stride 1)")
    _require(key_cache.device == value_cache.device, "key_cache and value_cache on different devices")
    if layout == "nhd":
        num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    else:
        num_blocks, num_kv_heads, block_size, head_dim = key_cache.shape
    return num_blocks, block_size, num_kv_heads, head_dim


def cache_strides(cache: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """Element strides (block, position-in-block, head) of a cache tensor."""
    if layout == "nhd":
        return cache.stride(0), cache.stride(1), cache.stride(2)
    return cache.stride(0), cache.stride(2), cache.stride(1)


def check_store_args(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: str,
) -> tuple[int, int, int, int]:
    """Validate store_kv arguments; return the cache geometry."""
    num_blocks, block_size, num_kv_heads, head_dim = cache_geometry(key_cache, value_cache, layout)
    _require(key.dim() == 3 and key.shape == value.shape, "key/value must be [num_tokens, num_kv_heads, head_dim]")
    _require(
        tuple(key.shape[1:]) == (num_kv_heads, head_dim),
        f"key heads/dim {tuple(key.shape[1:])} do not match the cache's {(num_kv_heads, head_dim)}",
    )
    _require(key.stride(2) == 1 and value.stride(2) == 1, "key/value head_dim axis must be contiguous")
    _require(slot_mapping.dim() == 1 and slot_mapping.shape[0] == key.shape[0], "slot_mapping must be [num_tokens]")
    _require(slot_mapping.dtype == torch.int64, f"slot_mapping must be int64, got {slot_mapping.dtype}")
    for t in (key, value, slot_mapping):
        _require(t.device == key_cache.device, "all tensors must be on the cache's device")
    if value_checks_enabled(key_cache.device) and slot_mapping.numel() > 0:
        bad = (slot_mapping < -1) | (slot_mapping >= num_blocks * block_size)
        _require(not bool(bad.any()), f"slot_mapping has slots outside [-1, {num_blocks * block_size})")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None,
    layout: str,
    sliding_window: int | None = None,
) -> tuple[int, int, int, int]:
    """Validate paged_attention arguments; return the cache geometry."""
    num_blocks, block_size, num_kv_heads, head_dim = cache_geometry(key_cache, value_cache, layout)
    _require(query.dim() == 3, f"query must be [num_tokens, num_q_heads, head_dim], got {tuple(query.shape)}")
    _require(query.shape[2] == head_dim, f"query head_dim {query.shape[2]} != cache head_dim {head_dim}")
    _require(head_dim >= 16, "head_dim must be >= 16 (tl.dot operands need >= 16 per dimension)")
    _require(query.shape[1] % num_kv_heads == 0, f"{query.shape[1]} query heads not divisible by {num_kv_heads}")
    _require(query.dtype == key_cache.dtype, f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")
    _require(query.stride(2) == 1, "query head_dim axis must be contiguous")
    num_seqs = seq_lens.shape[0]
    _require(seq_lens.dim() == 1 and seq_lens.dtype == torch.int32, "seq_lens must be int32 [num_seqs]")
    _require(
        query_start_loc.dim() == 1 and query_start_loc.shape[0] == num_seqs + 1 and query_start_loc.dtype == torch.int32,
        "query_start_loc must be int32 [num_seqs + 1]",
    )
    _require(
        block_tables.dim() == 2 and block_tables.shape[0] >= num_seqs and block_tables.dtype == torch.int32,
        "block_tables must be int32 [num_seqs, max_blocks_per_seq]",
    )
    _require(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    _require(query_start_loc.is_contiguous() and seq_lens.is_contiguous(), "metadata must be contiguous")
    if out is not None:
        _require(out.shape == query.shape and out.dtype == query.dtype, "out must match query's shape and dtype")
        _require(out.stride(2) == 1 and out.device == query.device, "out must be contiguous in head_dim, same device")
    for t in (query, block_tables, query_start_loc, seq_lens):
        _require(t.device == key_cache.device, "all tensors must be on the cache's device")
    if value_checks_enabled(key_cache.device) and num_seqs > 0:
        _check_metadata_values(query, block_tables, query_start_loc, seq_lens, num_blocks, block_size,
                               sliding_window)
    return num_blocks, block_size, num_kv_heads, head_dim


def _check_metadata_values(
    query: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_blocks: int,
    block_size: int,
    sliding_window: int | None = None,
) -> None:
    qsl = query_start_loc.cpu().long()
    lens = seq_lens.cpu().long()
    query_lens = qsl[1:] - qsl[:-1]
    _require(int(qsl[0]) == 0, "query_start_loc[0] must be 0")
    _require(bool((query_lens >= 0).all()), "query_start_loc must be non-decreasing")
    _require(int(qsl[-1]) <= query.shape[0], f"query_start_loc[-1]={int(qsl[-1])} > num_tokens={query.shape[0]}")
    _require(bool((query_lens <= lens).all()), "a sequence has more new tokens than seq_len")
    max_blocks = block_tables.shape[1]
    _require(
        bool((lens <= max_blocks * block_size).all()),
        f"a seq_len exceeds block_tables capacity {max_blocks} blocks x {block_size}",
    )
    blocks_used = (lens + block_size - 1) // block_size
    cols = torch.arange(max_blocks).unsqueeze(0)
    used = cols < blocks_used.unsqueeze(1)
    if sliding_window is not None:
        # A window's first query reads from position (seq_len - query_len) - W + 1 on: the blocks
        # before it were freed by the KV manager and their entries hold no block (never read).
        first_read = (lens - query_lens - sliding_window + 1).clamp(min=0) // block_size
        used &= cols >= first_read.unsqueeze(1)
    table = block_tables[: lens.shape[0]].cpu().long()
    bad = used & ((table < 0) | (table >= num_blocks))
    _require(not bool(bad.any()), f"block_tables has block ids outside [0, {num_blocks}) in used entries")
