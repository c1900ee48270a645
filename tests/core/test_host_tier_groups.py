"""The host tier with KV groups and sliding windows, through the engine core and the KV-checking executor.

Each group's layers are other KV (KVSlotModel tags them), so a load into the wrong group's block, a
window-group block read before its load lands, or a block holding another prefix fails the run.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import SchedulerConfig
from twinserve.core.fake_executor import ContractViolation, FakeExecutor
from twinserve.core.kv.block_pool import OUT_OF_WINDOW
from twinserve.core.kv.hashing import xxhash64
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.kv_cache_manager import KVCacheManager
from twinserve.core.kv.tier_tables import HOST_HIT, TierTables
from twinserve.core.sched.scheduler import Scheduler
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import Arrival, drive, make_request, reference_output

BS = 4
# (kv_groups, sliding_window): full + window (Gemma 3), two fulls + a window, one all-layer window
# (Mistral), two windows and no full group, full + a window wider than a block.
LAYOUTS = [((0, 3), 0), ((0, 0, 5), 0), ((), 8), ((5, 9), 0), ((0, 6), 0)]


def _sessions(num_sessions: int, turns: int, prompt_len: int, gap: int, max_tokens: int = 3) -> list[Arrival]:
    """Each session's turns re-send its growing context; the others' turns in between flush the pool."""
    arrivals = []
    for s in range(num_sessions):
        context = [100 + 37 * s + i for i in range(prompt_len)]
        for t in range(turns):
            arrivals.append(Arrival(t * gap + s * 3, make_request(f"s{s}t{t}", list(context), max_tokens)))
            context += [7 + s, 8 + t, 9]
    return arrivals


def _cfg(layout, tier: int, num_blocks: int | None = None, **kw) -> SchedulerConfig:
    groups, window = layout
    return SchedulerConfig(block_size=BS, num_blocks=num_blocks or 12 * max(1, len(groups)),
                           max_num_batched_tokens=kw.pop("budget", 16), max_model_len=128, kv_groups=groups,
                           sliding_window=window, kv_offloading_blocks=tier, **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("delay", [0, 2])
def test_groups_reload_from_the_host_and_generate_the_same_tokens_as_without_a_tier(layout, delay):
    arrivals = _sessions(3, 3, 28, 40)
    core, log = drive(_cfg(layout, 64), arrivals, load_delay=delay)  # raises on a stale or foreign read
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, 128)
    kv = core.scheduler.kv
    stats = kv.host.stats
    assert stats.blocks_loaded > 0 and stats.hits > 0 and stats.blocks_stored > 0
    assert core.executor.num_blocks_loaded == stats.blocks_loaded
    assert not kv.load_jobs and not kv.host.pins and kv.num_free_blocks == kv.num_blocks
    bare = _sessions(3, 3, 28, 40)
    _, log0 = drive(_cfg(layout, 0), bare)
    assert log0.outputs == log.outputs
    # the tier serves later turns more of their prefix than the device alone
    assert (sum(a.request.prefix_hit_tokens for a in arrivals)
            > sum(a.request.prefix_hit_tokens for a in bare))


def test_a_window_group_loads_only_its_window_of_the_hit():
    # Full + a 3-token window: a 28-token hit (7 blocks) reads all 7 full-group blocks but only the
    # window group's last one ((28 - 3 + 1) // 4 = 6 blocks behind the window).
    kv = KVCacheManager(40, BS, kv_groups=(0, 3), host_tier=HostTier(64))
    a = make_request("a", list(range(100, 129)), 1)
    assert kv.allocate_slots(a, a.num_tokens) is not None
    kv.free(a)
    kv.pool.get_new_blocks(kv.num_free_blocks)  # evict everything: both groups' blocks go to the host
    stores, _ = kv.take_transfers()
    assert len(stores) == 14  # 7 full blocks per group
    kv.pool.free_blocks(list(kv.pool.blocks))
    b = make_request("b", list(range(100, 129)) + [5], 1)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 28
    assert [g for g, _, _ in hits.host] == [0] * 7 + [1]
    assert hits.groups[1][:6] == [OUT_OF_WINDOW] * 6 and hits.groups[1][6] is HOST_HIT
    assert kv.allocate_slots(b, 2, hits, num_hit, num_draft_tokens=2) is not None
    _, loads = kv.take_transfers()
    (pairs,) = loads.values()
    assert len(pairs) == 8 and len(kv.host.pins) == 8


def test_a_hit_counts_only_where_every_group_has_its_blocks():
    # The window group's copy of the hit's last block is gone from device and host: no hit there.
    kv = KVCacheManager(40, BS, kv_groups=(0, 3), host_tier=HostTier(64))
    a = make_request("a", list(range(100, 117)), 1)
    kv.allocate_slots(a, a.num_tokens)
    kv.free(a)
    kv.pool.get_new_blocks(kv.num_free_blocks)
    kv.take_transfers()
    kv.pool.free_blocks(list(kv.pool.blocks))
    last1 = kv.hash_fn(a.block_hashes[3].value, (), ("kv_group", 1))
    kv.host.free_slots.append(kv.host._drop(last1))
    b = make_request("b", list(range(100, 117)) + [5], 1)
    hits, num_hit = kv.get_computed_blocks(b)
    # block 3's window part is missing: the hit stops at 3 blocks, whose window needs block 2 only
    assert num_hit == 12
    assert [(g, i) for g, i, _ in hits.host] == [(0, 0), (0, 1), (0, 2), (1, 2)]
    assert hits.groups[1][2] is HOST_HIT


@settings(max_examples=25, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), num_sessions=st.integers(2, 4), turns=st.integers(2, 3),
       prompt_len=st.integers(9, 30), gap=st.integers(1, 40), delay=st.integers(0, 3),
       tier=st.sampled_from([1, 4, 64]), policy=st.sampled_from(["lru", "lrfu"]), budget=st.sampled_from([6, 16]),
       spec_k=st.sampled_from([0, 0, 2]), aborts=st.lists(st.integers(0, 60), max_size=3))
def test_no_stale_read_with_groups_under_preemption_drafts_and_aborts(layout, num_sessions, turns, prompt_len,
                                                                      gap, delay, tier, policy, budget, spec_k,
                                                                      aborts):
    # A small pool forces preemption; aborts land at random steps (mid-load among them).
    arrivals = _sessions(num_sessions, turns, prompt_len, gap, max_tokens=5)
    ids = [a.request.request_id for a in arrivals]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_k) if spec_k else None
    cfg = _cfg(layout, tier, num_blocks=10 * max(1, len(layout[0])), budget=budget,
               kv_offloading_policy=policy, long_prefill_token_threshold=6)
    abort_at = {step: [ids[(step * 7) % len(ids)]] for step in aborts}
    core, log = drive(cfg, arrivals, aborts=abort_at, spec=spec, load_delay=delay)  # raises on a stale read
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        r = a.request
        if r.finish_reason is not None and r.finish_reason.value != "abort":
            assert log.outputs[r.request_id] == reference_output(ref, r, 128)
    kv = core.scheduler.kv
    assert not kv.load_jobs and not core.scheduler.loading and not kv.host.pins
    assert kv.num_free_blocks == kv.num_blocks


def _plant(monkeypatch, change) -> None:
    """Rewrite every group load job's (host slot, device block) pairs as change(pairs, hits) says."""
    original = TierTables._allocate_group_loads

    def planted(self, request, hits):
        tables = original(self, request, hits)
        job = self.load_jobs[self.req_load_job[request.request_id]]
        job.pairs[:] = change(job.pairs, hits)
        return tables

    monkeypatch.setattr(TierTables, "_allocate_group_loads", planted)


