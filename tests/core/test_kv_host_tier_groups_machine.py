"""Hypothesis state machine over the KV manager with a host tier AND KV groups (full attention beside
sliding windows, one all-layer window, windows only): store, hit, load, evict, abort and preempt
mid-load, with every device slot and host slot modelled per group.

Each group's layers hold other KV (KVSlotModel tags group g's slots), so a load from another group's
host slot, or a window block read before its load lands, fails a check. Invariants: ref counts equal
the holders in every group's table plus load jobs, pinned host slots are exactly those of jobs in
flight, no loading block has a key, and every cached device block and host entry holds the KV of the
prefix and group its key names.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from twinserve.core.fake_executor import KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.block_pool import OUT_OF_WINDOW
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.tier_tables import TierHits
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 4
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], [1, 2, 3, 4, 9, 9, 9, 9, 8], [5, 5, 5, 5, 6, 6, 6, 6, 7, 7]]
# kv_groups (0 = full attention); () with a window: one all-layer sliding group.
LAYOUTS = [((0, 3), None), ((0, 0, 6), None), ((), 5), ((3, 9), None)]


def weak_hash(parent, tokens, extra):
    """Collisions everywhere, so hits must be confirmed by prefix and group.

    A KV group's key (parent = group 0's key value, no tokens) keeps its group apart but folds group 0's
    7 values into 3, as tests/core/test_kv_state_machine.py's does: a group's block, on the device or in
    the host tier, then collides with another prefix's while group 0's do not, so a group hit must be
    confirmed by its parent key (TierTables._group_source), not by group 0's hit alone. (Before, a group
    key's value was group 0's plus 2, mod 7: one-to-one, so group keys collided only where group 0's did.)"""
    if extra and extra[0] == "kv_group":
        return (parent or 0) % 3 + 10 * (extra[1] + 1)
    return (sum(tokens) + (parent or 0) + len(extra or ())) % 7


