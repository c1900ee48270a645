"""Per-request block tables on top of the block pool, with prefix-cache lookups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..request import Request
from .block_pool import BlockPool, KVCacheBlock
from .hashing import BlockHash, HashFunction, get_hash_function

_NO_BLOCKS: list[KVCacheBlock] = []
# BlockHash(...) without the NamedTuple's Python-level __new__ (one per full block).
_new_key = tuple.__new__


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters, in tokens, over admitted requests."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of queried tokens served from the cache."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Allocates and frees each request's KV blocks; finds cached prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 hash_function: str | HashFunction = "xxhash") -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_fn = get_hash_function(hash_function)
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are registered in the prefix cache.
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached free blocks count as free)."""
        return 1.0 - self.pool.free_queue.num_free / self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request."""
        return self.pool.free_queue.num_free

    def _key(self, request: Request, hashes: list[BlockHash], i: int,
             parent: BlockHash | None) -> BlockHash:
        """Block i's key, chained to parent (the key object of block i-1, or None)."""
        if i < len(hashes):
            key = hashes[i]
            if key.parent is not parent:
                # Block i-1 took over an equal key object (a hit or an adoption): relink.
                key = hashes[i] = _new_key(BlockHash,
                                           (key.value, parent, key.token_ids, key.extra_keys))
            return key
        bs = self.block_size
        extra = (request.cache_salt,) if i == 0 and request.cache_salt is not None else None
        block_tokens = tuple(request.all_token_ids[i * bs:(i + 1) * bs])
        value = self.hash_fn(None if parent is None else parent.value, block_tokens, extra)
        key = _new_key(BlockHash, (value, parent, block_tokens, extra))
        hashes.append(key)
        return key

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of the request, leaving at least one token to compute.

        Every hit is confirmed against the whole chain: the cached block's tokens and
        extra keys must equal the request's, and its stored parent must be the very key
        object of the block hit just before it (None for the first block).
        """
        if not self.enable_caching:
            return _NO_BLOCKS, 0
        # Capped so the last token is always computed: its logits are what we sample from.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        cached = self.pool.cached
        key_of = self._key
        hits: list[KVCacheBlock] = []
        parent = None
        for i in range(max_blocks):
            key = key_of(request, hashes, i, parent)
            block = cached.get(key.value)
            if block is None:
                break
            stored = block.block_hash
            if stored is not key:
                assert stored is not None
                if (stored.parent is not parent or stored.token_ids != key.token_ids
                        or stored.extra_keys != key.extra_keys):
                    break  # a hash collision, or a chain through another prefix
                hashes[i] = stored  # share the cached key object, so children chain to it
            hits.append(block)
            parent = stored
        return hits, len(hits) * self.block_size

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admission's lookup in the prefix-cache stats."""
        self.stats.requests += 1
        self.stats.queries += num_query_tokens
        self.stats.hits += num_hit_tokens

    def can_fit(self, num_tokens: int) -> bool:
        """True when a request of num_tokens could ever be held by the whole pool."""
        return -(-num_tokens // self.block_size) <= self.num_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = _NO_BLOCKS,
                       num_new_computed_tokens: int = 0,
                       num_reserved_blocks: int = 0) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens more tokens; the new blocks, or None if they don't fit.

        new_computed_blocks are prefix-cache hits for a request being admitted.
        num_reserved_blocks must stay free afterwards (the admission watermark).
        The returned list must not be mutated (it may be shared when empty).
        """
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id)
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        bs = self.block_size
        if blocks is not None and not new_computed_blocks and total <= len(blocks) * bs and (
                not self.enable_caching or total // bs <= self.num_cached_blocks[req_id]):
            return _NO_BLOCKS  # the common decode step: room in the last block, nothing to cache
        num_held = 0 if blocks is None else len(blocks)
        num_needed = -(-total // bs) - num_held - len(new_computed_blocks)
        if num_needed > 0 or new_computed_blocks:
            free = self.pool.free_queue.num_free
            if new_computed_blocks:
                # Free cached hits leave the free queue when touched.
                free -= sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
            if num_needed > free - num_reserved_blocks:
                return None
        if blocks is None:
            blocks = self.req_to_blocks[req_id] = []
            self.num_cached_blocks[req_id] = 0
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_blocks[req_id] = len(blocks)
        if num_needed > 0:
            new_blocks = self.pool.get_new_blocks(num_needed)
            blocks.extend(new_blocks)
        else:
            new_blocks = _NO_BLOCKS
        if self.enable_caching and total // bs > self.num_cached_blocks[req_id]:
            # Registered now, before the step computes them, so a request admitted later in
            # the same step can share them (the step writes every block's KV before any
            # attention reads it). If the step does not run them, the caller must say so
            # to free() (a preemption or abort with the step in flight).
            self.cache_blocks(request, total)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's full blocks up to num_computed_tokens in the prefix cache.

        The latest computed copy of a content takes the key, and the block that held it
        before becomes uncached (it stays valid for the requests using it). When the
        previous holder's key names the same prefix (same tokens, extra keys and parent
        object), that key object is kept, so blocks cached as its children stay reachable.
        A block that already holds a key (a prefix hit shared by this request) keeps it.
        """
        if not self.enable_caching:
            return
        req_id = request.request_id
        done = self.num_cached_blocks.get(req_id)
        bs = self.block_size
        num_full = num_computed_tokens // bs
        if done is None or num_full <= done:
            return
        blocks = self.req_to_blocks[req_id]
        hashes = request.block_hashes
        cached = self.pool.cached
        hash_fn = self.hash_fn
        token_ids = request.all_token_ids
        salt = request.cache_salt
        num_keys = len(hashes)
        parent = hashes[done - 1] if done else None
        # _key and a per-block pool call, inlined: every prompt block passes through here.
        for i in range(done, num_full):
            if i < num_keys:
                key = hashes[i]
                if key.parent is not parent:
                    key = _new_key(BlockHash, (key.value, parent, key.token_ids, key.extra_keys))
            else:
                extra = (salt,) if i == 0 and salt is not None else None
                block_tokens = tuple(token_ids[i * bs:(i + 1) * bs])
                key = _new_key(BlockHash, (
                    hash_fn(None if parent is None else parent.value, block_tokens, extra),
                    parent, block_tokens, extra))
                hashes.append(key)
                num_keys += 1
            block = blocks[i]
            stored = block.block_hash
            if stored is None:
                value = key.value
                old = cached.setdefault(value, block)  # one probe in the common, new case
                if old is not block:
                    stored = old.block_hash
                    assert stored is not None
                    if stored is key or (stored.parent is key.parent
                                         and stored.token_ids == key.token_ids
                                         and stored.extra_keys == key.extra_keys):
                        key = stored
                    old.block_hash = None
                    cached[value] = block
                block.block_hash = key
                stored = key
            parent = hashes[i] = stored
        self.num_cached_blocks[req_id] = num_full

    def free(self, request: Request, num_computed_tokens: int | None = None) -> None:
        """Release the request's blocks, tail first so tails are evicted before heads.

        num_computed_tokens, when given, is how many tokens' KV was really written: blocks
        registered past it (allocated for a step that will not run them: a preemption or
        abort in the same step) leave the prefix cache, so no later lookup reads them.
        """
        blocks = self.req_to_blocks.pop(request.request_id, None)
        num_cached = self.num_cached_blocks.pop(request.request_id, 0)
        if not blocks:
            return
        if num_computed_tokens is not None:
            uncache = self.pool.uncache_block
            for i in range(num_computed_tokens // self.block_size, num_cached):
                uncache(blocks[i])
        self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as block ids."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, _NO_BLOCKS)]

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix; raises PrefixCacheBusyError while blocks are in use."""
        self.pool.reset_prefix_cache()
