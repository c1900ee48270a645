"""Per-request block tables over the block pool, with prefix-cache lookups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from twinserve.core.request import Request
from twinserve.core.kv.block_pool import OUT_OF_WINDOW, BlockPool, KVCacheBlock
from twinserve.core.kv.group_tables import _NO_BLOCKS, GroupHits, GroupTables, _new_key
from twinserve.core.kv.groups import max_pages
from twinserve.core.kv.hashing import BlockHash, HashFunction, get_hash_function
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.tier_tables import TierHits, TierTables

__all__ = ["GroupHits", "KVCacheManager", "OUT_OF_WINDOW", "PendingChain", "PrefixCacheStats"]
# PendingChain assumes no two prefixes share a 64-bit value.
_STRONG_HASHES = ("xxhash", "sha256")


class PendingChain:
    """A request's blocks past its root (first new key), registered in name only.

    Most prefixes are never looked up again, so hashing waits until something reaches
    the root, the only way in: no lookup's result changes.
    """

    __slots__ = ("request_id", "root", "blocks", "token_ids", "hashes", "lo", "hi", "held")

    def __init__(self, request_id: str, blocks: list[KVCacheBlock], token_ids: list[int],
                 hashes: list[BlockHash], root: int) -> None:
        self.request_id = request_id
        self.root = blocks[root]
        self.blocks = blocks  # shared, not copied: they only grow
        self.token_ids = token_ids
        self.hashes = hashes
        self.lo = root + 1  # lo..hi-1 are pending; earlier ones registered
        self.hi = root + 1
        self.held = True


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters, in tokens."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of queried tokens served from the cache."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager(GroupTables, TierTables):
    """Allocates and frees each request's KV blocks; finds cached prefixes."""
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 hash_function: str | HashFunction = "xxhash",
                 lazy_registration: bool = True, sliding_window: int | None = None,
                 kv_groups: Sequence[int] = (), max_step_tokens: int | None = None,
                 host_tier: HostTier | None = None) -> None:
        self.block_size = block_size
        # One window per KV group (None: full attention); kv_groups gives them as 0 = full.
        windows = tuple(w or None for w in kv_groups) if kv_groups else (sliding_window,)
        self.group_windows = windows
        self.num_groups = len(windows)
        # Blocks wholly before the window go back to the pool (the one-group case).
        self.sliding_window = windows[0] if len(windows) == 1 else None
        # Bounds a sliding group's pages per step in can_fit (None: as full attention).
        self.max_step_tokens = max_step_tokens
        # Every group's table, for several groups; table 0 is req_to_blocks' list.
        self.req_tables: dict[str, list[list[KVCacheBlock]]] = {}
        self._group_extra = [("kv_group", g) for g in range(len(windows))]
        self.num_window_freed = 0
        self._window_start: dict[str, int] = {}  # blocks before this index are dropped
        # Blocks a request holds as a count only (core.sched.lazy_decodes, count_blocks): taken off the
        # pool's free count with no block in its table; free() gives them back. Empty in the engine.
        self.uncounted: dict[str, int] = {}
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_fn = get_hash_function(hash_function)
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Registered leading blocks (pending included).
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        # Needs a collision-free hash and no sliding window.
        self.lazy = (enable_caching and lazy_registration and windows == (None,)
                     and isinstance(hash_function, str) and hash_function in _STRONG_HASHES)
        self._chains = self.pool.chains  # root key value -> PendingChain
        self.pending_requests: dict[str, PendingChain] = {}
        self._contested: set[int] = set()  # keys taken from another block
        # The host tier (None: off); every KV group and window (tier_tables).
        self._init_tier(host_tier)
        # One table, no window, no host tier: a running request's step takes allocate_slots' short path.
        self._one_table = self.num_groups == 1 and self.sliding_window is None and self.host is None

    @property
    def usage(self) -> float:
        """Fraction of blocks held (cached free blocks count as free)."""
        return 1.0 - self.pool.free_queue.num_free / self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request."""
        return self.pool.free_queue.num_free

    def _key(self, request: Request, hashes: list[BlockHash], i: int,
             parent: BlockHash | None) -> BlockHash:
        """Block i's key, chained to parent (block i-1's key or None)."""
        if i < len(hashes):
            key = hashes[i]
            if key.parent is not parent:
                # Block i-1 adopted an equal key object: relink.
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
        """The longest cached prefix, leaving a token to compute.

        Each hit is confirmed along the chain (tokens, extra keys, parent identity).
        """
        if not self.enable_caching:
            return _NO_BLOCKS, 0
        # We sample from the last token's logits: always compute it.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        cached = self.pool.cached
        key_of = self._key
        hits: list[KVCacheBlock] = []
        parent = None
        for i in range(max_blocks):
            key = key_of(request, hashes, i, parent)
            if self._chains:
                chain = self._chains.get(key.value)
                if chain is not None:
                    # First: a colliding chain block may take this key.
                    self._flush(chain)
            block = cached.get(key.value)
            if block is None:
                break
            stored = block.block_hash
            if stored is not key:
                if (stored is None or stored.parent is not parent or stored.token_ids != key.token_ids
                        or stored.extra_keys != key.extra_keys):
                    break  # a collision or another prefix's chain
                hashes[i] = stored  # children chain to the cached key object
            hits.append(block)
            parent = stored
        if self.host is not None:
            if len(hits) < max_blocks:
                hits = self._host_hits(request, hits, parent, max_blocks)
            if self.num_groups > 1:
                if hits:
                    hits = self._group_tier_hits(request, hits)
                return hits, len(hits) * self.block_size
            if self.sliding_window is not None and type(hits) is TierHits:
                hits = self._window_tier_hits(hits)
        if self.num_groups > 1 and hits:
            hits = self._group_hits(request, hits)
        return hits, len(hits) * self.block_size

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admission's lookup in the prefix-cache stats."""
        self.stats.requests += 1
        self.stats.queries += num_query_tokens
        self.stats.hits += num_hit_tokens

    def can_fit(self, num_tokens: int) -> bool:
        """True when a request of num_tokens could ever be held by the whole pool."""
        return max_pages(num_tokens, self.block_size, self.group_windows, self.max_step_tokens) <= self.num_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = _NO_BLOCKS,
                       num_new_computed_tokens: int = 0,
                       num_reserved_blocks: int = 0,
                       num_draft_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens; the new blocks (don't mutate), or None.

        num_reserved_blocks stay free; blocks of the last num_draft_tokens are not registered.
        """
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id)
        total = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        verified = total - num_draft_tokens
        bs = self.block_size
        if blocks is not None and not new_computed_blocks:
            if total <= len(blocks) * bs and (
                    not self.enable_caching or verified // bs <= self.num_cached_blocks[req_id]):
                return _NO_BLOCKS  # the common decode step
            if self._one_table:
                # A block-filling step of a running request: the general path below, less its
                # group, tier, window and prefix-hit branches (none applies).
                num_needed = -(-total // bs) - len(blocks)
                if num_needed > 0:
                    pool = self.pool
                    if num_needed > pool.free_queue.num_free - num_reserved_blocks:
                        return None
                    new_blocks = pool.get_new_blocks(num_needed)
                    blocks.extend(new_blocks)
                else:
                    new_blocks = _NO_BLOCKS
                if self.enable_caching and verified // bs > self.num_cached_blocks[req_id]:
                    self.cache_blocks(request, verified)
                return new_blocks
        if self.num_groups > 1:
            return self._allocate_groups(request, blocks, total, verified, new_computed_blocks,
                                         num_new_computed_tokens, num_reserved_blocks)
        if type(new_computed_blocks) is TierHits:
            new_computed_blocks = self._allocate_loads(
                request, new_computed_blocks, num_reserved_blocks,
                max(0, -(-total // bs) - len(new_computed_blocks) - (0 if blocks is None else len(blocks))))
            if new_computed_blocks is None:
                return None
        if self.sliding_window is not None and blocks is not None:
            self._drop_out_of_window(req_id, blocks, request.num_computed_tokens)
        num_held = 0 if blocks is None else len(blocks)
        num_needed = -(-total // bs) - num_held - len(new_computed_blocks)
        if num_needed > 0 or new_computed_blocks:
            free = self.pool.free_queue.num_free
            if new_computed_blocks:
                kept = new_computed_blocks
                if self.sliding_window is not None:  # hits before the window go back at once
                    done = request.num_computed_tokens + num_new_computed_tokens
                    gone = max(0, done - self.sliding_window + 1) // bs - num_held
                    kept = new_computed_blocks[max(0, gone):]
                free -= sum(1 for b in kept if b.ref_cnt == 0)
            if num_needed > free - num_reserved_blocks:
                return None
        if blocks is None:
            blocks = self.req_to_blocks[req_id] = []
            self.num_cached_blocks[req_id] = 0
        if new_computed_blocks:
            if self.sliding_window is not None and self.host is not None:
                # Host hits behind the window were never loaded (TierTables._window_tier_hits).
                self.pool.touch([b for b in new_computed_blocks if b is not OUT_OF_WINDOW])
            else:
                self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_blocks[req_id] = len(blocks)
            if self.sliding_window is not None:
                self._drop_out_of_window(req_id, blocks,
                                         request.num_computed_tokens + num_new_computed_tokens)
        if num_needed > 0:
            new_blocks = self.pool.get_new_blocks(num_needed)
            blocks.extend(new_blocks)
            if self.host is not None:
                self._drain_evicted()
        else:
            new_blocks = _NO_BLOCKS
        if self.enable_caching and verified // bs > self.num_cached_blocks[req_id]:
            # Registered now so later admissions can share them; if the step never
            # runs them, the caller must tell free().
            self.cache_blocks(request, verified)
        return new_blocks

    def trim(self, request: Request, num_tokens: int) -> int:
        """Free the unregistered blocks past num_tokens (rejected drafts); how many per table."""
        blocks = self.req_to_blocks.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if not blocks or len(blocks) <= keep:
            return 0
        if keep < self.num_cached_blocks[request.request_id]:
            raise AssertionError(f"{request.request_id}: trimming a registered block")
        tables = self.req_tables.get(request.request_id) or (blocks,)
        n = len(blocks) - keep
        for table in tables:
            dropped = [b for b in table[keep:] if b is not OUT_OF_WINDOW]
            del table[keep:]
            self.pool.free_blocks(reversed(dropped))
        return n

    def _drop_out_of_window(self, req_id: str, blocks: list[KVCacheBlock], num_computed: int) -> None:
        """Free blocks out of num_computed's window (cached ones stay hittable)."""
        end = max(0, num_computed - self.sliding_window + 1) // self.block_size
        start = self._window_start.get(req_id, 0)
        if end <= start:
            return
        self._window_start[req_id] = end
        self._drop_span(blocks, start, end)

    def _drop_span(self, table: list[KVCacheBlock], start: int, end: int) -> None:
        """Mark table[start:end] out of the window and return its blocks to the pool."""
        dropped = [b for b in table[start:end] if b is not OUT_OF_WINDOW]
        table[start:end] = [OUT_OF_WINDOW] * (end - start)
        self.num_window_freed += len(dropped)
        self.pool.free_blocks(reversed(dropped))

    def num_held_blocks(self, request_id: str, group: int | None = None) -> int:
        """Blocks the request holds now, in all groups or one (window-dropped ones excluded)."""
        tables = self.req_tables.get(request_id) or [self.req_to_blocks.get(request_id, _NO_BLOCKS)]
        if group is not None:
            tables = tables[group:group + 1]
        return sum(1 for t in tables for b in t if b is not OUT_OF_WINDOW)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register full blocks up to num_computed_tokens.

        The latest copy takes the key (keeping an equal key object for its children);
        blocks past a new root register lazily.
        """
        if not self.enable_caching:
            return
        req_id = request.request_id
        done = self.num_cached_blocks.get(req_id)
        num_full = num_computed_tokens // self.block_size
        if done is None or num_full <= done:
            return
        self.num_cached_blocks[req_id] = num_full
        blocks = self.req_to_blocks[req_id]
        if self.lazy:
            chain = self.pending_requests.get(req_id)
            while chain is None and done < num_full:
                chain = self._start_chain(request, blocks, done)  # registers block done
                done += 1
            if chain is not None:
                chain.hi = num_full
            return
        self._register(blocks, request.all_token_ids, request.block_hashes,
                       request.cache_salt, done, num_full)
        tables = self.req_tables.get(req_id)
        if tables is not None:
            for g in range(1, self.num_groups):
                self._register_group(g, tables[g], request.block_hashes, done, num_full)

    def _start_chain(self, request: Request, blocks: list[KVCacheBlock],
                     i: int) -> PendingChain | None:
        """Register block i; a PendingChain for later blocks if its key was new."""
        hashes = request.block_hashes
        key = self._key(request, hashes, i, hashes[i - 1] if i else None)
        # A contested key's children may outlive it; a chain would misorder them.
        fresh = key.value not in self.pool.cached and key.value not in self._contested
        self._register(blocks, request.all_token_ids, hashes, request.cache_salt, i, i + 1)
        if not fresh:
            return None  # shared: the next block may start a chain
        chain = PendingChain(request.request_id, blocks, request.all_token_ids, hashes, i)
        self._chains[key.value] = self.pending_requests[request.request_id] = chain
        return chain

    def _flush(self, chain: PendingChain) -> None:
        """Register a pending chain's blocks for real."""
        del self._chains[chain.root.block_hash.value]
        if self.pending_requests.get(chain.request_id) is chain:
            del self.pending_requests[chain.request_id]
        if chain.hi > chain.lo:
            self._register(chain.blocks, chain.token_ids, chain.hashes, None,
                           chain.lo, chain.hi, chain)
        chain.lo = chain.hi

    def _register(self, blocks: list[KVCacheBlock], token_ids: list[int],
                  hashes: list[BlockHash], salt: str | None, done: int, num_full: int,
                  chain: PendingChain | None = None) -> None:
        """Key and cache blocks done..num_full-1."""
        bs = self.block_size
        cached = self.pool.cached
        hash_fn = self.hash_fn
        num_keys = len(hashes)
        parent = hashes[done - 1] if done else None
        # _key inlined (hot path).
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
            if chain is not None and not chain.held:
                if block.pending is not chain:
                    parent = hashes[i] = key  # evicted while pending: keyed, not cached
                    continue
                block.pending = None
            stored = block.block_hash
            if stored is None:
                value = key.value
                old = cached.setdefault(value, block)
                if old is not block:
                    if self.lazy:
                        self._take_over(value, old)
                        # The flush may have moved a colliding key.
                        old = cached[value]
                    stored = old.block_hash
                    if stored is not None and (stored is key or (
                            stored.parent is key.parent and stored.token_ids == key.token_ids
                            and stored.extra_keys == key.extra_keys)):
                        key = stored
                    old.block_hash = None
                    cached[value] = block
                block.block_hash = key
                stored = key
            parent = hashes[i] = stored

    def _take_over(self, value: int, old: KVCacheBlock) -> None:
        """Flush old's chain before its key moves; note the key as contested."""
        chain = self._chains.get(value)
        if chain is not None and chain.root is old:
            self._flush(chain)
        self._contest(value)

    def _contest(self, value: int) -> None:
        """No chain may start at this key: blocks keyed past it may outlive its holder."""
        self._contested.add(value)
        if len(self._contested) > self.num_blocks:  # bounds the set: exact either way
            self.flush_pending()
            self.lazy = False
            self._contested.clear()

    def _flush_evicted(self, chain: PendingChain) -> None:
        """The pool evicts one of chain's pending blocks (host tier on): register the chain first."""
        root = chain.root.block_hash
        if root is not None and self._chains.get(root.value) is chain:
            self._flush(chain)

    def flush_pending(self) -> None:
        """Register every pending block (for inspection)."""
        for chain in list(self._chains.values()):
            self._flush(chain)

    def free(self, request: Request, num_computed_tokens: int | None = None) -> None:
        """Release the request's blocks, tail first so tails are evicted first.

        Blocks registered past num_computed_tokens (never written) are uncached.
        """
        if self.uncounted:
            owed = self.uncounted.pop(request.request_id, 0)
            if owed:
                self.pool.free_queue.num_free += owed
        blocks = self.req_to_blocks.pop(request.request_id, None)
        num_cached = self.num_cached_blocks.pop(request.request_id, 0)
        chain = self.pending_requests.pop(request.request_id, None)
        windowed = self._window_start.pop(request.request_id, 0)
        if self.req_load_job:
            self._forget_load(request.request_id)
        if self.num_groups > 1:
            self._free_groups(request.request_id, num_cached, num_computed_tokens)
            return
        if not blocks:
            return
        if num_computed_tokens is not None:
            keep = num_computed_tokens // self.block_size
            if chain is not None and keep < chain.hi:
                chain.hi = max(keep, chain.lo)
            uncache = self.pool.uncache_block
            for i in range(keep, num_cached):
                uncache(blocks[i])
        if chain is not None:
            chain.held = False
            for block in blocks[chain.lo:chain.hi]:
                block.pending = chain  # now evictable: the pool must see it
        if windowed:
            blocks = [b for b in blocks if b is not OUT_OF_WINDOW]
        self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as block ids; several groups' tables one after another."""
        tables = self.req_tables.get(request_id)
        if tables is not None:
            return [b.block_id for t in tables for b in t]
        return [b.block_id for b in self.req_to_blocks.get(request_id, _NO_BLOCKS)]

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (PrefixCacheBusyError while blocks are in use)."""
        self.pool.reset_prefix_cache()
        self._contested.clear()
        if self.host is not None:
            self.host.clear()
