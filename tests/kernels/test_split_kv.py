"""Split-KV: per-segment partials plus the reduction kernel, and the dispatcher's choice."""

import pytest
import torch

from twinserve.kernels import ops
from twinserve.kernels.heuristics import choose_num_splits
from twinserve.kernels.reference import ref_paged_attention
from twinserve.kernels.testing import make_paged_batch

from .conftest import DTYPES, assert_close_rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", (1, 3, 4, 8))
def test_split_decode_every_gqa_ratio(group: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    b = make_paged_batch([1, 1], [70, 23], num_kv_heads=1, group=group, head_dim=64, block_size=16,
                         dtype=dtype, generator=gen)
    out = ops.paged_attention(*b.attention_args(), split_kv=True, num_splits=2)
    assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)


@pytest.mark.parametrize("num_splits", (3, 8))
def test_more_splits_than_kv_tiles_and_odd_counts(num_splits: int, gen: torch.Generator) -> None:
    # 8 splits over 2-3 KV tiles leave empty segments that the reduction must ignore.
    b = make_paged_batch([1, 1, 1], [80, 5, 47], num_kv_heads=2, group=3, head_dim=64, block_size=16,
                         generator=gen)
    out = ops.paged_attention(*b.attention_args(), split_kv=True, num_splits=num_splits)
    assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)


def test_split_on_and_off_agree_on_a_mixed_batch(gen: torch.Generator) -> None:
    b = make_paged_batch([5, 1, 1], [60, 90, 12], num_kv_heads=1, group=4, head_dim=128, block_size=32,
                         dtype=torch.float16, generator=gen)
    split = ops.paged_attention(*b.attention_args(), split_kv=True, num_splits=4)
    whole = ops.paged_attention(*b.attention_args(), split_kv=False)
    assert_close_rows(split, ref_paged_attention(*b.attention_args()), b.num_real_tokens)
    torch.testing.assert_close(split.float(), whole.float(), atol=1e-2, rtol=1e-2)


def test_dispatcher_auto_choice_is_correct(gen: torch.Generator) -> None:
    b = make_paged_batch([1], [200], num_kv_heads=1, group=4, head_dim=64, block_size=16, generator=gen)
    # One sequence x one KV head cannot fill the (nominal) device, so auto picks split-KV.
    assert choose_num_splits(1, 1, b.max_seq_len, 32, num_sms=4) > 1
    out = ops.paged_attention(*b.attention_args(), split_kv=None)
    assert_close_rows(out, ref_paged_attention(*b.attention_args()), b.num_real_tokens)


def test_num_splits_heuristic() -> None:
    # H200-like device (132 SMs): batch 1 with 8 KV heads at 32k splits deeply ...
    assert choose_num_splits(1, 8, 32768, 64, num_sms=132) == 32
    # ... short contexts are capped by the tiles available ...
    assert choose_num_splits(1, 8, 512, 64, num_sms=132) == 2
    # ... and large batches already fill the device.
    assert choose_num_splits(64, 8, 32768, 64, num_sms=132) == 1
    assert choose_num_splits(256, 1, 1 << 20, 64, num_sms=132) == 1
    # 16 x 8 = 128 programs on 132 SMs: two splits per sequence.
    assert choose_num_splits(16, 8, 32768, 64, num_sms=132) == 2
