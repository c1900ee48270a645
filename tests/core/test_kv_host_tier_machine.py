"""Hypothesis state machine over the KV manager with a host tier: store, hit, load, evict, abort and
preempt mid-load, with every device slot and host slot modelled.

Stores run as the executor runs them (at once: before anything reuses the block); a load job lands
only when a rule completes it, so requests wait in between. Every computed position is checked to
hold its own prefix, so reading a block before its load lands fails. Invariants: ref counts equal
table holders plus load jobs, pinned host slots are exactly those of jobs in flight, and every
cached device block and host entry holds the KV of the prefix its key names.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from twinserve.core.fake_executor import KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.tier_tables import TierHits
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 4
NUM_BLOCKS = 12
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], [1, 2, 3, 4, 9, 9, 9, 9, 8], [5, 5, 5, 5, 6, 6, 6, 6, 7, 7]]


def weak_hash(parent, tokens, extra):
    """Collisions everywhere, so host hits must be confirmed by their whole prefix."""
    return (sum(tokens) + (parent or 0)) % 7


class TierMachine(RuleBasedStateMachine):
    """Random interleavings of admit (device and host hits), load completion, grow, finish, abort,
    preempt (mid-load too) and eviction pressure."""

    @initialize(hash_name=st.sampled_from(["xxhash", "weak"]), host_blocks=st.sampled_from([1, 3, 8, 32]),
                policy=st.sampled_from(["lru", "lrfu"]))
    def setup(self, hash_name: str, host_blocks: int, policy: str) -> None:
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, hash_function=weak_hash if hash_name == "weak" else "xxhash",
                                 host_tier=HostTier(host_blocks, policy))
        self.reqs: dict[str, Request] = {}
        self.loading: dict[str, Request] = {}
        self.counter = 0
        self.slots = KVSlotModel(BLOCK_SIZE)
        self.host: dict[int, list | None] = {}
        self.jobs: dict[int, list[tuple[int, int]]] = {}
        self.prefix: dict[str, list[int]] = {}

    def _transfer(self) -> None:
        """Run the manager's queued stores now (as the executor does first thing), keep its loads."""
        stores, loads = self.kv.take_transfers()
        for block_id, slot in stores:
            held = self.slots.slots.get(block_id)
            self.host[slot] = None if held is None else list(held)
        self.jobs.update(loads)

    def _compute(self, req: Request, start: int, end: int) -> None:
        pids = self.slots.prefix_ids(req.all_token_ids, self.prefix.setdefault(req.request_id, []))
        blocks = [b.block_id for b in self.kv.req_to_blocks[req.request_id]]
        self.slots.write(blocks, pids, start, end)
        self.slots.check(req.request_id, blocks, pids, end)  # the context, loaded blocks included
        req.num_computed_tokens = end
        self.kv.cache_blocks(req, end)

    @rule(stem=st.integers(0, len(STEMS) - 1), tail=st.lists(st.integers(0, 9), max_size=6),
          chunk=st.integers(1, 12))
    def admit(self, stem, tail, chunk):
        self.counter += 1
        req = Request(f"r{self.counter}", STEMS[stem] + tail, SamplingParams(max_tokens=64))
        hits, num_hit = self.kv.get_computed_blocks(req)
        num_host = len(hits.host) if type(hits) is TierHits else 0
        event("host hit" if num_host else "device hit" if num_hit else "miss")
        num_new = min(chunk, req.num_tokens - num_hit)
        # As the scheduler: with host hits the first chunk's blocks come unregistered (as drafts).
        new = self.kv.allocate_slots(req, num_new, hits, num_hit,
                                     num_draft_tokens=num_new if num_host else 0)
        self._transfer()
        if new is None:
            assert req.request_id not in self.kv.req_to_blocks
            return
        self.reqs[req.request_id] = req
        if num_host:
            req.num_computed_tokens = num_hit
            self.loading[req.request_id] = req
        else:
            self._compute(req, num_hit, num_hit + num_new)

    @precondition(lambda self: getattr(self, "jobs", None))
    @rule(data=st.data())
    def complete_load(self, data):
        """The executor's copy lands, then it reports the job."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        for slot, block_id in self.jobs.pop(job_id):
            held = self.host.get(slot)
            self.slots.slots[block_id] = None if held is None else list(held)
        for rid in self.kv.complete_loads([job_id]):
            req = self.loading.pop(rid)
            event("load completed")
            # Back in the queue: compute the chunk its held blocks cover.
            room = len(self.kv.req_to_blocks[rid]) * BLOCK_SIZE - req.num_computed_tokens
            n = min(room, req.num_tokens - req.num_computed_tokens)
            if n and self.kv.allocate_slots(req, n) is not None:
                self._transfer()
                self._compute(req, req.num_computed_tokens, req.num_computed_tokens + n)

    @rule(data=st.data(), n=st.integers(1, 9))
    def grow(self, data, n):
        ready = sorted(r for r in self.reqs if r not in self.loading)
        if not ready:
            return
        req = self.reqs[data.draw(st.sampled_from(ready))]
        pending = req.num_tokens - req.num_computed_tokens
        if pending == 0:
            for j in range(n):
                req.append_output_token((req.num_tokens * 3 + j) % 10, 0.0)
            pending = req.num_tokens - req.num_computed_tokens
        num_new = min(pending, n)
        new = self.kv.allocate_slots(req, num_new)
        self._transfer()
        if new is not None:
            self._compute(req, req.num_computed_tokens, req.num_computed_tokens + num_new)

    @precondition(lambda self: getattr(self, "reqs", None))
    @rule(data=st.data(), preempt=st.booleans())
    def abort_or_preempt(self, data, preempt):
        """Abort, finish or preempt any request, one still loading included."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        req = self.reqs.pop(rid)
        if self.loading.pop(rid, None) is not None:
            event("freed mid-load")
            self.kv.free(req, req.num_computed_tokens)
        else:
            self.kv.free(req)
        self.prefix.pop(rid, None)
        if preempt:  # it comes back, computing from scratch or hitting what it left behind
            req.num_computed_tokens = 0
            hits, num_hit = self.kv.get_computed_blocks(req)
            for i, block in enumerate(hits):
                if type(hits) is not TierHits or i < len(hits) - len(hits.host):
                    assert list(block.block_hash.token_ids) == req.all_token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]

    @rule(n=st.integers(1, NUM_BLOCKS))
    def evict_pressure(self, n):
        """Take and give back free blocks, evicting cached ones (and storing them to the host)."""
        n = min(n, self.kv.num_free_blocks)
        blocks = self.kv.pool.get_new_blocks(n)
        self._transfer()
        for b in blocks:
            self.slots.slots[b.block_id] = [("junk",)] * BLOCK_SIZE  # a new owner writes the block
        self.kv.pool.free_blocks(blocks)

    def _chain_kv(self, key) -> list:
        chain = []
        h = key
        while h is not None:
            chain.append(h.token_ids)
            h = h.parent
        tokens = [t for block in reversed(chain) for t in block]
        return self.slots.prefix_ids(tokens, [])[-BLOCK_SIZE:]

    @invariant()
    def accounting(self):
        if not hasattr(self, "kv"):
            return
        kv, pool, host = self.kv, self.kv.pool, self.kv.host
        free = list(pool.free_queue)
        assert len(free) == len({id(b) for b in free}) == pool.free_queue.num_free
        holders: dict[int, int] = {}
        for rid, blocks in kv.req_to_blocks.items():
            assert rid in self.reqs
            for b in blocks:
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        loading_blocks = set()
        pins: dict[int, int] = {}
        for job in kv.load_jobs.values():
            assert job.job_id in self.jobs, "a job in flight the executor never got"
            for b, key in zip(job.blocks, job.keys):
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
                loading_blocks.add(b.block_id)
                pins[key.value] = pins.get(key.value, 0) + 1
                assert b.block_hash is None, "a block still loading has a key: it could be hit"
        assert set(self.jobs) == set(kv.load_jobs)
        for b in pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0)
        assert sum(1 for b in pool.blocks if b.ref_cnt > 0) + len(free) == NUM_BLOCKS
        assert host.pins == pins, "pinned host slots are not exactly those of loads in flight"
        for value, b in pool.cached.items():
            assert b.block_hash.value == value
            assert self.slots.slots.get(b.block_id) == self._chain_kv(b.block_hash), "cached block holds other KV"
        for b in pool.blocks:  # a block has a key iff the cache maps its value to it: a load lands
            # unkeyed where another block took the value meanwhile
            assert b.block_hash is None or pool.cached.get(b.block_hash.value) is b, f"{b!r} keyed, not cached"
        assert len(host.entries) + len(host.free_slots) == host.num_blocks
        used = [slot for slot, _ in host.entries.values()]
        assert len(set(used)) == len(used) and not set(used) & set(host.free_slots)
        for value, (slot, key) in host.entries.items():
            assert key.value == value
            assert self.host.get(slot) == self._chain_kv(key), "host slot holds other KV"
        for rid in self.loading:
            assert kv.is_loading(rid)


TierMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestTierMachine = TierMachine.TestCase
