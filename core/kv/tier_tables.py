"""The KV manager's work with a host tier (core/kv/host_tier.py), kept apart from the device paths.

Stores: a full cached block evicted from the device pool is copied to a host slot before the
step's forward reuses it. Loads: a prefix lookup that misses on the device continues into the
tier; each hit gets a new device block and a load, in one job per admission. A job holds a
reference on its device blocks and pins its host slots until the executor reports it done, so
an abort or preemption mid-load frees cleanly: the blocks wait for the copy, then go back to the
pool as cached blocks. A loading block has no key until its job is done, so nobody hits it early.
KVCacheManager inherits these methods; with no tier none of them runs.

KV groups (core/kv/groups.py): every group's evicted blocks are stored under their own keys (group
g's key chains group 0's, as the device prefix cache keys them), a hit continues into the tier per
group, and it counts only where every group can supply what it reads (GroupTables._group_hits'
rule): a full group every block before the hit point, a sliding group those inside the window of
the first token to compute. Blocks behind a window are neither pinned nor loaded (OUT_OF_WINDOW).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from twinserve.core.kv.block_pool import OUT_OF_WINDOW, KVCacheBlock
from twinserve.core.kv.group_tables import GroupHits, _new_key, common_hit
from twinserve.core.kv.hashing import BlockHash
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.request import Request

_NO_STORES: tuple = ()
_NO_LOADS: dict = {}


class HostHit:
    """Stands in a hit list for a block the host tier holds (it has no device block yet)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HOST_HIT"


HOST_HIT = HostHit()


class TierHits(list):
    """A prefix hit reaching into the host tier: device blocks, then HOST_HIT per host block.

    host holds (slot, key) for each HOST_HIT, in order.
    """

    __slots__ = ("host",)


class GroupTierHits(TierHits):
    """A prefix hit across KV groups reaching into the host tier.

    The list is group 0's table part; groups holds every group's part (HOST_HIT where a load fills
    it, OUT_OF_WINDOW behind a window); host holds (group, index, (slot, key)) per HOST_HIT;
    host_tokens: the tokens past the first block that comes from the host (external hits).
    """

    __slots__ = ("groups", "host_tokens")


@dataclass(slots=True)
class LoadJob:
    """Host slots being copied into device blocks for one admission."""

    job_id: int
    request_id: str | None  # None once the request is gone (aborted or preempted mid-load)
    blocks: list[KVCacheBlock]
    keys: list[BlockHash]
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (host slot, device block id)


