"""KV blocks, ref counts, the LRU free queue and the prefix-cache map."""

from __future__ import annotations

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

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else " cached"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}{cached})"


# A block behind a sliding window in a block table (never read, freed or cached).
OUT_OF_WINDOW = KVCacheBlock(-1)


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks; the front is evicted first (LRU).

    BlockPool walks the links itself to do per-block work in one pass.
    """

    __slots__ = ("num_free", "_head", "_tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinels
        self._tail = KVCacheBlock(-2)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free = len(blocks)

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
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    """Owns every block, the free queue and the prefix-cache map."""

    __slots__ = ("num_blocks", "enable_caching", "blocks", "free_queue", "cached", "chains",
                 "num_evictions", "evicted")

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # Key value -> latest copy; a block has a key iff it is here.
        self.cached: dict[int, KVCacheBlock] = {}
        # Root key value -> PendingChain; dropped with its root.
        self.chains: dict[int, object] = {}
        self.num_evictions = 0
        # With a host tier: (block id, key) of each full block evicted, for the KV manager to store.
        self.evicted: list[tuple[int, BlockHash]] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no owner (cached ones included: they are evictable)."""
        return self.free_queue.num_free

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take n free blocks, evicting their cached content."""
        queue = self.free_queue
        if n > queue.num_free:
            raise ValueError(f"asked for {n} blocks, {queue.num_free} free")
        # One walk (hot path).
        out = []
        append = out.append
        cached = self.cached
        chains = self.chains
        evicted = 0
        sink = self.evicted
        head = queue._head
        block = head.next_free
        for _ in range(n):
            key = block.block_hash
            if key is not None:
                # A colliding key value may name another block.
                if cached.get(key.value) is block:
                    del cached[key.value]
                    if chains:
                        chains.pop(key.value, None)
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
        for block in self.blocks:
            block.pending = None
        self.chains.clear()
