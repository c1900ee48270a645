"""The Triton KV store kernel against the reference writer."""

import pytest
import torch

from twinserve.kernels import ops
from twinserve.kernels.checks import KernelArgumentError
from twinserve.kernels.reference import ref_store_kv

from .conftest import DTYPES


def _random_store_case(block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, layout: str,
                       gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    num_blocks, num_tokens = 5, 11
    shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "nhd"
             else (num_blocks, num_kv_heads, block_size, head_dim))
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1
    return key, value, key_cache, value_cache, slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize(("block_size", "num_kv_heads", "head_dim"), [(16, 3, 64), (32, 1, 128), (16, 2, 80)])
def test_store_kv_matches_reference(dtype: torch.dtype, layout: str, block_size: int, num_kv_heads: int,
                                    head_dim: int, gen: torch.Generator) -> None:
    key, value, key_cache, value_cache, slots = _random_store_case(block_size, num_kv_heads, head_dim, dtype,
                                                                   layout, gen)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    ref_store_kv(key, value, expected_k, expected_v, slots, layout)
    before = key_cache.clone()
    ops.store_kv(key, value, key_cache, value_cache, slots, layout=layout)
    assert not torch.equal(before, key_cache)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_store_kv_accepts_strided_key_and_value(gen: torch.Generator) -> None:
    # A fused QKV projection yields K/V views with a token stride larger than heads*dim.
    qkv = torch.randn(6, 3, 2, 64, generator=gen)
    key, value = qkv[:, 1], qkv[:, 2]
    key_cache, value_cache = torch.zeros(2, 16, 2, 64), torch.zeros(2, 16, 2, 64)
    slots = torch.tensor([0, 17, 3, -1, 31, 8])
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    ref_store_kv(key, value, expected_k, expected_v, slots)
    ops.store_kv(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_store_kv_rejects_out_of_range_slots() -> None:
    key = torch.zeros(2, 1, 16)
    cache = torch.zeros(2, 16, 1, 16)
    with pytest.raises(KernelArgumentError, match="slot_mapping"):
        ops.store_kv(key, key, cache, cache.clone(), torch.tensor([0, 32]))
    with pytest.raises(KernelArgumentError, match="int64"):
        ops.store_kv(key, key, cache, cache.clone(), torch.tensor([0, 1], dtype=torch.int32))