class TierTables:
    """Mixin of KVCacheManager: store on eviction, hit and load from the host tier."""

    __slots__ = ()

    def _init_tier(self, host: HostTier | None) -> None:
        self.host = host
        self.kv_stores: list[tuple[int, int]] = []
        self.kv_loads: dict[int, list[tuple[int, int]]] = {}
        self.load_jobs: dict[int, LoadJob] = {}
        self.req_load_job: dict[str, int] = {}
        self._next_job = 0
        if self.host is not None:
            self.pool.evicted = []
            if self.host._lru and self.num_groups == 1:
                # The pool stores each evicted block as it goes (one pass; the same stores): every
                # one-group path drains right after it takes blocks, before any host lookup. KV groups
                # keep the list, drained later (an admission's stores follow its cache_blocks).
                self.pool.tier = self.host
                self.pool.stores = self.kv_stores
            if self.lazy:
                # Lazy registration stays on: a pending block is keyed (its chain registered) when the
                # pool evicts it, so it is stored as eager registration would store it (hot path: most
                # blocks of a run are keyed only then, in one call per chain).
                self.pool.flush = self._flush_evicted

    def _host_hits(self, request: Request, hits: list[KVCacheBlock], parent: BlockHash | None,
                   max_blocks: int) -> list:
        """hits continued into the host tier (a TierHits) where it holds the next blocks."""
        get = self.host.entries.get
        hashes = request.block_hashes
        hash_fn = self.hash_fn
        tokens = request.all_token_ids
        bs = self.block_size
        host = None
        n = len(hashes)
        # KVCacheManager._key inlined, and the host match (hot path: every block a hit loads): an entry
        # holds key's prefix when tokens, extra keys and parent chain are equal, not just the hash value.
        for i in range(len(hits), max_blocks):
            if i < n:
                key = hashes[i]
                if key[1] is not parent:
                    key = self._key(request, hashes, i, parent)  # relinked to parent's object
            elif i:
                block_tokens = tuple(tokens[i * bs:(i + 1) * bs])
                key = _new_key(BlockHash, (hash_fn(None if parent is None else parent[0], block_tokens, None),
                                           parent, block_tokens, None))
                hashes.append(key)
                n += 1
            else:
                key = self._key(request, hashes, 0, None)  # block 0 may carry a salt
                n = len(hashes)
            entry = get(key[0])
            if entry is None:
                break
            stored = entry[1]
            if stored is not key:
                if stored[2] != key[2] or stored[3] != key[3] or not (stored[1] is parent or stored[1] == parent):
                    break  # a colliding value names another prefix
                hashes[i] = stored  # children chain to the stored key object
            if host is None:
                host = []
            host.append(entry)
            parent = stored
        if host is None:
            return hits
        out = TierHits(hits)
        out.extend([HOST_HIT] * len(host))
        out.host = host
        return out

    def _drain_evicted(self) -> None:
        """Queue a store for each full block the pool evicted (dropped when the tier has it)."""
        sink = self.pool.evicted
        if sink:
            self.host.store_many(sink, self.kv_stores)
            sink.clear()

    def _allocate_loads(self, request: Request, hits: TierHits, num_reserved_blocks: int,
                        num_extra_blocks: int) -> list[KVCacheBlock] | None:
        """hits with a new device block per HOST_HIT and a load job for them; None if they do not fit.

        num_extra_blocks: blocks the caller needs besides, counted before anything changes.
        """
        host_part = hits.host
        leading = hits[:len(hits) - len(host_part)]
        # A sliding window's leading part may hold OUT_OF_WINDOW host hits (_window_tier_hits).
        device = leading if self.sliding_window is None else [b for b in leading if b is not OUT_OF_WINDOW]
        free = self.pool.free_queue.num_free - sum(1 for b in device if b.ref_cnt == 0)
        if len(host_part) + num_extra_blocks > free - num_reserved_blocks:
            return None
        # Device hits first, so the evictions below cannot take them; pins keep our sources.
        self.pool.touch(device)
        keys = [k for _, k in host_part]
        self.host.pin_many(keys)
        new = self.pool.get_new_blocks(len(host_part))
        self._drain_evicted()
        self.pool.free_blocks(device)  # the caller takes the request's own references
        job_id = self._next_job
        self._next_job += 1
        job = LoadJob(job_id, request.request_id, new, keys,
                      [(slot, b.block_id) for (slot, _), b in zip(host_part, new)])
        self.load_jobs[job_id] = job
        self.kv_loads[job_id] = job.pairs
        self.req_load_job[request.request_id] = job_id
        self.host.stats.hits += len(new) * self.block_size
        # get_new_blocks' reference is the job's; the caller's touch adds the request's.
        return leading + new

    def complete_loads(self, job_ids: Sequence[int]) -> list[str]:
        """Apply the executor's finished loads: key the blocks, drop the job's hold; requests now ready."""
        ready = []
        claim = self.pool.cached.setdefault
        chains = self._chains
        for job_id in job_ids:
            job = self.load_jobs.pop(job_id, None)
            if job is None:
                raise AssertionError(f"load job {job_id} reported done but none is in flight")
            pins = self.host.pins
            orphan = job.request_id is None
            for block, key in zip(job.blocks, job.keys):
                value = key.value
                n = pins[value] - 1  # HostTier.unpin inlined (hot path)
                if n:
                    pins[value] = n
                else:
                    del pins[value]
                # Keyed unless another block holds the value (one dict operation: hot path).
                if block.block_hash is None:
                    if claim(value, block) is block:
                        block.block_hash = key
                        if orphan and self.lazy:
                            # Freed in order below, so its children may outlive it: no chain roots here.
                            self._contest(value)
                    elif self.lazy:
                        # Held elsewhere. A pending chain's root holds it: the job passes the root, so
                        # the chain's keys are taken now (its next keys are the chain's, as if eager).
                        chain = chains.get(value)
                        if chain is not None:
                            self._flush(chain)
                        self._contest(value)  # the next loaded blocks may outlive its holder
            self.pool.free_blocks(job.blocks)
            rid = job.request_id
            if rid is not None and self.req_load_job.get(rid) == job_id:
                del self.req_load_job[rid]
                ready.append(rid)
        return ready

    def is_loading(self, request_id: str) -> bool:
        """True while the request waits for a load job."""
        return request_id in self.req_load_job

    def _forget_load(self, request_id: str) -> None:
        """The request is gone: its job finishes for the blocks' sake only."""
        job_id = self.req_load_job.pop(request_id, None)
        if job_id is not None:
            self.load_jobs[job_id].request_id = None

    def take_transfers(self) -> tuple[Sequence[tuple[int, int]], dict[int, list[tuple[int, int]]]]:
        """This step's stores and new load jobs (the executor runs stores first, then loads)."""
        if self.host is None:
            return _NO_STORES, _NO_LOADS
        self._drain_evicted()
        stores, loads = self.kv_stores, self.kv_loads
        if not stores and not loads:
            return _NO_STORES, _NO_LOADS
        self.kv_stores = self.pool.stores = []
        self.kv_loads = {}
        return stores, loads

    # ------------------------------------------------------------------ sliding windows and KV groups
    def _window_tier_hits(self, hits: TierHits) -> list:
        """One sliding-window group: host hits behind the hit's window become OUT_OF_WINDOW (never
        loaded); a plain list when none is left to load."""
        host_part = hits.host
        h = len(hits)
        lo = max(0, h * self.block_size - self.sliding_window + 1) // self.block_size
        first = h - len(host_part)
        if lo <= first:
            return hits
        out = TierHits(hits[:first])
        out.extend([OUT_OF_WINDOW] * (min(lo, h) - first))
        out.extend(hits[len(out):])
        out.host = host_part[lo - first:]
        return out if out.host else list(out)

    def _group_source(self, g: int, key0: BlockHash) -> KVCacheBlock | tuple | None:
        """Group g's block for the prefix key0 names: a cached device block, a host entry (slot, key), or None."""
        block = self._group_block(g, key0)
        if block is not None:
            return block
        extra = self._group_extra[g]
        entry = self.host.entries.get(self.hash_fn(key0.value, (), extra))
        if entry is None:
            return None
        stored = entry[1]
        if stored.extra_keys != extra or not (stored.parent is key0 or stored.parent == key0):
            return None  # a colliding value names another prefix or group
        return entry

    def _group_tier_hits(self, request: Request, hits0: list) -> list:
        """_group_hits with the host tier behind every group's device blocks.

        Cut where some group can supply neither from the device nor from the host what it reads.
        """
        bs = self.block_size
        hashes = request.block_hashes
        windows = self.group_windows
        host0 = hits0.host if type(hits0) is TierHits else ()
        first0 = len(hits0) - len(host0)  # group 0's first host block
        h, found = common_hit(len(hits0), windows, bs, hashes, self._group_source)
        if not h:
            return []
        host: list[tuple[int, int, tuple]] = []
        w0 = windows[0]
        lo0 = 0 if w0 is None else max(0, h * bs - w0 + 1) // bs
        part0 = list(hits0[:min(h, first0)])
        for i in range(first0, h):
            if i < lo0:
                part0.append(OUT_OF_WINDOW)  # group 0 slides too (no full group): skip behind its window
            else:
                part0.append(HOST_HIT)
                host.append((0, i, host0[i - first0]))
        tables = [part0]
        for g in range(1, self.num_groups):
            w = windows[g]
            lo = 0 if w is None else max(0, h * bs - w + 1) // bs
            part: list = [OUT_OF_WINDOW] * lo
            for i in range(lo, h):
                src = found[g][i]
                if type(src) is tuple:
                    part.append(HOST_HIT)
                    host.append((g, i, src))
                else:
                    part.append(src)
            tables.append(part)
        if not host:
            out = GroupHits(part0)
            out.groups = tables
            out.groups[0] = out
            return out
        out = GroupTierHits(part0)
        tables[0] = out
        out.groups = tables
        out.host = host
        out.host_tokens = (h - min(i for _, i, _ in host)) * bs
        return out

    def _group_load_pages(self, hits: GroupTierHits) -> int:
        """Free blocks a group hit with loads takes: one per load, and each unheld device block."""
        return len(hits.host) + sum(1 for t in hits.groups for b in t
                                    if b is not OUT_OF_WINDOW and b is not HOST_HIT and b.ref_cnt == 0)

    def _allocate_group_loads(self, request: Request, hits: GroupTierHits) -> list[list[KVCacheBlock]]:
        """Every group's hit part with a new device block per HOST_HIT and one load job for them all.

        The caller has checked the room (_group_load_pages) and takes the request's references.
        """
        device = [b for t in hits.groups for b in t if b is not OUT_OF_WINDOW and b is not HOST_HIT]
        # Device hits first, so the evictions below cannot take them; pins keep our sources.
        self.pool.touch(device)
        keys = [entry[1] for _, _, entry in hits.host]
        self.host.pin_many(keys)
        new = self.pool.get_new_blocks(len(keys))
        self._drain_evicted()
        self.pool.free_blocks(device)
        tables = [list(t) for t in hits.groups]
        for (g, i, _), block in zip(hits.host, new):
            tables[g][i] = block
        job_id = self._next_job
        self._next_job += 1
        job = LoadJob(job_id, request.request_id, new, keys,
                      [(entry[0], b.block_id) for (_, _, entry), b in zip(hits.host, new)])
        self.load_jobs[job_id] = job
        self.kv_loads[job_id] = job.pairs
        self.req_load_job[request.request_id] = job_id
        self.host.stats.hits += hits.host_tokens
        return tables
