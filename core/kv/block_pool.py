"""KV blocks, ref counts, the LRU free queue and the prefix-cache map."""

from __future__ import annotations

import threading
from typing import Iterable

from twinserve.core.errors import PrefixCacheBusyError
from twinserve.core.kv.hashing import BlockHash


class KVCacheBlock:
    """One KV block; also a free-queue node."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "pending", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        # Its PendingChain once released; cleared on eviction.
        self.pending = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        # FreeBlockQueue.take_fresh sets these fields itself (in two places): add new ones there too.

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else " cached"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}{cached})"


_new_object = object.__new__

# Blocks of pools whose simulation is over (BlockPool.recycle), for the next pools' take_fresh:
# a process running simulations one after another (a capacity search) otherwise makes and frees
# a whole pool of 10^5 blocks a run. Each shelf is a finished pool's blocks by id (shelf[i] last
# had id i); a new pool claims one whole and hands shelf[start:stop] out as ids start..stop, so a
# block keeps its id and the blocks are reset in the order they were made (handing them out under
# new ids, in another order, cost twice as much in a search: cache misses). Capped (blocks on all
# shelves) so an idle process holds little; a pool that claims a shelf and is never recycled loses
# its untaken blocks (linked: cycles, as its own blocks are).
_SPARE: list[list[KVCacheBlock]] = []
_SPARE_MAX = 1 << 19
_SPARE_LOCK = threading.Lock()  # claims and recycles: one thread at a time


def _claim_shelf() -> list[KVCacheBlock] | None:
    """The longest spare shelf, taken off the spare list (None: none)."""
    with _SPARE_LOCK:
        if not _SPARE:
            return None
        i = max(range(len(_SPARE)), key=lambda j: len(_SPARE[j]))
        return _SPARE.pop(i)


# A block behind a sliding window in a block table (never read, freed or cached).
OUT_OF_WINDOW = KVCacheBlock(-1)


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks; the front is evicted first (LRU).

    Blocks never handed out yet are not made until first taken (a pool of millions costs
    nothing up front): ids next_fresh .. num_blocks - 1 are free and come before every linked
    block, in id order, exactly where an eagerly built queue would hold them (freed blocks only
    ever join at the tail; only cached, so already made, blocks leave from the middle).
    BlockPool walks the links itself to do per-block work in one pass.
    """

    __slots__ = ("num_free", "_head", "_tail", "created", "next_fresh", "num_blocks", "shelf")

    def __init__(self, blocks: list[KVCacheBlock], num_fresh: int = 0) -> None:
        self._head = KVCacheBlock(-1)  # sentinels
        self._tail = KVCacheBlock(-2)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.created = blocks  # every block made so far, in id order (shared with the pool)
        self.next_fresh = len(blocks)
        self.num_blocks = len(blocks) + num_fresh
        self.num_free = self.num_blocks
        # A recycled pool's blocks by id (_SPARE), claimed at the first take_fresh; False: none claimed
        # and none to claim then (never looked for again: a pool made with no spare makes its own).
        self.shelf: list[KVCacheBlock] | bool | None = None

    def take_fresh(self, n: int) -> list[KVCacheBlock]:
        """Hand out (ref_cnt 1) up to n never-used blocks, the queue's front: made, or taken off
        the claimed shelf with every field a made one has (block_id already in place)."""
        start = self.next_fresh
        shelf = self.shelf
        if shelf is None:
            shelf = self.shelf = _claim_shelf() or False
        if n == 1 and start < self.num_blocks:
            # One block (a decode step filling its last block, on a pool's first pass): the general
            # path below without its min, range and extend, which cost more than the block.
            if shelf and start < len(shelf):
                block = shelf[start]
            else:
                block = _new_object(KVCacheBlock)
                block.block_id = start
            block.ref_cnt = 1
            block.block_hash = block.pending = block.prev_free = block.next_free = None
            self.created.append(block)
            self.num_free -= 1
            self.next_fresh = start + 1
            return [block]
        stop = min(start + n, self.num_blocks)
        if shelf and start < len(shelf):
            out = shelf[start:stop]
            for block in out:
                block.ref_cnt = 1
                block.block_hash = block.pending = block.prev_free = block.next_free = None
            start += len(out)
        else:
            out = []
        if start < stop:
            # KVCacheBlock(i) with ref_cnt 1, without a Python __init__ frame per block: same fields.
            add = out.append
            new = _new_object
            for i in range(start, stop):
                block = new(KVCacheBlock)
                block.block_id = i
                block.ref_cnt = 1
                block.block_hash = block.pending = block.prev_free = block.next_free = None
                add(block)
        self.created.extend(out)
        self.num_free -= stop - self.next_fresh
        self.next_fresh = stop
        return out

    def materialize(self) -> None:
        """Make every never-used block and link it at the front, in id order (same queue order)."""
        start = self.next_fresh
        if start >= self.num_blocks:
            return
        made = self.take_fresh(self.num_blocks - start)  # a claimed shelf's blocks too
        self.num_free += len(made)
        for block in made:
            block.ref_cnt = 0
        first = self._head.next_free
        prev = self._head
        for block in made:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = first
        first.prev_free = prev

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block (a prefix hit on a free block)."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block!r} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def __iter__(self):
        self.materialize()
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    """Owns every block, the free queue and the prefix-cache map."""

    __slots__ = ("num_blocks", "enable_caching", "_blocks", "free_queue", "cached", "chains",
                 "num_evictions", "evicted", "tier", "stores", "flush")

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._blocks: list[KVCacheBlock] = []  # made on first use (FreeBlockQueue)
        self.free_queue = FreeBlockQueue(self._blocks, num_blocks)
        # Key value -> latest copy; a block has a key iff it is here.
        self.cached: dict[int, KVCacheBlock] = {}
        # Root key value -> PendingChain; dropped with its root.
        self.chains: dict[int, object] = {}
        self.num_evictions = 0
        # With a host tier: (block id, key) of each full block evicted, for the KV manager to store.
        self.evicted: list[tuple[int, BlockHash]] | None = None
        # Or an LRU host tier (HostTier) that takes each evicted full block as it is evicted,
        # appending (block id, host slot) per copy to stores (the KV manager's kv_stores).
        self.tier = None
        self.stores: list[tuple[int, int]] = []
        # With a host tier and lazy registration: called with a pending block's chain before the
        # block is evicted (it registers the chain, so the block is keyed and stored as if eager).
        self.flush = None

    def recycle(self) -> None:
        """Give every block made so far to later pools' take_fresh, as one shelf by id; this pool
        is unusable after (no free block, none made). Only when nothing of its simulation is read
        again."""
        q = self.free_queue
        made = self._blocks
        shelf = q.shelf
        if shelf and len(shelf) >= len(made):
            # Every block this pool made came off its shelf (take_fresh hands shelf[i] out as id i,
            # and makes a block only past the shelf's end), so made == shelf[:len(made)], block for
            # block: the shelf itself is the recycled one, its untaken tail keeping their ids. (Was
            # made + shelf's tail: a copy touching every untaken, cold block, ~1% of a search.)
            made = shelf
        q.shelf = False
        self._blocks = q.created = []
        with _SPARE_LOCK:
            room = max(_SPARE_MAX - sum(map(len, _SPARE)), 0)
            if made and room:
                _SPARE.append(made if len(made) <= room else made[:room])
        for b in made[room:]:  # unlinked, so reference counting frees them (linked: cycles)
            b.prev_free = b.next_free = b.pending = None
        self.cached.clear()
        self.chains.clear()
        q.num_free = q.num_blocks = q.next_fresh = 0
        q._head.next_free = q._tail
        q._tail.prev_free = q._head

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block, by id (makes the never-used ones: for checks, not the hot path)."""
        self.free_queue.materialize()
        return self._blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no owner (cached ones included: they are evictable)."""
        return self.free_queue.num_free

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take n free blocks, evicting their cached content."""
        queue = self.free_queue
        if n > queue.num_free:
            raise ValueError(f"asked for {n} blocks, {queue.num_free} free")
        # Never-used blocks first (the queue's front), then one walk (hot path).
        if queue.next_fresh < queue.num_blocks:
            out = queue.take_fresh(n)
            n -= len(out)
            if not n:
                return out
        else:
            out = []
        if self.tier is not None:
            self._take_storing(n, out)
            return out
        append = out.append
        cached = self.cached
        chains = self.chains
        evicted = 0
        sink = self.evicted
        flush = self.flush
        head = queue._head
        block = head.next_free
        if not self.enable_caching and not cached and flush is None:
            # No block has a key (a keyed block is in cached) or a pending chain (those come only
            # with a prefix cache): the walk below with nothing to evict (the uncached runs' path).
            for _ in range(n):
                block.ref_cnt = 1
                block.prev_free = None
                nxt = block.next_free
                block.next_free = None
                append(block)
                block = nxt
            head.next_free = block
            block.prev_free = head
            queue.num_free -= n
            return out
        for _ in range(n):
            key = block.block_hash
            if key is None and flush is not None and block.pending is not None:
                flush(block.pending)  # a tier stores it: keyed as eager registration would have it
                key = block.block_hash
            if key is not None:
                # A colliding key value may name another block.
                value = key[0]
                if cached.get(value) is block:
                    del cached[value]
                    if chains:
                        chains.pop(value, None)
                if sink is not None:
                    sink.append((block.block_id, key))
                block.block_hash = None
                evicted += 1
            elif block.pending is not None:
                block.pending = None  # so its chain sees it is gone
                evicted += 1
            block.ref_cnt = 1
            block.prev_free = None
            nxt = block.next_free
            block.next_free = None
            append(block)
            block = nxt
        head.next_free = block
        block.prev_free = head
        queue.num_free -= n
        self.num_evictions += evicted
        return out

    def _take_storing(self, n: int, out: list[KVCacheBlock]) -> None:
        """get_new_blocks' walk with each evicted full block stored to the LRU host tier as it goes:
        the same blocks, tier state and stores as the walk then HostTier.store_many(evicted,
        stores), in one pass (hot path of a tiered run: no (block id, key) list in between)."""
        tier = self.tier
        entries = tier.entries
        get = entries.get
        move = entries.move_to_end
        pop_oldest = entries.popitem
        free = tier.free_slots
        pins = tier.pins
        store = tier.store
        add = self.stores.append
        stored = host_evictions = 0
        append = out.append
        cached = self.cached
        pop_cached = cached.pop
        chains = self.chains
        evicted = 0
        flush = self.flush
        queue = self.free_queue
        head = queue._head
        block = head.next_free
        for _ in range(n):
            key = block.block_hash
            if key is None and flush is not None and block.pending is not None:
                flush(block.pending)  # as in get_new_blocks
                key = block.block_hash
            if key is not None:
                value = key[0]
                holder = pop_cached(value, None)
                if holder is block:
                    if chains:
                        chains.pop(value, None)
                elif holder is not None:
                    cached[value] = holder  # a colliding key value names another block
                block.block_hash = None
                evicted += 1
                # HostTier.store_many's LRU body, inlined.
                entry = get(value)
                if entry is not None:
                    if entry[1] is key or entry[1] == key:
                        move(value)  # the same KV is there: nothing to copy
                    else:
                        slot = store(key)
                        if slot is not None:
                            add((block.block_id, slot))
                elif free:
                    slot = free.pop()
                    entries[value] = (slot, key)
                    stored += 1
                    add((block.block_id, slot))
                else:
                    victim, entry = pop_oldest(False)
                    if pins and victim in pins:
                        entries[victim] = entry  # back to the front: store() skips pinned entries
                        move(victim, False)
                        slot = store(key)
                        if slot is not None:
                            add((block.block_id, slot))
                    else:
                        slot = entry[0]
                        entries[value] = (slot, key)
                        stored += 1
                        host_evictions += 1
                        add((block.block_id, slot))
            elif block.pending is not None:
                block.pending = None  # so its chain sees it is gone
                evicted += 1
            block.ref_cnt = 1
            block.prev_free = None
            nxt = block.next_free
            block.next_free = None
            append(block)
            block = nxt
        head.next_free = block
        block.prev_free = head
        queue.num_free -= n
        self.num_evictions += evicted
        stats = tier.stats
        stats.blocks_stored += stored
        stats.evictions += host_evictions

    def get_cached_block(self, key: BlockHash) -> KVCacheBlock | None:
        """The block cached under key if it holds key's whole prefix."""
        block = self.cached.get(key.value)
        if block is None:
            return None
        stored = block.block_hash
        if stored is key or stored == key:  # == compares whole prefixes
            return block
        return None

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Drop a block's key (its KV isn't what it names); holders keep it."""
        key = block.block_hash
        if key is not None:
            if self.cached.get(key.value) is block:
                del self.cached[key.value]
                self.chains.pop(key.value, None)
            block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks."""
        remove = self.free_queue.remove
        for block in blocks:
            if block.ref_cnt == 0:
                remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; freed blocks join the queue in order."""
        queue = self.free_queue
        tail = queue._tail
        last = tail.prev_free
        added = 0
        try:
            for block in ordered_blocks:
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    last.next_free = block
                    block.prev_free = last
                    last = block
                    added += 1
                elif block.ref_cnt < 0:
                    raise AssertionError(f"{block!r} freed more often than allocated")
        finally:
            last.next_free = tail
            tail.prev_free = last
            queue.num_free += added

    def reset_prefix_cache(self) -> None:
        """Forget every cached key; refused while any block is held."""
        in_use = self.num_blocks - self.free_queue.num_free
        if in_use:
            raise PrefixCacheBusyError(
                f"cannot reset the prefix cache: {in_use} blocks are in use by running requests; "
                "abort or finish them first"
            )
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        for block in self._blocks:  # never-used blocks have no chain
            block.pending = None
        self.chains.clear()
