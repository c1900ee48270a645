"""BlockPool.get_new_blocks without a prefix cache walks the free queue without its eviction checks
(no block has a key or a pending chain there): the same blocks, order, counts and fields as the
general walk."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core.kv.block_pool import BlockPool

NUM_BLOCKS = 40


def _play(pool: BlockPool, ops: list[tuple[bool, int]]) -> list:
    held: list = []
    trace = []
    for take, n in ops:
        if take:
            n = min(n, pool.num_free_blocks)
            got = pool.get_new_blocks(n)
            held.append(got)
            trace.append(("take", [(b.block_id, b.ref_cnt, b.block_hash, b.pending, b.prev_free, b.next_free)
                                   for b in got]))
        elif held:
            blocks = held.pop(n % len(held))
            pool.free_blocks(blocks[::-1] if n % 2 else blocks)
        trace.append(("free", pool.num_free_blocks, pool.num_evictions))
    trace.append(("queue", [b.block_id for b in pool.free_queue]))
    trace.append(("blocks", [(b.block_id, b.ref_cnt) for b in pool.blocks]))
    return trace


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 25)), max_size=40))
def test_an_uncached_pool_hands_out_what_the_general_walk_does(ops) -> None:
    uncached = BlockPool(NUM_BLOCKS, enable_caching=False)
    general = BlockPool(NUM_BLOCKS, enable_caching=True)  # nothing is ever cached: the general walk, same blocks
    assert _play(uncached, ops) == _play(general, ops)


def test_the_uncached_walk_takes_freed_blocks_in_lru_order() -> None:
    pool = BlockPool(6, enable_caching=False)
    first = pool.get_new_blocks(6)
    pool.free_blocks([first[3], first[1], first[5]])
    got = pool.get_new_blocks(2)  # the walk (no fresh block left): least recently freed first
    assert [b.block_id for b in got] == [3, 1] and all(b.ref_cnt == 1 for b in got)
    assert pool.num_free_blocks == 1 and [b.block_id for b in pool.free_queue] == [5]
    pool.free_blocks(got)
    assert [b.block_id for b in pool.free_queue] == [5, 3, 1]
