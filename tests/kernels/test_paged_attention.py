"""The unified Triton paged-attention kernel against the reference (split-KV off)."""

import pytest
import torch

from twinserve.kernels import ops
from twinserve.kernels.heuristics import AttentionConfig
from twinserve.kernels.reference import ref_paged_attention
from twinserve.kernels.testing import make_paged_batch

from .conftest import DTYPES, assert_close_rows

GQA_RATIOS = (1, 3, 4, 8)
# Prefill chunks over cached context, fresh prompts and decodes in one batch; context
# lengths deliberately straddle block boundaries (never all multiples of 16 or 32).
MIXED_QUERY = [7, 1, 20, 1, 3]
MIXED_CONTEXT = [21, 40, 0, 15, 33]


def _check(b, split_kv: bool | None = False, **kwargs) -> torch.Tensor:
    expected = ref_paged_attention(*b.attention_args(), layout=b.layout)
    out = ops.paged_attention(*b.attention_args(), split_kv=split_kv, layout=b.layout, **kwargs)
    assert out.shape == b.query.shape and out.dtype == b.query.dtype
    assert_close_rows(out, expected, b.num_real_tokens)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", GQA_RATIOS)
def test_mixed_batch_every_gqa_ratio(group: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    b = make_paged_batch(MIXED_QUERY, MIXED_CONTEXT, num_kv_heads=2, group=group, head_dim=64, block_size=16,
                         dtype=dtype, generator=gen)
    _check(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_size_32_head_dim_128(dtype: torch.dtype, gen: torch.Generator) -> None:
    b = make_paged_batch([9, 1, 2], [35, 70, 0], num_kv_heads=1, group=4, head_dim=128, block_size=32,
                         dtype=dtype, generator=gen)
    _check(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pure_prefill(dtype: torch.dtype, gen: torch.Generator) -> None:
    # 40 tokens x group 3 spans several query tiles of one sequence.
    b = make_paged_batch([40, 5, 17], [0, 0, 0], num_kv_heads=1, group=3, head_dim=64, block_size=16,
                         dtype=dtype, generator=gen)
    _check(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pure_decode(dtype: torch.dtype, gen: torch.Generator) -> None:
    b = make_paged_batch([1] * 6, [0, 1, 15, 16, 33, 62], num_kv_heads=2, group=4, head_dim=64, block_size=16,
                         dtype=dtype, generator=gen)
    _check(b)


def test_chunked_prefill_equals_one_shot_prefill(gen: torch.Generator) -> None:
    # The same 30-token prompt, attended as one prefill and as a 12-token chunk over an
    # 18-token cached prefix, must give identical last-chunk rows: context handling is real.
    whole = make_paged_batch([30], [0], num_kv_heads=1, group=3, head_dim=64, block_size=16, generator=gen)
    full_out = ops.paged_attention(*whole.attention_args(), split_kv=False)
    chunk_args = list(whole.attention_args())
    chunk_args[0] = whole.query[18:]
    chunk_args[4] = torch.tensor([0, 12], dtype=torch.int32)
    chunk_args[7] = 12
    chunk_out = ops.paged_attention(*chunk_args, split_kv=False)
    torch.testing.assert_close(chunk_out, full_out[18:], atol=1e-5, rtol=1e-5)


def test_hnd_layout(gen: torch.Generator) -> None:
    b = make_paged_batch(MIXED_QUERY, MIXED_CONTEXT, num_kv_heads=2, group=3, head_dim=64, block_size=16,
                         layout="hnd", generator=gen)
    _check(b)


@pytest.mark.parametrize(("block_size", "block_n"), [(32, 16), (16, 64)])
def test_kv_tile_smaller_and_larger_than_a_block(block_size: int, block_n: int, gen: torch.Generator) -> None:
    b = make_paged_batch([4, 1], [45, 50], num_kv_heads=1, group=4, head_dim=64, block_size=block_size,
                         generator=gen)
    _check(b, config=AttentionConfig(block_m=16, block_n=block_n))


def test_prefill_tile_of_64_rows(gen: torch.Generator) -> None:
    b = make_paged_batch([30, 1], [3, 20], num_kv_heads=1, group=2, head_dim=64, block_size=16, generator=gen)
    _check(b, config=AttentionConfig(block_m=64, block_n=32))


def test_padding_tokens_and_empty_sequences_are_left_alone(gen: torch.Generator) -> None:
    # CUDA-graph style padding: 3 trailing tokens and a padded sequence with no tokens.
    b = make_paged_batch([2, 0, 1], [9, 0, 17], num_kv_heads=1, group=4, head_dim=64, block_size=16,
                         pad_tokens=3, generator=gen)
    for split in (False, True):
        out = torch.full_like(b.query, 7.0)
        ops.paged_attention(*b.attention_args(), out=out, split_kv=split)
        assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)
        assert bool((out[b.num_real_tokens:] == 7.0).all())


def test_out_argument_is_filled_and_returned(gen: torch.Generator) -> None:
    b = make_paged_batch([3, 1], [5, 8], num_kv_heads=1, group=3, head_dim=64, block_size=16, generator=gen)
    out = torch.zeros_like(b.query)
    result = ops.paged_attention(*b.attention_args(), out=out, split_kv=False)
    assert result is out
    assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)
