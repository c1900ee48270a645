"""The KV manager's work for several KV cache groups (core/kv/groups.py), kept apart from the one-group paths.

Every group's table has one entry per block_size tokens, so tables stay the same length; pages
for a step come group after group. KVCacheManager inherits these methods and calls them only
when num_groups > 1.
"""

from __future__ import annotations

from typing import Callable, Sequence

from twinserve.core.kv.block_pool import OUT_OF_WINDOW, KVCacheBlock
from twinserve.core.kv.hashing import BlockHash
from twinserve.core.request import Request

_NO_BLOCKS: list[KVCacheBlock] = []
# BlockHash(...) without the Python-level __new__ (hot path).
_new_key = tuple.__new__


def common_hit(h: int, windows: Sequence[int | None], bs: int, hashes: Sequence[BlockHash],
               source: Callable[[int, BlockHash], object]) -> tuple[int, list[dict[int, object]]]:
    """The longest hit of at most h blocks every group 1.. can serve, and each group's sources seen.

    source(g, key) is group g's block (or host entry) for a prefix key, None where it has none. Full
    groups need every block of the hit, sliding ones the blocks of its last window; cutting h can
    change what a window needs, so it repeats until no group cuts.
    """
    found: list[dict[int, object]] = [{} for _ in windows]
    changed = True
    while changed and h:
        changed = False
        for g in range(1, len(windows)):
            w = windows[g]
            lo = 0 if w is None else max(0, h * bs - w + 1) // bs
            seen = found[g]
            # Full: the first missing block bounds the hit; sliding: the last one in the window.
            order = range(lo, h) if w is None else range(h - 1, lo - 1, -1)
            for i in order:
                if i not in seen:
                    seen[i] = source(g, hashes[i])
                if seen[i] is None:
                    h = i
                    changed = True
                    break
            if not h:
                break
    return h, found


class GroupHits(list):
    """A prefix hit across KV groups: group 0's blocks (the list itself) and each group's table part."""

    __slots__ = ("groups",)


