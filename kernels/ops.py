"""Dispatcher: the entry points the engine's attention backend calls.

Same signatures as ``twinserve.kernels.reference``; on CPU tensors they run only under
Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported).
"""

from __future__ import annotations

import os

import torch

from twinserve.kernels.checks import cache_strides, check_attention_args, check_store_args
from twinserve.kernels.heuristics import CPU_NOMINAL_SMS, AttentionConfig, choose_config, choose_num_splits
from twinserve.kernels.kv_store import launch_store_kv
from twinserve.kernels.paged_attention import launch_paged_attention
from twinserve.kernels.split_kv import launch_reduce_splits


class KernelUnavailableError(RuntimeError):
    """Triton cannot run on this device in this process."""


def interpreter_active() -> bool:
    """Whether Triton was put in interpreter mode (it is read when kernels are decorated)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of ``device`` in this process."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and not interpreter_active()
    return device.type == "cpu" and interpreter_active()


def _require_triton(device: torch.device, dtype: torch.dtype) -> None:
    if not triton_available(device):
        raise KernelUnavailableError(
            f"Triton kernels cannot run on {device} here: on CPU set TRITON_INTERPRET=1 before "
            "importing triton (tests only; it is slow), or use twinserve.kernels.reference"
        )
    if device.type == "cpu" and dtype == torch.bfloat16:
        # The interpreter computes bf16 silently wrong; refusing beats a wrong answer.
        raise KernelUnavailableError("bf16 is not supported under Triton's interpreter; use fp32/fp16 on CPU")


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NOMINAL_SMS


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: str = "nhd",
) -> None:
    """Write each token's K/V into the paged cache at ``slot_mapping`` (-1 = skip), in place."""
    _, block_size, _, _ = check_store_args(key, value, key_cache, value_cache, slot_mapping, layout)
    _require_triton(key_cache.device, key_cache.dtype)
    launch_store_kv(key, value, key_cache, value_cache, slot_mapping, cache_strides(key_cache, layout), block_size)


def paged_attention(
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
    *,
    num_splits: int | None = None,
    config: AttentionConfig | None = None,
    layout: str = "nhd",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal paged attention for a flat varlen batch (prefill chunks and decodes mixed).

    ``sliding_window=W``: each token sees its last W positions; earlier blocks are not read.
    ``max_query_len``/``max_seq_len`` only pick tiles and the split-KV path. ``split_kv=None`` splits
    under-filled pure-decode batches; ``num_splits`` fixes the count (constant for CUDA graphs).
    Rows past ``query_start_loc[-1]`` are left untouched.
    """
    _, block_size, num_kv_heads, head_dim = check_attention_args(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out, layout, sliding_window
    )
    _require_triton(query.device, query.dtype)
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    if out is None:
        out = torch.empty_like(query)
    num_tokens, num_q_heads, _ = query.shape
    group = num_q_heads // num_kv_heads
    on_gpu = query.device.type == "cuda"
    if config is None:
        config = choose_config(group, head_dim, max_query_len, on_gpu)
    if config.block_m < group:
        raise ValueError(f"config.block_m={config.block_m} is smaller than the GQA group {group}")
    # The split heuristic sees the window's length, which bounds what each token reads.
    kv_len = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window + max_query_len - 1)
    splits = resolve_num_splits(split_kv, num_splits, max_query_len, seq_lens.shape[0], num_kv_heads, kv_len,
                             config.block_n, query.device)
    strides = cache_strides(key_cache, layout)
    common = dict(
        cache_strides=strides,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        block_m=config.block_m,
        block_n=config.block_n,
        num_splits=splits,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        sliding_window=sliding_window,
    )
    if splits == 1:
        launch_paged_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                               out, None, **common)
        return out
    partial = torch.empty((splits, num_tokens, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
    lse = torch.empty((splits, num_tokens, num_q_heads), dtype=torch.float32, device=query.device)
    launch_paged_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                           partial, lse, **common)
    launch_reduce_splits(partial, lse, out, query_start_loc)
    return out


def resolve_num_splits(
    split_kv: bool | None,
    num_splits: int | None,
    max_query_len: int,
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    block_n: int,
    device: torch.device,
) -> int:
    """The split count ``paged_attention`` will launch with (1 = no split-KV)."""
    if num_splits is not None:
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        return 1 if split_kv is False else num_splits
    if split_kv is False:
        return 1
    auto = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, block_n, _num_sms(device))
    if split_kv is None:
        return auto if max_query_len == 1 else 1
    return max(2, auto)
