"""Hypothesis state machine over the KV manager with a host tier: store, hit, load, evict, abort and
preempt mid-load, with every device slot and host slot modelled.

Stores run as the executor runs them (at once: before anything reuses the block); a load job lands
only when a rule completes it, so requests wait in between. Every computed position is checked to
hold its own prefix, so reading a block before its load lands fails. Invariants: ref counts equal
table holders plus load jobs, pinned host slots are exactly those of jobs in flight, and every
cached device block and host entry holds the KV of the prefix its key names.

The weak hash collides often, but random prompts almost never made a host entry that the lookup
finds by value yet must refuse (so a lookup confirming a hit without its tokens, its parent, or its
parent's whole chain passed, planted in tier_tables._host_hits and BlockHash.__eq__): a stem and the
collision rule build such prompts on purpose, and test_a_colliding_host_entry_is_refused_at_every_depth
plays each case.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as _hypothesis_event
from hypothesis.control import currently_in_test_context
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
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], [1, 2, 3, 4, 9, 9, 9, 9, 8], [5, 5, 5, 5, 6, 6, 6, 6, 7, 7],
         # The first's with its first block rotated: under the weak hash every block collides with the
         # first's (block 0: no parent, other tokens; then the same tokens under another parent of the
         # same value), so a host hit confirmed by value, tokens or parent value alone loads other KV.
         [2, 3, 4, 1, 5, 6, 7, 8, 9, 1, 2, 3, 4]]


def event(name: str) -> None:
    """hypothesis.event inside the machine's run; nothing when a test plays the rules itself."""
    if currently_in_test_context():
        _hypothesis_event(name)


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
        self._admit(STEMS[stem] + tail, chunk)

    @precondition(lambda self: getattr(self, "kv", None) is not None and len(self.kv.host.entries) > 0)
    @rule(data=st.data(), head_first=st.booleans(), tail=st.lists(st.integers(0, 9), min_size=1, max_size=3),
          chunk=st.integers(1, 12))
    def admit_collision(self, data, head_first, tail, chunk):
        """A prompt whose blocks collide with a stored prefix's under the weak hash: one block's tokens
        rotated (the same sum: the same weak value, another prefix), the blocks after it unchanged. The
        host entries its lookup finds by value name the other prefix, and must be refused: at the rotated
        block (its parent, other tokens), and, once this prompt's own blocks hit up to there or further
        (head_first), at the next (its tokens, under another parent chain whose values agree). Random
        prompts met these almost never, so a lookup that skipped a check passed."""
        _, key = data.draw(st.sampled_from(sorted(self.kv.host.entries.values(), key=lambda e: e[0])))
        depth = 0
        k = key
        while k is not None:
            depth, k = depth + 1, k.parent
        self._collide(key, data.draw(st.integers(0, depth - 1)), head_first, tail, chunk)

    def _collide(self, key, j: int, head_first: bool, tail: list[int], chunk: int) -> None:
        """admit_collision with its entry's key and the block to rotate given."""
        chain = []
        while key is not None:
            chain.append(list(key.token_ids))
            key = key.parent
        chain.reverse()
        turned = chain[j][1:] + chain[j][:1]
        if turned == chain[j]:
            return
        chain[j] = turned
        event("a prompt colliding with a stored prefix" + (", its own head first" if head_first else ""))
        if head_first and len(chain) > 1:
            # All but the last block, computed after the other prefix's blocks left the device (so
            # these take their values there): the lookup then reaches the drawn entry, whose parent is
            # this prompt's at the rotated block (other tokens) or only further back (j < len - 2:
            # the same tokens and value, an ancestor differs).
            self._evict(self.kv.num_free_blocks)
            head = [t for b in chain[:-1] for t in b]
            self._admit(head, len(head))
            for job_id in sorted(self.jobs):  # its host hits land (and it computes the rest)
                self._complete(job_id)
        self._admit([t for b in chain for t in b] + tail, chunk)

    def _admit(self, prompt: list[int], chunk: int) -> None:
        self.counter += 1
        req = Request(f"r{self.counter}", prompt, SamplingParams(max_tokens=64))
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
        self._complete(data.draw(st.sampled_from(sorted(self.jobs))))

    def _complete(self, job_id: int) -> None:
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
        self._drop(data.draw(st.sampled_from(sorted(self.reqs))), preempt)

    def _drop(self, rid: str, preempt: bool) -> None:
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
        self._evict(n)

    def _evict(self, n: int) -> None:
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


@pytest.mark.parametrize("j, head_first", [(2, False), (1, True), (0, True)],
                         ids=["other-tokens-same-parent", "same-tokens-other-parent", "same-parent-other-ancestor"])
def test_a_colliding_host_entry_is_refused_at_every_depth(j: int, head_first: bool) -> None:
    """The machine's collision rule, played where each check alone stands between a lookup and another
    prefix's KV: the first prompt's three blocks stored to the host, then a prompt with block j rotated
    (with head_first, its own blocks before the last computed first). A host hit confirmed without its
    tokens, its parent, or its parent's whole chain (BlockHash equality) loads the first prompt's KV,
    which the computed positions' check finds. The derandomised machine alone missed each of the three."""
    m = TierMachine()
    m.setup("weak", 8, "lru")
    m._admit(STEMS[0], 12)
    m._drop("r1", preempt=False)
    m._evict(NUM_BLOCKS)
    m.accounting()
    key = next(k for _, k in m.kv.host.entries.values() if len(_chain(k)) == 3)
    m._collide(key, j, head_first, [5], 4)
    m.accounting()
    assert m.jobs or not m.loading
    for job_id in sorted(m.jobs):
        m._complete(job_id)
        m.accounting()
    for rid in sorted(m.reqs):  # the rest of every prompt, each computed position checked
        req = m.reqs[rid]
        n = req.num_tokens - req.num_computed_tokens
        if n and m.kv.allocate_slots(req, n) is not None:
            m._transfer()
            m._compute(req, req.num_computed_tokens, req.num_tokens)
        m.accounting()


def _chain(key) -> list:
    out = []
    while key is not None:
        out.append(key.token_ids)
        key = key.parent
    return out


TierMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestTierMachine = TierMachine.TestCase
