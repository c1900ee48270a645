"""Benchmark helpers for the attention kernels: vectorised batch builders, byte/FLOP counts, timers."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

# Published peak HBM bandwidth (bytes/s), matched by substring of the device name, most specific first.
PEAK_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("H20", 4.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("A10G", 0.6e12),
    ("L4", 0.3e12),
    ("RTX 4090", 1.008e12),
)


def peak_bandwidth(device_name: str) -> float | None:
    """Peak memory bandwidth in bytes/s for a known device name, else None."""
    for key, bandwidth in PEAK_BANDWIDTH:
        if key.lower() in device_name.lower():
            return bandwidth
    return None


def random_cache_pool(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """One big K and V cache ("nhd") filled with N(0, 1) values, shared by every benchmark case."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.empty(shape, dtype=dtype, device=device).normal_()
    value_cache = torch.empty(shape, dtype=dtype, device=device).normal_()
    return key_cache, value_cache


def scattered_block_tables(num_seqs: int, seq_len: int, block_size: int, num_pool_blocks: int,
                           generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """Distinct blocks drawn at random from the pool: int32 ``[num_seqs, ceil(seq_len / block_size)]``."""
    blocks_per_seq = -(-seq_len // block_size)
    needed = num_seqs * blocks_per_seq
    if needed > num_pool_blocks:
        raise ValueError(f"{needed} blocks needed but the pool has {num_pool_blocks}")
    perm = torch.randperm(num_pool_blocks, generator=generator)[:needed]
    return perm.view(num_seqs, blocks_per_seq).to(device=device, dtype=torch.int32)


def varlen_metadata(query_lens: list[int], seq_lens: list[int],
                    device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``query_start_loc`` and ``seq_lens`` int32 tensors for a flat varlen batch."""
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    return qsl.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device)


def attention_bytes(query_lens: list[int], seq_lens: list[int], num_q_heads: int, num_kv_heads: int,
                    head_dim: int, elem_bytes: int) -> int:
    """Minimum HBM traffic: each sequence's K and V read once, queries read and outputs written once."""
    kv = sum(seq_lens) * num_kv_heads * head_dim * elem_bytes * 2
    q_and_out = sum(query_lens) * num_q_heads * head_dim * elem_bytes * 2
    return kv + q_and_out


def attention_flops(query_lens: list[int], seq_lens: list[int], num_q_heads: int, head_dim: int) -> int:
    """Useful causal-attention FLOPs (QK^T and PV, 2 FLOPs per multiply-add)."""
    total = 0
    for q, s in zip(query_lens, seq_lens):
        context = s - q
        visible_pairs = q * context + q * (q + 1) // 2
        total += 4 * num_q_heads * head_dim * visible_pairs
    return total


def time_call(fn: Callable[[], object], device: torch.device, warmup: int = 3, iters: int = 10) -> float:
    """Median seconds per call (CUDA events on GPU, wall clock elsewhere)."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[len(samples) // 2]
