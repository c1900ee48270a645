"""Lazy (pending-chain) registration with a host tier against registering every block at once.

Two KV managers with equal host tiers run the same random operations in lockstep: admissions with
device and host hits, loads landing, prefill and decode growth, finish, preemption (mid-load too),
eviction pressure. A pending block is keyed when the pool evicts it, so both must issue the same
stores and loads, in order, leave the tiers with the same entries in the same order, return the
same hits and block ids, and, once the lazy one has registered what it deferred, hold the same
prefix-cache map.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.tier_tables import TierHits
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 2
NUM_BLOCKS = 16
# Few stems and a tiny vocabulary: shared roots, deep shared chains, re-admissions and host hits.
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1], [1, 2, 3, 4, 9, 9], [5, 5, 6, 6, 7, 7, 8, 8], [3, 1, 2]]


def _hits(hits) -> list:
    """A lookup as comparable values: block ids, and (slot, tokens) per host hit."""
    host = [(slot, key.token_ids) for slot, key in hits.host] if type(hits) is TierHits else []
    return [getattr(b, "block_id", "host") for b in hits] + host


def _ids(blocks) -> list[int] | None:
    return None if blocks is None else [b.block_id for b in blocks]


def _tier(kv: KVCacheManager) -> tuple:
    host = kv.host
    return ([(v, slot, key.token_ids) for v, (slot, key) in host.entries.items()], list(host.free_slots),
            dict(host.pins), host.stats)


def _cache_map(kv: KVCacheManager) -> dict[int, tuple[int, tuple[int, ...]]]:
    return {v: (b.block_id, b.block_hash.token_ids) for v, b in kv.pool.cached.items()}


class LazyVsEagerTier(RuleBasedStateMachine):
    """Admit (device and host hits), land loads, grow, finish, preempt (mid-load too), evict."""

    @initialize(host_blocks=st.sampled_from([2, 5, 12, 40]), policy=st.sampled_from(["lru", "lrfu"]))
    def setup(self, host_blocks: int, policy: str) -> None:
        self.kvs = [KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, lazy_registration=lazy,
                                   host_tier=HostTier(host_blocks, policy)) for lazy in (False, True)]
        assert self.kvs[1].lazy and not self.kvs[0].lazy
        self.running: dict[str, tuple[Request, Request]] = {}
        self.loading: dict[str, tuple[Request, Request]] = {}
        self.preempted: list[tuple[Request, Request]] = []
        self.jobs: list[int] = []
        self.counter = 0

    def _transfer(self) -> None:
        """Both managers queued the same stores and loads."""
        stores, loads = zip(*(kv.take_transfers() for kv in self.kvs))
        assert list(stores[0]) == list(stores[1])
        assert loads[0] == loads[1]
        if stores[0]:
            event("stores")
        self.jobs.extend(loads[0])

    def _run(self, pair, num_new: int, hits=((), ()), num_hit: int = 0, drafts: int = 0) -> bool:
        outs = [kv.allocate_slots(r, num_new, h, num_hit, num_draft_tokens=drafts)
                for kv, r, h in zip(self.kvs, pair, hits)]
        self._transfer()
        assert _ids(outs[0]) == _ids(outs[1])
        return outs[0] is not None

    def _compute(self, pair, num_new: int) -> None:
        for kv, r in zip(self.kvs, pair):
            r.num_computed_tokens += num_new
            kv.cache_blocks(r, r.num_computed_tokens)

    def _admit(self, pair, chunk: int) -> None:
        hits = [kv.get_computed_blocks(r) for kv, r in zip(self.kvs, pair)]
        assert _hits(hits[0][0]) == _hits(hits[1][0]) and hits[0][1] == hits[1][1]
        num_hit = hits[0][1]
        num_host = len(hits[0][0].host) if type(hits[0][0]) is TierHits else 0
        event("host hit" if num_host else "device hit" if num_hit else "miss")
        num_new = min(chunk, pair[0].num_tokens - num_hit)
        # As the scheduler: with host hits the first chunk's blocks come unregistered (as drafts).
        if not self._run(pair, num_new, (hits[0][0], hits[1][0]), num_hit, num_new if num_host else 0):
            return
        if num_host:
            for r in pair:
                r.num_computed_tokens = num_hit
            self.loading[pair[0].request_id] = pair
        else:
            for r in pair:
                r.num_computed_tokens = num_hit
            self._compute(pair, num_new)
            self.running[pair[0].request_id] = pair

    @rule(stem=st.integers(0, len(STEMS) - 1), tail=st.lists(st.integers(0, 3), max_size=6),
          chunk=st.integers(1, 9))
    def admit(self, stem, tail, chunk):
        self.counter += 1
        tokens = STEMS[stem] + tail
        self._admit(tuple(Request(f"r{self.counter}", list(tokens), SamplingParams(max_tokens=99))
                          for _ in range(2)), chunk)

    @precondition(lambda self: self.preempted)
    @rule(i=st.integers(0, 10), chunk=st.integers(1, 9))
    def readmit_preempted(self, i, chunk):
        """A preempted request comes back with its old block keys."""
        self._admit(self.preempted.pop(i % len(self.preempted)), chunk)

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, 10))
    def complete_load(self, i):
        """A load job lands; its request computes what its held blocks cover."""
        job_id = self.jobs.pop(i % len(self.jobs))
        ready = [kv.complete_loads([job_id]) for kv in self.kvs]
        assert ready[0] == ready[1]
        for rid in ready[0]:
            pair = self.loading.pop(rid)
            event("load landed")
            room = len(self.kvs[0].req_to_blocks[rid]) * BLOCK_SIZE - pair[0].num_computed_tokens
            n = min(room, pair[0].num_tokens - pair[0].num_computed_tokens)
            if n and self._run(pair, n):
                self._compute(pair, n)
            self.running[rid] = pair

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10), n=st.integers(1, 6), sample=st.integers(0, 3))
    def grow(self, i, n, sample):
        """A prefill chunk, or decodes with freshly sampled tokens."""
        pair = list(self.running.values())[i % len(self.running)]
        if pair[0].num_computed_tokens == pair[0].num_tokens:
            for r in pair:
                r.append_output_token(sample, 0.0)
        num_new = min(n, pair[0].num_tokens - pair[0].num_computed_tokens)
        if self._run(pair, num_new):
            self._compute(pair, num_new)

    @precondition(lambda self: self.running or self.loading)
    @rule(i=st.integers(0, 10), mode=st.sampled_from(["finish", "preempt", "in_flight"]),
          n=st.integers(1, 6))
    def release(self, i, mode, n):
        """Finish; preempt (a loading request too); or preempt with a step allocated but not run."""
        table = self.loading if (not self.running or (self.loading and i % 3 == 0)) else self.running
        rid = list(table)[i % len(table)]
        pair = table.pop(rid)
        computed = pair[0].num_computed_tokens
        if table is self.running and mode == "in_flight" and computed < pair[0].num_tokens:
            self._run(pair, min(n, pair[0].num_tokens - computed))
        for kv, r in zip(self.kvs, pair):
            kv.free(r, computed if mode == "in_flight" or table is self.loading else None)
            if mode != "finish":
                r.num_computed_tokens = 0
        if mode != "finish":
            self.preempted.append(pair)

    @rule(n=st.integers(1, NUM_BLOCKS))
    def evict_pressure(self, n):
        n = min(n, self.kvs[0].num_free_blocks)
        taken = [kv.pool.get_new_blocks(n) for kv in self.kvs]
        assert _ids(taken[0]) == _ids(taken[1])
        self._transfer()
        for kv, blocks in zip(self.kvs, taken):
            kv.pool.free_blocks(blocks)

    @invariant()
    def same_state_once_registered(self):
        if not hasattr(self, "kvs"):
            return
        eager, lazy = self.kvs
        assert _tier(eager) == _tier(lazy)
        assert eager.num_free_blocks == lazy.num_free_blocks
        assert eager.num_cached_blocks == lazy.num_cached_blocks
        assert {r: _ids(b) for r, b in eager.req_to_blocks.items()} == \
               {r: _ids(b) for r, b in lazy.req_to_blocks.items()}
        assert [b.block_id for b in eager.pool.free_queue] == [b.block_id for b in lazy.pool.free_queue]
        flushed = copy.deepcopy(lazy)  # the deferred work, done on a copy
        flushed.flush_pending()
        assert _cache_map(flushed) == _cache_map(eager)
        assert flushed.pool.num_evictions == eager.pool.num_evictions


LazyVsEagerTier.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
TestLazyVsEagerTier = LazyVsEagerTier.TestCase


class _Steps:
    """A KV manager with a host tier driven by hand: whole prompts computed without a lookup (a copy
    admitted before another registered it), every free block evicted at once, transfers collected."""

    def __init__(self, lazy: bool) -> None:
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, lazy_registration=lazy, host_tier=HostTier(64, "lru"))
        self.stores: list = []

    def compute(self, rid: str, tokens: list[int]) -> Request:
        r = Request(rid, list(tokens), SamplingParams(max_tokens=9))
        self.kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        self.kv.cache_blocks(r, r.num_tokens)
        return r

    def load(self, rid: str, tokens: list[int], num_host: int) -> tuple[Request, int]:
        """Admit with a lookup that reaches num_host blocks into the tier; (request, load job)."""
        r = Request(rid, list(tokens), SamplingParams(max_tokens=9))
        hits, num_hit = self.kv.get_computed_blocks(r)
        assert type(hits) is TierHits and len(hits.host) == num_host
        assert self.kv.allocate_slots(r, 1, hits, num_hit, num_draft_tokens=1) is not None
        (job,) = self.transfer()
        return r, job

    def evict_all(self) -> None:
        blocks = self.kv.pool.get_new_blocks(self.kv.num_free_blocks)
        self.kv.pool.free_blocks(blocks)

    def transfer(self) -> dict:
        s, loads = self.kv.take_transfers()
        self.stores.extend(s)
        return loads

    def state(self) -> tuple:
        self.transfer()
        return _tier(self.kv), self.stores


def _load_passes_a_pending_root(lazy: bool) -> tuple:
    """b loads blocks 0-4 while c's pending chain (root: block 2) holds blocks 3-4 in name only."""
    t = _Steps(lazy)
    a, x = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10]  # blocks 0-1 and 2-4
    t.kv.free(t.compute("e", a + x + [11]))
    t.evict_all()  # the tier holds blocks 0-4 of a + x
    d = t.compute("d", a + [77])
    t.compute("c", a + x + [11])  # takes blocks 0-1 from d; block 2 new: with lazy, a root (3-4 pending)
    t.kv.free(t.compute("f", a + [78]))  # takes blocks 0-1 from c
    t.kv.free(d)
    t.evict_all()  # no device block holds blocks 0-1 now; c still holds its root
    b, job = t.load("b", a + x + [11], 5)  # misses block 0 on the device: all five from the tier
    assert t.kv.complete_loads([job]) == ["b"]  # block 2 lands where c's root holds its key
    t.kv.free(b)
    t.evict_all()  # b's copies go: one keyed here would touch the tier's order
    return t.state()