class GroupTables:
    """Mixin of KVCacheManager: allocation, window drops, prefix hits and frees across groups."""

    __slots__ = ()

    def _group_block(self, g: int, key0: BlockHash) -> KVCacheBlock | None:
        """Group g's cached block for the prefix key0 names, if any."""
        extra = self._group_extra[g]
        block = self.pool.cached.get(self.hash_fn(key0.value, (), extra))
        if block is None:
            return None
        stored = block.block_hash
        if stored is None or stored.extra_keys != extra or not (
                stored.parent is key0 or stored.parent == key0):
            return None
        return block

    def _group_hits(self, request: Request, hits0: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """Cut a group-0 hit to where every group can serve it (docs/models.md, the restriction).

        A full group needs all blocks before the hit point, a sliding group those inside the window
        of the first token to compute; the rest of its table part is OUT_OF_WINDOW.
        """
        bs = self.block_size
        hashes = request.block_hashes
        h, found = common_hit(len(hits0), self.group_windows, bs, hashes, self._group_block)
        if not h:
            return _NO_BLOCKS
        out = GroupHits(hits0[:h])
        tables = [out]
        for g in range(1, self.num_groups):
            w = self.group_windows[g]
            lo = 0 if w is None else max(0, h * bs - w + 1) // bs
            tables.append([OUT_OF_WINDOW] * lo + [found[g][i] for i in range(lo, h)])
        out.groups = tables
        return out

    def _allocate_groups(self, request: Request, blocks: list[KVCacheBlock] | None, total: int,
                         verified: int, hits: Sequence[KVCacheBlock], num_hit_tokens: int,
                         num_reserved_blocks: int) -> list[KVCacheBlock] | None:
        """allocate_slots for several groups: the same table length in each, pages counted in all.

        The new blocks come group-major (group 0's, then group 1's, ...).
        """
        rid = request.request_id
        bs = self.block_size
        num_groups = self.num_groups
        tables = self.req_tables.get(rid)
        if tables is not None:
            self._drop_groups(rid, tables, request.num_computed_tokens)
        num_held = 0 if blocks is None else len(blocks)
        num_needed = -(-total // bs) - num_held - len(hits)
        hit_tables = hits.groups if hits else None
        loads = hit_tables is not None and self.host is not None and hasattr(hits, "host")
        pages = max(num_needed, 0) * num_groups
        if pages or hit_tables:
            free = self.pool.free_queue.num_free
            if loads:  # host hits: a new block per load (TierTables)
                free -= self._group_load_pages(hits)
            elif hit_tables:
                free -= sum(1 for t in hit_tables for b in t if b is not OUT_OF_WINDOW and b.ref_cnt == 0)
            if pages > free - num_reserved_blocks:
                return None
        if loads:
            hit_tables = self._allocate_group_loads(request, hits)
        if tables is None:
            tables = self.req_tables[rid] = [[] for _ in range(num_groups)]
            self.req_to_blocks[rid] = tables[0]
            self.num_cached_blocks[rid] = 0
            self._window_start[rid] = [0] * num_groups
        if hit_tables:
            for table, part in zip(tables, hit_tables):
                self.pool.touch([b for b in part if b is not OUT_OF_WINDOW])
                table.extend(part)
            self.num_cached_blocks[rid] = len(tables[0])
            self._drop_groups(rid, tables, request.num_computed_tokens + num_hit_tokens)
        if num_needed > 0:
            new_blocks = self.pool.get_new_blocks(pages)
            for g, table in enumerate(tables):
                table.extend(new_blocks[g * num_needed:(g + 1) * num_needed])
        else:
            new_blocks = _NO_BLOCKS
        if self.enable_caching and verified // bs > self.num_cached_blocks[rid]:
            self.cache_blocks(request, verified)
        return new_blocks

    def _drop_groups(self, rid: str, tables: list[list[KVCacheBlock]], num_computed: int) -> None:
        """Free each sliding group's blocks out of num_computed's window (cached ones stay hittable)."""
        starts = self._window_start[rid]
        bs = self.block_size
        for g, w in enumerate(self.group_windows):
            if w is None:
                continue
            end = max(0, num_computed - w + 1) // bs
            start = starts[g]
            if end <= start:
                continue
            starts[g] = end
            self._drop_span(tables[g], start, end)

    def _register_group(self, g: int, blocks: list[KVCacheBlock], hashes: list[BlockHash],
                        done: int, num_full: int) -> None:
        """Key group g's blocks done..num_full-1 by group 0's keys (the latest copy takes a key)."""
        pool = self.pool
        cached = pool.cached
        extra = self._group_extra[g]
        hash_fn = self.hash_fn
        for i in range(done, num_full):
            block = blocks[i]
            if block is OUT_OF_WINDOW or block.block_hash is not None:
                continue
            key0 = hashes[i]
            value = hash_fn(key0.value, (), extra)
            old = cached.get(value)
            if old is not None and old is not block:
                pool.uncache_block(old)
            cached[value] = block
            block.block_hash = _new_key(BlockHash, (value, key0, (), extra))

    def _free_groups(self, rid: str, num_cached: int, num_computed_tokens: int | None) -> None:
        """free() for several groups: position by position from the tail, every group's block."""
        tables = self.req_tables.pop(rid, None)
        if not tables:
            return
        if num_computed_tokens is not None:
            uncache = self.pool.uncache_block
            for table in tables:
                for i in range(num_computed_tokens // self.block_size, num_cached):
                    if table[i] is not OUT_OF_WINDOW:
                        uncache(table[i])
        self.pool.free_blocks(b for i in range(len(tables[0]) - 1, -1, -1) for t in tables
                              if (b := t[i]) is not OUT_OF_WINDOW)
