"""Host-side checks reject what the kernels would read out of bounds silently."""

import pytest
import torch

from twinserve.kernels import ops
from twinserve.kernels.checks import KernelArgumentError
from twinserve.kernels.heuristics import AttentionConfig, choose_config
from twinserve.kernels.testing import make_paged_batch


@pytest.fixture
def batch():
    """A small valid mixed batch whose arguments each test corrupts one at a time."""
    return make_paged_batch([3, 1], [20, 9], num_kv_heads=2, group=2, head_dim=64, block_size=16)


def _args(b, **changes):
    names = ["query", "key_cache", "value_cache", "block_tables", "query_start_loc", "seq_lens", "scale",
             "max_query_len", "max_seq_len"]
    values = dict(zip(names, b.attention_args()))
    values.update(changes)
    return [values[n] for n in names]


def test_valid_batch_passes(batch) -> None:
    ops.paged_attention(*_args(batch))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: {"block_tables": torch.where(b.block_tables == b.block_tables[0, 0], 10_000, b.block_tables)},
         "block ids"),
        (lambda b: {"seq_lens": torch.tensor([20 + 3, 200], dtype=torch.int32)}, "capacity"),
        (lambda b: {"seq_lens": torch.tensor([2, 10], dtype=torch.int32)}, "more new tokens"),
        (lambda b: {"query_start_loc": torch.tensor([0, 3, 9], dtype=torch.int32)}, "num_tokens"),
        (lambda b: {"query_start_loc": torch.tensor([1, 3, 4], dtype=torch.int32)}, r"\[0\] must be 0"),
        (lambda b: {"seq_lens": b.seq_lens.long()}, "int32"),
        (lambda b: {"block_tables": b.block_tables.long()}, "int32"),
        (lambda b: {"query": b.query.half()}, "dtype"),
        (lambda b: {"query": b.query[:, :3]}, "divisible"),
        (lambda b: {"value_cache": b.value_cache[:, :8]}, "same shape"),
    ],
)
def test_bad_arguments_raise(batch, change, message: str) -> None:
    with pytest.raises(KernelArgumentError, match=message):
        ops.paged_attention(*_args(batch, **change(batch)))


def test_config_rejects_tiles_under_16() -> None:
    with pytest.raises(ValueError, match=">= 16"):
        AttentionConfig(block_m=8, block_n=32)
    with pytest.raises(ValueError, match="powers of two"):
        AttentionConfig(block_m=16, block_n=48)


def test_choose_config_packs_gqa_groups() -> None:
    assert choose_config(group=8, head_dim=64, max_query_len=1, on_gpu=True).block_m == 16
    assert choose_config(group=32, head_dim=64, max_query_len=1, on_gpu=True).block_m == 32
    assert choose_config(group=3, head_dim=128, max_query_len=500, on_gpu=True).block_m == 64


def test_triton_availability_is_reported() -> None:
    assert ops.triton_available("cpu")  # the suite runs under the interpreter
    if not torch.cuda.is_available():
        assert not ops.triton_available("cuda")


def test_bf16_is_refused_under_the_interpreter(batch) -> None:
    args = _args(batch, query=batch.query.bfloat16(), key_cache=batch.key_cache.bfloat16(),
                 value_cache=batch.value_cache.bfloat16())
    with pytest.raises(ops.KernelUnavailableError, match="bf16"):
        ops.paged_attention(*args)