def _claim_fails_then_a_chain_starts(lazy: bool) -> tuple:
    """x's load lands where y holds blocks 0-2 (only block 3 is keyed to x); y goes; c computes the
    same prefix: blocks 0-2 are contested, so c registers them and takes block 3 from x at once."""
    t = _Steps(lazy)
    p = [1, 2, 3, 4, 5, 6, 7, 8]  # blocks 0-3
    t.kv.free(t.compute("e", p + [9]))
    t.evict_all()  # the tier holds blocks 0-3
    x, job = t.load("x", p + [9], 4)
    y = t.compute("y", p[:6] + [50])  # blocks 0-2 while x's copies are in flight
    t.kv.get_computed_blocks(Request("z", p[:6] + [51], SamplingParams()))  # a lookup registers y's chain
    assert t.kv.complete_loads([job]) == ["x"]  # blocks 0-2 held by y: only block 3 is keyed to x
    t.kv.free(y)
    t.evict_all()  # y's blocks go: nothing on the device holds blocks 0-2
    t.compute("c", p + [60])  # a new chain at block 0 would leave block 3 keyed to x
    t.kv.free(x)
    t.evict_all()  # x's copies go: one keyed here would touch the tier's order
    return t.state()


def _orphan_load_then_a_chain(lazy: bool) -> tuple:
    """x is preempted mid-load; its copies land keyed and go back to the pool in order, so block 0 is
    evicted before blocks 1-3; c computes the same prefix while 1-3 are held elsewhere."""
    t = _Steps(lazy)
    p = [1, 2, 3, 4, 5, 6, 7, 8]  # blocks 0-3
    t.kv.free(t.compute("e", p + [9]))
    t.evict_all()  # the tier holds blocks 0-3
    x, job = t.load("x", p + [9], 4)
    copies = list(t.kv.load_jobs[job].blocks)
    t.kv.free(x, x.num_computed_tokens)  # gone mid-load: the job finishes for the blocks' sake
    assert t.kv.complete_loads([job]) == []
    t.kv.pool.touch(copies[1:])  # held elsewhere while block 0 is evicted
    t.evict_all()
    t.compute("c", p + [60])  # a chain at block 0 would leave blocks 1-3 keyed to x's copies
    t.kv.pool.free_blocks(copies[1:])
    t.evict_all()  # x's copies go: one keyed here would touch the tier's order
    return t.state()


def test_a_load_passing_a_pending_root_leaves_the_tier_as_eager_registration_does():
    """The landing load finds blocks 3-4 taken (as eager registration has them): b's copies stay
    unkeyed and evicting them leaves the tier's order alone (fails without complete_loads' flush)."""
    assert _load_passes_a_pending_root(True) == _load_passes_a_pending_root(False)


def test_a_failed_claim_keeps_later_chains_from_its_key():
    """Blocks whose landing load found them held elsewhere are contested: no chain starts there, so
    x's block 3 loses its key to c as with eager registration (fails without the contest)."""
    assert _claim_fails_then_a_chain_starts(True) == _claim_fails_then_a_chain_starts(False)


def test_an_orphan_loads_blocks_keep_later_chains_from_their_keys():
    """A job whose request is gone frees its blocks parents first, so its keys are contested: c
    registers at once and takes blocks 1-3 from x's copies (fails without that contest)."""
    assert _orphan_load_then_a_chain(True) == _orphan_load_then_a_chain(False)
