"""The KV manager's work with a host tier (core/kv/host_tier.py), kept apart from the device paths.

Stores: a full cached block evicted from the device pool is copied to a host slot before the
step's forward reuses it. Loads: a prefix lookup that misses on the device continues into the
tier; each hit gets a new device block and a load, in one job per admission. A job holds a
reference on its device blocks and pins its host slots until the executor reports it done, so
an abort or preemption mid-load frees cleanly: the blocks wait for the copy, then go back to the
pool as cached blocks. A loading block has no key until its job is done, so nobody hits it early.
KVCacheManager inherits these methods; with no tier none of them runs. A tier for a model with
sliding windows or several KV groups is refused (InvalidConfigError), never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.block_pool import KVCacheBlock
from twinserve.core.kv.group_tables import _new_key
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
        # Full attention in one group only: a window's tables would need per-position rules.
        if host is not None and self.group_windows != (None,):
            raise InvalidConfigError(
                "kv_offloading_blocks", host.num_blocks,
                f"0 for KV groups with windows {list(self.group_windows)}: the host tier serves models "
                "whose layers all use full attention (sliding-window and mixed models are not supported yet)")
        self.host = host
        self.kv_stores: list[tuple[int, int]] = []
        self.kv_loads: dict[int, list[tuple[int, int]]] = {}
        self.load_jobs: dict[int, LoadJob] = {}
        self.req_load_job: dict[str, int] = {}
        self._next_job = 0
        if self.host is not None:
            self.pool.evicted = []
            # Pending chains are registered in name only: an evicted one has no key to store under.
            self.lazy = False

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
        # KVCacheManager._key and HostTier.lookup inlined (hot path: every block a hit loads).
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
        device = hits[:len(hits) - len(host_part)]
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
        return device + new

    def complete_loads(self, job_ids: Sequence[int]) -> list[str]:
        """Apply the executor's finished loads: key the blocks, drop the job's hold; requests now ready."""
        ready = []
        cached = self.pool.cached
        for job_id in job_ids:
            job = self.load_jobs.pop(job_id, None)
            if job is None:
                raise AssertionError(f"load job {job_id} reported done but none is in flight")
            pins = self.host.pins
            for block, key in zip(job.blocks, job.keys):
                value = key.value
                n = pins[value] - 1  # HostTier.unpin inlined (hot path)
                if n:
                    pins[value] = n
                else:
                    del pins[value]
                if value not in cached and block.block_hash is None:
                    block.block_hash = key
                    cached[value] = block
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
        self.kv_stores = []
        self.kv_loads = {}
        return stores, loads
