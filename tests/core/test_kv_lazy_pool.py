"""The block pool makes blocks on first use; it must hand out, free and order them exactly as a
pool built eagerly does (the simulator relies on it: its pools hold millions of blocks)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from twinserve.core.kv.block_pool import BlockPool

NUM_BLOCKS = 16

# take n | free a subset of the held blocks (in a drawn order) | touch freed blocks (a prefix hit)
OPS = st.lists(st.one_of(
    st.tuples(st.just("take"), st.integers(0, 8)),
    st.tuples(st.just("free"), st.lists(st.integers(0, 10**6), max_size=10)),
    st.tuples(st.just("touch"), st.lists(st.integers(0, 10**6), max_size=3)),
), max_size=40)


def _play(pool: BlockPool, ops: list, inspect: bool = True) -> list:
    held: list = []
    freed: list = []
    trace: list = []
    for op, arg in ops:
        if op == "take":
            n = min(arg, pool.num_free_blocks)
            got = pool.get_new_blocks(n)
            held += got
            trace.append(("take", [b.block_id for b in got]))
        elif op == "free" and held:
            picked = list(dict.fromkeys(held[i % len(held)] for i in arg))
            for b in picked:
                held.remove(b)
            pool.free_blocks(picked)
            freed += [b for b in picked if b.ref_cnt == 0]
            trace.append(("free", [b.block_id for b in picked]))
        elif op == "touch" and freed:
            picked = list(dict.fromkeys(freed[i % len(freed)] for i in arg))
            for b in picked:
                freed.remove(b)
            pool.touch(picked)
            held += picked
            trace.append(("touch", [b.block_id for b in picked]))
        trace.append(("free_count", pool.num_free_blocks))
    if inspect:  # makes every block (a run never does: its pool hands on only what it made)
        trace.append(("queue", [b.block_id for b in pool.free_queue]))
        trace.append(("blocks", [(b.block_id, b.ref_cnt) for b in pool.blocks]))
    return trace


@given(OPS)
def test_a_lazy_pool_hands_out_frees_and_orders_blocks_as_an_eager_one(ops: list) -> None:
    eager = BlockPool(NUM_BLOCKS, enable_caching=True)
    assert len(eager.blocks) == NUM_BLOCKS  # made up front, as the pool was before
    lazy = BlockPool(NUM_BLOCKS, enable_caching=True)
    assert _play(lazy, ops) == _play(eager, ops)


def test_a_pool_of_millions_makes_only_the_blocks_it_hands_out() -> None:
    pool = BlockPool(5_000_000, enable_caching=False)
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [0, 1, 2] and pool.num_free_blocks == 4_999_997
    pool.free_blocks(got[::-1])
    assert len(pool.free_queue.created) == 3
    # Never-used blocks stay at the front of the LRU queue, ahead of the freed ones.
    assert [b.block_id for b in pool.get_new_blocks(2)] == [3, 4]
    assert len(pool.free_queue.created) == 5


def test_a_fresh_block_has_every_field_of_a_constructed_one_held_once() -> None:
    # take_fresh sets the slots itself (no __init__ frame): each must match KVCacheBlock(i), ref 1.
    from twinserve.core.kv.block_pool import KVCacheBlock

    pool = BlockPool(4)
    # One block and several take different paths in take_fresh: both are checked.
    for block in pool.get_new_blocks(1) + pool.get_new_blocks(2):
        want = KVCacheBlock(block.block_id)
        want.ref_cnt = 1
        assert [getattr(block, s) for s in KVCacheBlock.__slots__] == \
            [getattr(want, s) for s in KVCacheBlock.__slots__]
    assert [b.block_id for b in pool.blocks[:3]] == [0, 1, 2]


@given(OPS, OPS, st.integers(0, NUM_BLOCKS))
def test_a_pool_of_recycled_blocks_behaves_as_a_new_one(first: list, ops: list, dirty: int) -> None:
    # A finished simulation's pool hands its blocks on (BlockPool.recycle); the next pool takes
    # them as it would make new ones: same ids, fields, order and queue, whatever state they had.
    from twinserve.core.kv import block_pool
    from twinserve.core.kv.block_pool import KVCacheBlock

    block_pool._SPARE.clear()
    old = BlockPool(NUM_BLOCKS, enable_caching=True)
    _play(old, first)
    for block in old.free_queue.created[:dirty]:  # as a run leaves them: keyed, chained, linked
        block.block_hash, block.pending, block.ref_cnt = (7, b"k"), object(), 3
        block.prev_free = block.next_free = block
    made = len(old.free_queue.created)
    old.recycle()
    assert sum(map(len, block_pool._SPARE)) == made and old.num_free_blocks == 0
    try:
        old.get_new_blocks(1)
        raise AssertionError("a recycled pool handed out a block")
    except ValueError:
        pass
    reused = BlockPool(NUM_BLOCKS, enable_caching=True)
    got = reused.get_new_blocks(NUM_BLOCKS)
    for block in got:
        want = KVCacheBlock(block.block_id)
        want.ref_cnt = 1
        assert [getattr(block, s) for s in KVCacheBlock.__slots__] == \
            [getattr(want, s) for s in KVCacheBlock.__slots__]
    assert [b.block_id for b in got] == list(range(NUM_BLOCKS))
    block_pool._SPARE.clear()
    old.recycle()  # twice: nothing more to give
    assert not block_pool._SPARE
    again, fresh = BlockPool(NUM_BLOCKS, enable_caching=True), BlockPool(NUM_BLOCKS)
    block_pool._SPARE.append(reused.free_queue.created[:])  # as recycle() would
    reused.free_queue.created.clear()
    assert _play(again, ops) == _play(fresh, ops)
    block_pool._SPARE.clear()


def _dirty(pool: BlockPool) -> None:
    """Leave every block made as a run leaves it: keyed, chained, linked, held."""
    for block in pool.free_queue.created:
        block.block_hash, block.pending, block.ref_cnt = (7, b"k"), object(), 3
        block.prev_free = block.next_free = block


@given(st.lists(st.tuples(st.integers(1, 24), OPS, st.booleans(), st.booleans()), min_size=1, max_size=5),
       st.integers(0, 40))
def test_pools_made_on_each_others_shelves_behave_as_new_ones(runs: list, cap: int) -> None:
    # Pools of drawn sizes, made one after another (a cluster's several at once), each on what the
    # ones before recycled: every pool's ids, fields, order and queue as a new pool's, and every
    # shelf keeps block i at index i (a shelf's blocks are handed out without a new id).
    from twinserve.core.kv import block_pool
    from twinserve.core.kv.block_pool import KVCacheBlock

    saved, saved_max = block_pool._SPARE[:], block_pool._SPARE_MAX
    block_pool._SPARE.clear()
    block_pool._SPARE_MAX = cap
    try:
        live: list[BlockPool] = []
        for size, ops, inspect, recycle_now in runs:
            spare = block_pool._SPARE[:]
            block_pool._SPARE.clear()
            want = _play(BlockPool(size), ops, inspect)  # a new pool, on new blocks
            block_pool._SPARE[:] = spare
            pool = BlockPool(size)
            assert _play(pool, ops, inspect) == want
            made = pool.free_queue.created
            assert [b.block_id for b in made] == list(range(len(made)))
            assert all(b.block_hash is None and b.pending is None for b in made)
            _dirty(pool)
            live.append(pool)
            if recycle_now:
                for old in live:
                    old.recycle()
                live.clear()
            for shelf in block_pool._SPARE:
                assert [b.block_id for b in shelf] == list(range(len(shelf)))
            assert sum(map(len, block_pool._SPARE)) <= cap
        # A shelf's blocks are never in two pools: a new pool on every shelf hands each out once.
        pools = [BlockPool(64) for _ in block_pool._SPARE]
        got = [b for p in pools for b in p.get_new_blocks(64)]
        assert len({id(b) for b in got}) == len(got)
        for block in got:
            want = KVCacheBlock(block.block_id)
            want.ref_cnt = 1
            assert [getattr(block, s) for s in KVCacheBlock.__slots__] == \
                [getattr(want, s) for s in KVCacheBlock.__slots__]
    finally:
        block_pool._SPARE[:] = saved
        block_pool._SPARE_MAX = saved_max


@given(st.integers(1, 40), st.integers(0, 40), st.integers(1, 40))
def test_a_pool_that_took_part_of_its_shelf_hands_the_shelf_itself_back(shelf_len: int, take: int,
                                                                          size: int) -> None:
    # recycle() gives back the claimed shelf list itself when the pool made nothing past its end
    # (no copy of its untaken, cold tail), else what it made plus the shelf's tail; either way
    # block i at index i, every block the pool made or left untaken, none twice.
    from twinserve.core.kv import block_pool

    saved, saved_max = block_pool._SPARE[:], block_pool._SPARE_MAX
    block_pool._SPARE.clear()
    block_pool._SPARE_MAX = 1 << 19
    try:
        first = BlockPool(shelf_len)
        first.get_new_blocks(shelf_len)
        first.recycle()
        (shelf,) = block_pool._SPARE
        pool = BlockPool(size)
        got = pool.get_new_blocks(min(take, size))
        _dirty(pool)
        made = pool.free_queue.created[:]
        pool.recycle()
        (back,) = block_pool._SPARE
        if len(made) <= shelf_len:
            assert back is shelf
        want = made + shelf[len(made):]
        assert len(back) == len(want) and all(a is b for a, b in zip(back, want))
        assert [b.block_id for b in back] == list(range(len(back)))
        assert all(b in back for b in got)
    finally:
        block_pool._SPARE[:] = saved
        block_pool._SPARE_MAX = saved_max