class GroupTierMachine(RuleBasedStateMachine):
    """Random interleavings of admit, load completion, grow, finish, abort/preempt (mid-load too) and
    eviction pressure, over several KV groups."""

    @initialize(layout=st.sampled_from(LAYOUTS), hash_name=st.sampled_from(["xxhash", "weak"]),
                host_blocks=st.sampled_from([1, 3, 8, 40]), policy=st.sampled_from(["lru", "lrfu"]))
    def setup(self, layout, hash_name, host_blocks, policy) -> None:
        groups, window = layout
        self.num_blocks = 12 * max(1, len(groups))
        self.kv = KVCacheManager(self.num_blocks, BLOCK_SIZE, hash_function=weak_hash if hash_name == "weak" else "xxhash",
                                 kv_groups=groups, sliding_window=window, host_tier=HostTier(host_blocks, policy))
        self.windows = self.kv.group_windows
        self.reqs: dict[str, Request] = {}
        self.loading: dict[str, Request] = {}
        self.counter = 0
        self.slots = KVSlotModel(BLOCK_SIZE)
        self.host: dict[int, list | None] = {}
        self.jobs: dict[int, list[tuple[int, int]]] = {}
        self.prefix: dict[str, list[int]] = {}

    def _tables(self, rid: str) -> list[list]:
        return self.kv.req_tables.get(rid) or [self.kv.req_to_blocks[rid]]

    def _transfer(self) -> None:
        """Run the queued stores now (the executor's first act in a step), keep the loads."""
        stores, loads = self.kv.take_transfers()
        for block_id, slot in stores:
            held = self.slots.slots.get(block_id)
            self.host[slot] = None if held is None else list(held)
        self.jobs.update(loads)

    def _compute(self, req: Request, start: int, end: int) -> None:
        pids = self.slots.prefix_ids(req.all_token_ids, self.prefix.setdefault(req.request_id, []))
        for g, (table, w) in enumerate(zip(self._tables(req.request_id), self.windows)):
            ids = [b.block_id for b in table]
            self.slots.write(ids, pids, start, end, g)
        for g, (table, w) in enumerate(zip(self._tables(req.request_id), self.windows)):
            ids = [b.block_id for b in table]
            # What attention reads: all before end, or the window of the step's first token.
            self.slots.check(req.request_id, ids, pids, end, 0 if w is None else max(0, start - w + 1), g)
        req.num_computed_tokens = end
        self.kv.cache_blocks(req, end)

    @rule(stem=st.integers(0, len(STEMS) - 1), tail=st.lists(st.integers(0, 9), max_size=6),
          chunk=st.integers(1, 12))
    def admit(self, stem, tail, chunk):
        self.counter += 1
        req = Request(f"r{self.counter}", STEMS[stem] + tail, SamplingParams(max_tokens=64))
        hits, num_hit = self.kv.get_computed_blocks(req)
        loads = isinstance(hits, TierHits)
        event("host hit" if loads else "device hit" if num_hit else "miss")
        num_new = min(chunk, req.num_tokens - num_hit)
        new = self.kv.allocate_slots(req, num_new, hits, num_hit, num_draft_tokens=num_new if loads else 0)
        self._transfer()
        if new is None:
            assert req.request_id not in self.kv.req_to_blocks and not self.kv.is_loading(req.request_id)
            return
        self.reqs[req.request_id] = req
        if loads:
            req.num_computed_tokens = num_hit
            self.loading[req.request_id] = req
        else:
            self._compute(req, num_hit, num_hit + num_new)

    @precondition(lambda self: getattr(self, "jobs", None))
    @rule(data=st.data())
    def complete_load(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        for slot, block_id in self.jobs.pop(job_id):
            held = self.host.get(slot)
            self.slots.slots[block_id] = None if held is None else list(held)
        for rid in self.kv.complete_loads([job_id]):
            req = self.loading.pop(rid)
            event("load completed")
            room = len(self._tables(rid)[0]) * BLOCK_SIZE - req.num_computed_tokens
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
        if req.num_tokens == req.num_computed_tokens:
            for j in range(n):
                req.append_output_token((req.num_tokens * 3 + j) % 10, 0.0)
        num_new = min(req.num_tokens - req.num_computed_tokens, n)
        new = self.kv.allocate_slots(req, num_new)
        self._transfer()
        if new is not None:
            self._compute(req, req.num_computed_tokens, req.num_computed_tokens + num_new)

    @precondition(lambda self: getattr(self, "reqs", None))
    @rule(data=st.data(), preempt=st.booleans())
    def abort_or_preempt(self, data, preempt):
        """Abort, finish or preempt any request, one still loading included; a preempted one looks up again."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        req = self.reqs.pop(rid)
        if self.loading.pop(rid, None) is not None:
            event("freed mid-load")
            self.kv.free(req, req.num_computed_tokens)
        else:
            self.kv.free(req)
        self.prefix.pop(rid, None)
        if preempt:
            req.num_computed_tokens = 0
            self.kv.get_computed_blocks(req)

    @rule(n=st.integers(1, 24))
    def evict_pressure(self, n):
        """Take and give back free blocks, evicting cached ones (stored to the host)."""
        n = min(n, self.kv.num_free_blocks)
        blocks = self.kv.pool.get_new_blocks(n)
        self._transfer()
        for b in blocks:
            self.slots.slots[b.block_id] = [("junk",)] * BLOCK_SIZE
        self.kv.pool.free_blocks(blocks)

    def _key_kv(self, key) -> list:
        """The KV a block keyed by key holds: its prefix's last block, tagged with its group."""
        group = 0
        if key.extra_keys and key.extra_keys[0] == "kv_group":
            group, key = key.extra_keys[1], key.parent
        chain = []
        while key is not None:
            chain.append(key.token_ids)
            key = key.parent
        tokens = [t for block in reversed(chain) for t in block]
        ids = self.slots.prefix_ids(tokens, [])[-BLOCK_SIZE:]
        return ids if not group else [(group, p) for p in ids]

    @invariant()
    def accounting(self):
        if not hasattr(self, "kv"):
            return
        kv, pool, host = self.kv, self.kv.pool, self.kv.host
        free = list(pool.free_queue)
        assert len(free) == len({id(b) for b in free}) == pool.free_queue.num_free
        holders: dict[int, int] = {}
        for rid in kv.req_to_blocks:
            assert rid in self.reqs
            for table in self._tables(rid):
                assert len(table) == len(self._tables(rid)[0]), "group tables of unequal length"
                for b in table:
                    if b is not OUT_OF_WINDOW:
                        holders[b.block_id] = holders.get(b.block_id, 0) + 1
        pins: dict[int, int] = {}
        for job in kv.load_jobs.values():
            assert job.job_id in self.jobs
            for b, key in zip(job.blocks, job.keys):
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
                pins[key.value] = pins.get(key.value, 0) + 1
                assert b.block_hash is None, "a block still loading has a key: it could be hit"
        assert set(self.jobs) == set(kv.load_jobs)
        for b in pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0)
        assert sum(1 for b in pool.blocks if b.ref_cnt > 0) + len(free) == self.num_blocks
        assert host.pins == pins, "pinned host slots are not exactly those of loads in flight"
        for value, b in pool.cached.items():
            assert b.block_hash.value == value
            assert self.slots.slots.get(b.block_id) == self._key_kv(b.block_hash), "cached block holds other KV"
        assert len(host.entries) + len(host.free_slots) == host.num_blocks
        used = [slot for slot, _ in host.entries.values()]
        assert len(set(used)) == len(used) and not set(used) & set(host.free_slots)
        for value, (slot, key) in host.entries.items():
            assert key.value == value
            assert self.host.get(slot) == self._key_kv(key), "host slot holds other KV"
        for rid in self.loading:
            assert kv.is_loading(rid)


GroupTierMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestGroupTierMachine = GroupTierMachine.TestCase


class _Draws:
    """st.data() replayed: each draw returns the next recorded value."""

    def __init__(self, *values) -> None:
        self.values = list(values)

    def draw(self, strategy):
        return self.values.pop(0)


def test_a_group_host_entry_under_another_prefix_is_not_loaded(monkeypatch):
    """The machine's run that finds a group hit taken without its parent check (planted in
    TierTables._group_source: the random profile found it in 1,500 examples with the weak hash above,
    the derandomised 150 do not reach it), pinned as a plain test. r3's group-1 key collides with an
    entry that r2's stem left in the one host slot; loading it would put r2's KV under r4's prefix."""
    monkeypatch.setitem(globals(), "event", lambda *a: None)  # hypothesis' event() needs a running test
    m = GroupTierMachine()
    m.setup(layout=((0, 3), None), hash_name="weak", host_blocks=1, policy="lru")
    steps = [("evict_pressure", dict(n=1))] * 4 + [
        ("admit", dict(chunk=8, stem=1, tail=[])),
        ("abort_or_preempt", dict(data=_Draws("r1"), preempt=False)),
        ("evict_pressure", dict(n=18)),
        ("admit", dict(chunk=5, stem=0, tail=[])),
        ("admit", dict(chunk=4, stem=1, tail=[])),
        ("evict_pressure", dict(n=1)),
        ("admit", dict(chunk=1, stem=0, tail=[])),
    ]
    for name, kwargs in steps:
        m.accounting()
        getattr(m, name)(**kwargs)
    m.accounting()
    while m.jobs:
        m.complete_load(_Draws(sorted(m.jobs)[0]))
        m.accounting()
