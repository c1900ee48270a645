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
