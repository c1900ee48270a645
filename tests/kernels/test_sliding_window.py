"""Sliding-window paged attention: the reference, the engine's torch path and the Triton kernel.

Each path must agree with a dense oracle, and must not read blocks that lie wholly before
every query's window: those are filled with NaN, which any read would spread to the output.
"""

import pytest
import torch

from twinserve.backends.real.attention import AttentionMetadata, TorchPagedAttention
from twinserve.kernels import ops
from twinserve.kernels.checks import KernelArgumentError
from twinserve.kernels.reference import gather_sequence_kv, ref_paged_attention
from twinserve.kernels.testing import PagedBatch, make_paged_batch

from .conftest import DTYPES, assert_close_rows

# Decodes first (the engine's order), then prefill chunks over context and a fresh prompt
# longer than the window; contexts straddle block edges and the window.
QUERY = [1, 1, 1, 9, 30, 5]
CONTEXT = [3, 17, 50, 40, 0, 26]


def dense_windowed(b: PagedBatch, window: int | None) -> torch.Tensor:
    """Attention over each whole sequence with an explicit (causal, windowed) mask: the oracle."""
    out = torch.zeros_like(b.query, dtype=torch.float32)
    starts = b.query_start_loc.tolist()
    hkv = b.key_cache.shape[2]
    group = b.query.shape[1] // hkv
    for i, s in enumerate(b.seq_lens.tolist()):
        q0, q1 = starts[i], starts[i + 1]
        ctx = s - (q1 - q0)
        k = gather_sequence_kv(b.key_cache, b.block_tables[i], s).float().repeat_interleave(group, 1)
        v = gather_sequence_kv(b.value_cache, b.block_tables[i], s).float().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", b.query[q0:q1].float(), k) * b.scale
        qp = ctx + torch.arange(q1 - q0)[:, None]
        kp = torch.arange(s)[None, :]
        ok = kp <= qp
        if window is not None:
            ok &= kp > qp - window
        scores = scores.masked_fill(~ok, float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out.to(b.query.dtype)


def poison_outside_windows(b: PagedBatch, window: int) -> int:
    """Fill with NaN every block that lies wholly before all of its sequence's query windows."""
    bs = b.key_cache.shape[1]
    starts = b.query_start_loc.tolist()
    n = 0
    for i, s in enumerate(b.seq_lens.tolist()):
        ctx = s - (starts[i + 1] - starts[i])
        first_needed = max(0, ctx - window + 1) // bs
        for j in range(first_needed):
            blk = int(b.block_tables[i, j])
            b.key_cache[blk] = float("nan")
            b.value_cache[blk] = float("nan")
            n += 1
    return n


def torch_path(b: PagedBatch, window: int | None) -> torch.Tensor:
    """The engine's CPU attention (TorchPagedAttention) on the batch; the new K/V are stored again."""
    lens = (b.query_start_loc[1:] - b.query_start_loc[:-1]).tolist()
    nd = 0
    while nd < len(lens) and lens[nd] == 1:
        nd += 1
    n = b.num_real_tokens
    meta = AttentionMetadata(n, nd, b.query_start_loc, b.seq_lens, b.block_tables, b.slot_mapping[:n],
                             max(lens), int(b.seq_lens.max()), lens, b.seq_lens.tolist())
    backend = TorchPagedAttention()
    backend.plan(meta, b.key_cache.shape[1], b.key_cache.shape[2])
    return backend.forward(b.query[:n], b.new_key[:n], b.new_value[:n], b.key_cache, b.value_cache, meta,
                           b.scale, sliding_window=window)


@pytest.mark.parametrize("window", [1, 4, 16, 23])
def test_reference_window_equals_dense_mask(window: int, gen: torch.Generator) -> None:
    b = make_paged_batch(QUERY, CONTEXT, num_kv_heads=2, group=2, head_dim=16, block_size=8, generator=gen)
    expected = dense_windowed(b, window)
    assert_close_rows(ref_paged_attention(*b.attention_args(), sliding_window=window), expected, b.num_real_tokens)
    # A window this short must change some rows, or the test checks nothing.
    assert not torch.allclose(dense_windowed(b, None), expected, atol=1e-3)


@pytest.mark.parametrize("window", [5, 16, 23])
def test_paths_read_only_the_window(window: int, gen: torch.Generator) -> None:
    b = make_paged_batch(QUERY, CONTEXT, num_kv_heads=2, group=2, head_dim=16, block_size=8, generator=gen)
    expected = dense_windowed(b, window)
    assert poison_outside_windows(b, window) > 0
    for out in (ref_paged_attention(*b.attention_args(), sliding_window=window), torch_path(b, window)):
        assert torch.isfinite(out[:b.num_real_tokens]).all()
        assert_close_rows(out, expected, b.num_real_tokens)


def test_torch_path_equals_reference_without_window(gen: torch.Generator) -> None:
    b = make_paged_batch(QUERY, CONTEXT, num_kv_heads=2, group=2, head_dim=16, block_size=8, generator=gen)
    assert_close_rows(torch_path(b, None), dense_windowed(b, None), b.num_real_tokens)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("window", [3, 16, 40])
def test_triton_window_equals_reference(window: int, split_kv: bool, dtype: torch.dtype,
                                        gen: torch.Generator) -> None:
    b = make_paged_batch(QUERY if not split_kv else [1] * 4, CONTEXT if not split_kv else [5, 33, 60, 47],
                         num_kv_heads=2, group=2, head_dim=16, block_size=16, dtype=dtype, generator=gen)
    expected = ref_paged_attention(*b.attention_args(), sliding_window=window)
    poison_outside_windows(b, window)
    out = ops.paged_attention(*b.attention_args(), split_kv=split_kv, num_splits=3 if split_kv else None,
                              sliding_window=window)
    assert torch.isfinite(out[:b.num_real_tokens]).all()
    assert_close_rows(out, expected, b.num_real_tokens)


def test_triton_rejects_a_zero_window(gen: torch.Generator) -> None:
    b = make_paged_batch([1], [4], num_kv_heads=1, group=1, head_dim=16, block_size=16, generator=gen)
    with pytest.raises(ValueError, match="sliding_window"):
        ops.paged_attention(*b.attention_args(), sliding_window=0)


def free_outside_windows(b: PagedBatch, window: int) -> int:
    """Write -1 (no block) into the table entries wholly before every query's window, as the KV manager
    leaves them once it has freed those blocks; returns how many."""
    bs = b.key_cache.shape[1]
    starts = b.query_start_loc.tolist()
    n = 0
    for i, s in enumerate(b.seq_lens.tolist()):
        first_needed = max(0, s - (starts[i + 1] - starts[i]) - window + 1) // bs
        b.block_tables[i, :first_needed] = -1
        n += first_needed
    return n


@pytest.mark.parametrize("split_kv", [False, True])
def test_triton_window_takes_freed_entries_before_the_window(split_kv: bool, gen: torch.Generator) -> None:
    # The engine's tables hold no block before a window once the KV manager freed them: the
    # argument checks must accept those entries (they refused them, so every CPU Triton step of a
    # sliding-window model died) and the kernel must not read them.
    b = make_paged_batch(QUERY if not split_kv else [1] * 4, CONTEXT if not split_kv else [5, 33, 60, 47],
                         num_kv_heads=2, group=2, head_dim=16, block_size=8, generator=gen)
    window = 11
    expected = ref_paged_attention(*b.attention_args(), sliding_window=window)
    assert free_outside_windows(b, window) > 0
    out = ops.paged_attention(*b.attention_args(), split_kv=split_kv, num_splits=3 if split_kv else None,
                              sliding_window=window)
    assert_close_rows(out, expected, b.num_real_tokens)


def test_triton_window_still_refuses_a_missing_block_inside_the_window(gen: torch.Generator) -> None:
    b = make_paged_batch([1], [40], num_kv_heads=1, group=1, head_dim=16, block_size=8, generator=gen)
    b.block_tables[0, 3] = -1  # positions 24-31: inside a window of 20 ending at position 40
    with pytest.raises(KernelArgumentError, match="outside"):
        ops.paged_attention(*b.attention_args(), sliding_window=20)
