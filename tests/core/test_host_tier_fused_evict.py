"""The block pool's fused evict-and-store walk (BlockPool._take_storing, an LRU host tier on one KV
group) leaves the pool, the tier and the stores exactly as the walk with its (block id, key) list
then HostTier.store_many do: same blocks, cache map, free queue, tier entries in LRU order, slots,
pins, counters and copies."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core.kv.block_pool import BlockPool
from twinserve.core.kv.hashing import BlockHash
from twinserve.core.kv.host_tier import HostTier

# Few values, two contents each: keys equal to a stored one, colliding ones and new ones all occur;
# one object per (value, content), so a key is often the tier's very object.
_KEYS = [BlockHash(v, None, (t,), None) for v in range(8) for t in range(2)]
_KEYS += [BlockHash(*k) for k in _KEYS[::3]]  # equal to a key above, another object
class _Side:
    """A pool and an LRU tier, evicting through the fused walk or through the list."""

    def __init__(self, num_blocks: int, tier_blocks: int, fused: bool) -> None:
        self.pool = BlockPool(num_blocks)
        self.pool.free_queue.materialize()  # every take walks the queue (the fused path)
        self.tier = HostTier(tier_blocks, "lru")
        self.stores: list[tuple[int, int]] = []
        self.fused = fused
        if fused:
            self.pool.tier, self.pool.stores = self.tier, self.stores
        else:
            self.pool.evicted = []
        self.held: list = []

    def take(self, keys: list[BlockHash | None], collide: bool = False) -> None:
        """Take a block per key and key it (None: left unkeyed), as a computed prefix is registered;
        collide: a block whose value another block holds keeps it without taking the map over."""
        if len(keys) > self.pool.num_free_blocks:
            return
        blocks = self.pool.get_new_blocks(len(keys))
        if not self.fused:
            self.tier.store_many(self.pool.evicted, self.stores)
            self.pool.evicted.clear()
        self.held.extend(blocks)
        for block, key in zip(blocks, keys):
            if key is None:
                continue
            old = self.pool.cached.get(key.value)
            block.block_hash = key
            if old is None or not collide:
                if old is not None:
                    old.block_hash = None  # the latest copy takes the key
                self.pool.cached[key.value] = block

    def free(self, i: int) -> None:
        if i < len(self.held):
            self.pool.free_blocks([self.held.pop(i)])

    def state(self) -> tuple:
        pool = self.pool
        return (list(self.tier.entries.items()), list(self.tier.free_slots), dict(self.tier.pins),
                self.tier.stats, list(self.stores), sorted((v, b.block_id) for v, b in pool.cached.items()),
                [b.block_id for b in pool.free_queue], [(b.block_id, b.block_hash, b.ref_cnt) for b in pool.blocks],
                pool.num_evictions)


def _run(sides: list[_Side], rng: random.Random, steps: int) -> None:
    """Drive both sides with the same random takes (keying the blocks), frees, pins and unpins."""
    for _ in range(steps):
        r = rng.random()
        if r < 0.45:
            op = ("take", [rng.choice([None, *_KEYS]) for _ in range(rng.randint(1, 4))], rng.random() < 0.15)
        elif r < 0.85:
            op = ("free", rng.randint(0, 5))
        else:
            op = ("pin" if r < 0.93 else "unpin", rng.choice(_KEYS))
        for side in sides:
            if op[0] == "take":
                side.take(op[1], op[2])
            elif op[0] == "free":
                side.free(op[1])
            elif op[0] == "pin":
                if op[1].value in side.tier.entries:
                    side.tier.pin(op[1].value)
            elif op[1].value in side.tier.pins:
                side.tier.unpin(op[1].value)
        assert sides[0].state() == sides[1].state(), op


# A seeded random walk per example: evicting a keyed block the tier holds takes several steps,
# which hypothesis's own small examples rarely reach.
@settings(max_examples=150)
@given(num_blocks=st.integers(1, 6), tier_blocks=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_fused_evict_and_store_matches_the_list_then_store_many(num_blocks, tier_blocks, seed):
    """Every take (keying its blocks), free, pin and unpin leaves both sides in the same state."""
    _run([_Side(num_blocks, tier_blocks, fused) for fused in (False, True)], random.Random(seed), 60)
