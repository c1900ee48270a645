"""Hypothesis-driven random batches: any mix of phases, block sizes, ratios and splits."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.kernels import ops
from twinserve.kernels.reference import ref_paged_attention
from twinserve.kernels.testing import make_paged_batch

from .conftest import assert_close_rows

sequence = st.tuples(st.integers(0, 12), st.integers(0, 70))  # (new tokens, cached context)


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(sequence, min_size=1, max_size=4),
    group=st.sampled_from([1, 3, 4, 8]),
    num_kv_heads=st.integers(1, 2),
    block_size=st.sampled_from([16, 32]),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    split_kv=st.sampled_from([None, False, True]),
    pad_tokens=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_random_batches_match_reference(seqs: list[tuple[int, int]], group: int, num_kv_heads: int,
                                        block_size: int, head_dim: int, dtype: torch.dtype,
                                        split_kv: bool | None, pad_tokens: int, seed: int) -> None:
    query_lens = [q for q, _ in seqs]
    # Sequences with 0 new tokens stand in for padded (CUDA-graph) batch slots.
    context_lens = [c for _, c in seqs]
    b = make_paged_batch(query_lens, context_lens, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                         block_size=block_size, dtype=dtype, pad_tokens=pad_tokens,
                         generator=torch.Generator().manual_seed(seed))
    out = ops.paged_attention(*b.attention_args(), split_kv=split_kv)
    assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)
