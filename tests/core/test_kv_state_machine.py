"""Hypothesis state machine over block pool + KV manager + prefix cache, with every KV slot modelled.

Each rule that computes tokens writes their KV (the identity of the prefix they end)
into a model of every slot, then checks that every position the request attends to
holds its own prefix (with a sliding window: the window's positions, while the manager
frees the blocks before it). An invariant checks that every cached block holds exactly the
prefix its key names, walking the key's parent chain.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize,
                                 invariant, precondition, rule)

from twinserve.core.errors import PrefixCacheBusyError
from twinserve.core.fake_executor import KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 4
NUM_BLOCKS = 24
# A tiny vocabulary and a few shared stems make prefix hits frequent.
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5, 6, 6, 6, 6, 7, 7]]


def weak_hash(parent, tokens, extra):
    """A deliberately terrible hash: collisions everywhere, so confirmation is exercised.

    A KV group's key keeps its group apart (as a real hash does) but folds group 0's 7 values into
    3: a group's block then collides with another prefix's while group 0's do not, so a group hit
    must be confirmed by its parent key, not by group 0's hit alone."""
    if extra and extra[0] == "kv_group":
        return (parent or 0) % 3 + 10 * (extra[1] + 1)
    return (sum(tokens) + (parent or 0)) % 7


