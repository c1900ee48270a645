"""Random paged batches for tests and benchmarks (shuffled block tables, mixed phases)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinserve.kernels.reference import ref_store_kv


@dataclass(slots=True)
class PagedBatch:
    """One step's attention inputs with a filled paged KV cache."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    new_key: torch.Tensor
    new_value: torch.Tensor
    max_query_len: int
    max_seq_len: int
    scale: float
    layout: str

    @property
    def num_real_tokens(self) -> int:
        """Tokens that belong to a sequence (the rest are padding)."""
        return int(self.query_start_loc[-1])

    def attention_args(self) -> tuple:
        """Positional arguments of ``paged_attention`` up to ``max_seq_len``."""
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.query_start_loc,
                self.seq_lens, self.scale, self.max_query_len, self.max_seq_len)


def make_paged_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    layout: str = "nhd",
    pad_tokens: int = 0,
    spare_blocks: int = 3,
    extra_table_cols: int = 1,
    fill_cache: bool = True,
    generator: torch.Generator | None = None,
) -> PagedBatch:
    """Build a batch whose blocks are scattered in a shuffled pool, with K/V already stored.

    ``fill_cache`` stores context and new tokens with the reference writer (O(tokens) Python);
    benchmarks pass False and fill the cache with random values directly instead.
    """
    if len(query_lens) != len(context_lens):
        raise ValueError("query_lens and context_lens must have the same length")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    seq_lens = [c + q for q, c in zip(query_lens, context_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_seq, default=0) + extra_table_cols
    # Entries past a sequence's blocks are deliberately junk, as the contract allows.
    table = torch.randint(0, num_blocks, (len(seq_lens), max(max_blocks, 1)), generator=gen, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
    num_q_heads = num_kv_heads * group
    num_tokens = sum(query_lens) + pad_tokens

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    cache_shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "nhd"
                   else (num_blocks, num_kv_heads, block_size, head_dim))
    key_cache = rand(*cache_shape)
    value_cache = rand(*cache_shape)
    query = rand(num_tokens, num_q_heads, head_dim)
    new_key = rand(num_tokens, num_kv_heads, head_dim)
    new_value = rand(num_tokens, num_kv_heads, head_dim)
    slots = torch.full((num_tokens,), -1, dtype=torch.int64)
    t = 0
    for i, (q, c) in enumerate(zip(query_lens, context_lens)):
        for j in range(q):
            pos = c + j
            slots[t] = int(table[i, pos // block_size]) * block_size + pos % block_size
            t += 1
    if fill_cache:
        ref_store_kv(new_key, new_value, key_cache, value_cache, slots, layout)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    dev = torch.device(device)
    return PagedBatch(
        query=query.to(dev), key_cache=key_cache.to(dev), value_cache=value_cache.to(dev),
        block_tables=table.to(dev), query_start_loc=qsl.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev), slot_mapping=slots.to(dev),
        new_key=new_key.to(dev), new_value=new_value.to(dev), max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0), scale=head_dim ** -0.5, layout=layout,
    )