def test_a_window_block_never_loaded_is_a_stale_read(monkeypatch):
    # Planted bug: the window group's blocks are left out of the job; the request reads them anyway.
    _plant(monkeypatch, lambda pairs, hits: [p for p, (g, _, _) in zip(pairs, hits.host) if g == 0])
    with pytest.raises(ContractViolation, match="group 1"):
        drive(_cfg(((0, 3), 0), 64), _sessions(3, 3, 28, 40), load_delay=1)


def test_loading_another_groups_block_is_caught(monkeypatch):
    # Planted bug: the window group's block is filled from the full group's host slot of that position.
    def swap(pairs, hits):
        slot_of = {(g, i): p[0] for p, (g, i, _) in zip(pairs, hits.host)}
        return [((slot_of.get((0, i), p[0]) if g else p[0]), p[1]) for p, (g, i, _) in zip(pairs, hits.host)]

    _plant(monkeypatch, swap)
    with pytest.raises(ContractViolation, match="group"):
        drive(_cfg(((0, 3), 0), 64), _sessions(3, 3, 28, 40), load_delay=0)


def test_a_window_request_computing_before_its_load_lands_reads_stale_kv(monkeypatch):
    # Planted bug: admitted as soon as its loads are issued (loads land a step later).
    def eager(self, req, *args):
        ok = original(self, req, *args)
        if ok:
            self.loaded.append(self.loading.pop(req.request_id))
        return ok

    original = Scheduler._admit_loading
    monkeypatch.setattr(Scheduler, "_admit_loading", eager)
    with pytest.raises(ContractViolation, match="holds"):
        drive(_cfg(((0, 3), 0), 64), _sessions(3, 3, 28, 40), load_delay=1)


