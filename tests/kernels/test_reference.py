"""The references themselves against independent dense computations."""

import pytest
import torch
import torch.nn.functional as F

from twinserve.kernels.reference import gather_sequence_kv, ref_paged_attention, ref_store_kv
from twinserve.kernels.testing import make_paged_batch


def test_ref_store_kv_writes_slots_and_skips_padding() -> None:
    key_cache = torch.zeros(4, 2, 1, 16)
    value_cache = torch.zeros(4, 2, 1, 16)
    key = torch.arange(3 * 16, dtype=torch.float32).reshape(3, 1, 16) + 1
    value = -key
    ref_store_kv(key, value, key_cache, value_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(key_cache[2, 1, 0], key[0, 0])
    assert torch.equal(value_cache[0, 0, 0], value[2, 0])
    assert int((key_cache != 0).any(-1).sum()) == 2  # the -1 token wrote nothing


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_ref_attention_matches_dense_causal_attention(layout: str, gen: torch.Generator) -> None:
    query_lens, context_lens = [3, 1, 6], [5, 12, 0]
    b = make_paged_batch(query_lens, context_lens, num_kv_heads=2, group=3, head_dim=16, block_size=4,
                         layout=layout, generator=gen)
    out = ref_paged_attention(*b.attention_args(), layout=layout)
    starts = b.query_start_loc.tolist()
    for i, (q_len, c_len) in enumerate(zip(query_lens, context_lens)):
        seq_len = q_len + c_len
        k = gather_sequence_kv(b.key_cache, b.block_tables[i], seq_len, layout)
        v = gather_sequence_kv(b.value_cache, b.block_tables[i], seq_len, layout)
        # The new tokens must sit at the end of the logical sequence.
        assert torch.equal(k[c_len:], b.new_key[starts[i]:starts[i + 1]])
        q = b.query[starts[i]:starts[i + 1]].transpose(0, 1)  # [heads, q, d]
        kh = k.transpose(0, 1).repeat_interleave(3, 0)
        vh = v.transpose(0, 1).repeat_interleave(3, 0)
        allowed = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=c_len)
        dense = F.scaled_dot_product_attention(q, kh, vh, attn_mask=allowed, scale=b.scale)
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], dense.transpose(0, 1), atol=1e-5, rtol=1e-5)