class KVMachine(RuleBasedStateMachine):
    """Random interleavings of allocate, grow, prefix hit, free, evict, reset and abort."""

    live = Bundle("live")

    @initialize(hash_name=st.sampled_from(["xxhash", "xxhash-eager", "weak"]),
                window=st.sampled_from([None, None, 1, 3, 6]),
                groups=st.sampled_from([(), (), (0, 3), (0, 1, 6), (3, 6), (0, 0, 5)]))
    def setup(self, hash_name: str, window: int | None, groups: tuple[int, ...]) -> None:
        # xxhash registers blocks past a new root lazily (PendingChain); the others at once.
        # groups: several KV groups (0 = full), which replace the one window.
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_caching=True,
                                 hash_function=weak_hash if hash_name == "weak" else "xxhash",
                                 lazy_registration=hash_name == "xxhash", sliding_window=window,
                                 kv_groups=groups)
        self.windows = list(self.kv.group_windows)
        self.window = self.windows[0] if len(self.windows) == 1 else None
        self.reqs: dict[str, Request] = {}
        self.counter = 0
        self.slots = KVSlotModel(BLOCK_SIZE)
        self.prefix: dict[str, list[int]] = {}

    def _compute(self, req: Request, start: int, end: int) -> None:
        """Run positions start..end-1 as a step would: write their KV, read the context, cache."""
        pids = self.slots.prefix_ids(req.all_token_ids, self.prefix.setdefault(req.request_id, []))
        for g, window in enumerate(self.windows):
            blocks = [b.block_id for b in self._tables(req.request_id)[g]]
            self.slots.write(blocks, pids, start, end, g)
            lo = 0 if window is None else max(0, start - window + 1)
            self.slots.check(req.request_id, blocks, pids, end, lo, g)
        req.num_computed_tokens = end
        self.kv.cache_blocks(req, end)

    def _tables(self, rid: str) -> list[list]:
        """The request's block table per group."""
        return self.kv.req_tables.get(rid) or [self.kv.req_to_blocks[rid]]

    def _new_request(self, stem: int, tail: list[int], salt: str | None) -> Request:
        self.counter += 1
        return Request(f"r{self.counter}", STEMS[stem] + tail, SamplingParams(max_tokens=64),
                       cache_salt=salt)

    @rule(target=live, stem=st.integers(0, len(STEMS) - 1),
          tail=st.lists(st.integers(0, 9), max_size=9),
          salt=st.sampled_from([None, None, "tenant-a"]),
          chunk=st.integers(1, 12))
    def admit(self, stem, tail, salt, chunk):
        req = self._new_request(stem, tail, salt)
        hits, num_hit = self.kv.get_computed_blocks(req)
        # A prefix hit returns blocks whose stored tokens equal the request's prefix.
        assert num_hit <= req.num_tokens - 1
        event("prefix hit" if num_hit else "prefix miss")
        if num_hit and len(self.windows) > 1:
            event("prefix hit across groups")
        for i, block in enumerate(hits):
            assert block.block_hash is not None
            assert list(block.block_hash.token_ids) == req.all_token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
        num_new = min(chunk, req.num_tokens - num_hit)
        new = self.kv.allocate_slots(req, num_new, hits, num_hit)
        if new is None:
            assert req.request_id not in self.kv.req_to_blocks
            return None
        self.reqs[req.request_id] = req
        self._compute(req, num_hit, num_hit + num_new)
        return req.request_id

    @rule(stem=st.integers(0, len(STEMS) - 1), tail=st.lists(st.integers(0, 9), max_size=9),
          chunk=st.integers(1, 12))
    def admit_then_preempt_before_compute(self, stem, tail, chunk):
        """Blocks allocated for a step that never runs (preempted or aborted in the same step)."""
        req = self._new_request(stem, tail, None)
        hits, num_hit = self.kv.get_computed_blocks(req)
        num_new = min(chunk, req.num_tokens - num_hit)
        if self.kv.allocate_slots(req, num_new, hits, num_hit) is not None:
            # Blocks are registered at allocation: the caller says what was really computed.
            self.kv.free(req, num_hit)

    @rule(rid=live, n=st.integers(1, 9))
    def grow(self, rid, n):
        """Continue a prefill chunk or decode: compute pending tokens, or append new ones."""
        req = self.reqs.get(rid)
        if req is None:
            return
        pending = req.num_tokens - req.num_computed_tokens
        if pending == 0:
            for j in range(n):
                req.append_output_token((req.num_tokens * 3 + j) % 10, 0.0)
            pending = req.num_tokens - req.num_computed_tokens
        num_new = min(pending, n)
        held = len(self.kv.req_to_blocks[rid])
        free_before = self.kv.num_free_blocks
        new = self.kv.allocate_slots(req, num_new)
        if new is None:
            # A sliding window may still have returned blocks it left behind.
            assert self.kv.num_free_blocks == free_before or (
                any(w is not None for w in self.windows) and self.kv.num_free_blocks > free_before)
            assert len(self.kv.req_to_blocks[rid]) == held
            return
        self._compute(req, req.num_computed_tokens, req.num_computed_tokens + num_new)

    @rule(rid=consumes(live))
    def finish(self, rid):
        req = self.reqs.pop(rid, None)
        if req is not None:
            self.kv.free(req)
            self.prefix.pop(rid, None)

    @rule(rid=consumes(live))
    def abort_or_preempt(self, rid):
        """Abort and preemption both free everything; a preempted request may come back."""
        req = self.reqs.pop(rid, None)
        if req is None:
            return
        self.kv.free(req)
        self.prefix.pop(rid, None)
        req.num_computed_tokens = 0
        hits, num_hit = self.kv.get_computed_blocks(req)
        for i, block in enumerate(hits):
            assert list(block.block_hash.token_ids) == req.all_token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]

    @rule(n=st.integers(1, NUM_BLOCKS))
    def evict_pressure(self, n):
        """Take and give back blocks straight from the pool, evicting cached ones lazily."""
        n = min(n, self.kv.num_free_blocks)
        blocks = self.kv.pool.get_new_blocks(n)
        for b in blocks:
            assert b.block_hash is None and b.ref_cnt == 1
        self.kv.pool.free_blocks(blocks)

    @rule()
    def reset(self):
        if self.kv.num_free_blocks == NUM_BLOCKS:
            self.kv.reset_prefix_cache()
            assert not self.kv.pool.cached
        else:
            try:
                self.kv.reset_prefix_cache()
            except PrefixCacheBusyError:
                pass
            else:
                raise AssertionError("reset allowed while blocks are in use")

    @invariant()
    def accounting(self):
        if not hasattr(self, "kv"):
            return
        pool = self.kv.pool
        free = list(pool.free_queue)
        # free + in use = total, and the free queue has no duplicates
        assert len(free) == len(set(id(b) for b in free)) == pool.free_queue.num_free
        holders: dict[int, int] = {}
        for rid in self.kv.req_to_blocks:
            assert rid in self.reqs
            tables = self._tables(rid)
            assert len(tables) == len(self.windows)
            assert len({len(t) for t in tables}) == 1, "group tables out of step"
            for blocks in tables:
                for b in blocks:
                    if b.block_id >= 0:  # not an OUT_OF_WINDOW placeholder
                        holders[b.block_id] = holders.get(b.block_id, 0) + 1
        in_use = sum(1 for b in pool.blocks if b.ref_cnt > 0)
        assert in_use + len(free) == NUM_BLOCKS
        for b in pool.blocks:
            # every ref count equals the number of live block tables holding the block
            assert b.ref_cnt == holders.get(b.block_id, 0)
        for b in free:
            assert b.ref_cnt == 0
        # every cached key maps to a block whose stored tokens give that key, and the block
        # holds exactly the KV of the whole prefix the key's chain names
        cached_blocks = set()
        for key, b in pool.cached.items():
            h = b.block_hash
            assert h is not None and h.value == key
            parent = None if h.parent is None else h.parent.value
            assert self.kv.hash_fn(parent, h.token_ids, h.extra_keys) == key
            # Group g's key: ("kv_group", g) over group 0's key for the same prefix.
            group = h.extra_keys[1] if h.extra_keys and h.extra_keys[0] == "kv_group" else 0
            if group:
                assert h.token_ids == () and h.parent is not None
                h = h.parent
            chain = []
            while h is not None:
                chain.append(h.token_ids)
                h = h.parent
            tokens = [t for block in reversed(chain) for t in block]
            pids = self.slots.prefix_ids(tokens, [])
            want = pids[-BLOCK_SIZE:] if not group else [(group, p) for p in pids[-BLOCK_SIZE:]]
            assert self.slots.slots.get(b.block_id) == want, "cached block holds other KV"
            cached_blocks.add(b.block_id)
        # a block has a key exactly when it is in the map
        for b in pool.blocks:
            assert (b.block_hash is not None) == (b.block_id in cached_blocks)
        # block tables cover each request's computed tokens
        for rid, req in self.reqs.items():
            assert len(self.kv.req_to_blocks[rid]) * BLOCK_SIZE >= req.num_computed_tokens


KVMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestKVMachine = KVMachine.TestCase