def _stores_hold_their_keys_kv(core, so, waiting_before) -> None:
    """Every block stored this step holds the KV its host key names: verified tokens only, its own group."""
    ex = core.executor
    by_slot = {slot: key for slot, key in core.scheduler.kv.host.entries.values()}
    for block_id, slot in so.kv_stores:
        key = by_slot[slot]
        group = 0
        if key.extra_keys and key.extra_keys[0] == "kv_group":
            group, key = key.extra_keys[1], key.parent
        chain = []
        while key is not None:
            chain.append(key.token_ids)
            key = key.parent
        ids = ex.kv.prefix_ids([t for block in reversed(chain) for t in block], [])[-BS:]
        want = ids if not group else [(group, p) for p in ids]
        assert ex.kv.slots.get(block_id) == want, f"stored block {block_id} holds KV its key does not name"


@pytest.mark.parametrize("layout", [((), 0), ((0, 3), 0)])
def test_drafts_are_never_stored_unverified(layout):
    # Drafts miss often (draft_miss=2) and sessions overflow the pool: blocks holding rejected drafts are
    # written and dropped; every block the tier stores holds verified tokens' KV.
    arrivals = _sessions(3, 3, 22, 30, max_tokens=12)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    core, log = drive(_cfg(layout, 64, num_blocks=14 * max(1, len(layout[0]))), arrivals, spec=spec, draft_miss=2,
                      check=_stores_hold_their_keys_kv)
    stats = core.scheduler.kv.host.stats
    assert stats.blocks_stored > 0 and stats.blocks_loaded > 0
    assert core.scheduler.spec_stats.num_draft_tokens > core.scheduler.spec_stats.num_accepted_tokens > 0
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, 128)


def test_registering_drafts_before_verification_stores_unverified_kv(monkeypatch):
    # Planted bug: drafted blocks are keyed when allocated, before verification (rejected drafts' KV
    # then sits under a key and is stored to the host when evicted).
    original = KVCacheManager.allocate_slots

    def eager(self, request, num_new_tokens, *args, num_draft_tokens=0, **kw):
        keep = num_draft_tokens if self.is_loading(request.request_id) or request.num_computed_tokens == 0 else 0
        return original(self, request, num_new_tokens, *args, num_draft_tokens=keep, **kw)

    monkeypatch.setattr(KVCacheManager, "allocate_slots", eager)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    with pytest.raises(AssertionError, match="holds KV its key does not name"):
        drive(_cfg(((), 0), 64, num_blocks=14), _sessions(3, 3, 22, 30, max_tokens=12), spec=spec,
              draft_miss=2, check=_stores_hold_their_keys_kv)


def _group_colliding_hash(parent, tokens, extra):
    """Group 0's keys stay apart; another group's key keeps its group but folds group 0's value into 7
    classes, so a group's device blocks and host entries of different prefixes collide often."""
    if extra and extra[0] == "kv_group":
        return (parent or 0) % 7 + 1000 * (extra[1] + 1)
    return xxhash64(parent, tokens, extra)


@pytest.mark.parametrize("layout", [((0, 3), 0), ((0, 0, 5), 0), ((0, 6), 0)])
def test_a_host_entry_of_another_prefix_under_a_colliding_group_key_is_never_loaded(layout):
    """Issue 53 item 14: only the parent check tells a group's host entries of two prefixes apart
    (a planted check of the extra keys alone loads another prefix's KV: the executor raises)."""
    arrivals = _sessions(3, 3, 28, 40)
    core, log = drive(_cfg(layout, 64, prefix_caching_hash_algo=_group_colliding_hash), arrivals)
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, 128)
    assert core.scheduler.kv.host.stats.hits > 0
