"""The host tier through the engine core, with the KV-checking executor: multi-turn sessions that
overflow a small device pool reload their prefixes from the host, and no request ever reads a slot
that does not hold its own prefix (loads landing late, preemption, drafts, KV groups)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import SchedulerConfig
from twinserve.core.errors import InvalidConfigError
from twinserve.core.fake_executor import ContractViolation, FakeExecutor
from twinserve.core.kv.hashing import xxhash64
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.sched.scheduler import Scheduler
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import Arrival, drive, make_request, reference_output

BS = 4


def _sessions(num_sessions: int, turns: int, prompt_len: int, gap: int, max_tokens: int = 3) -> list[Arrival]:
    """Each session's turns re-send its growing context; the others' turns in between flush the pool."""
    arrivals = []
    for s in range(num_sessions):
        context = [100 + 37 * s + i for i in range(prompt_len)]
        for t in range(turns):
            arrivals.append(Arrival(t * gap + s * 3, make_request(f"s{s}t{t}", list(context), max_tokens)))
            context += [7 + s, 8 + t, 9]
    return arrivals


def _run(tier: int, arrivals: list[Arrival], delay: int = 0, num_blocks: int = 16, **kw):
    cfg = SchedulerConfig(block_size=BS, num_blocks=num_blocks, max_num_batched_tokens=kw.pop("budget", 16),
                          max_model_len=128, kv_offloading_blocks=tier, **kw)
    return drive(cfg, arrivals, load_delay=delay)


def _check_outputs(log, arrivals) -> None:
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, 128), a.request.request_id


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_sessions_reload_their_prefix_from_the_host_and_generate_the_same_tokens(delay):
    # 3 sessions of 28-token prompts (7 blocks each) over a 16-block pool: a session's next turn
    # finds its prefix evicted from the device; with the tier it is loaded, not recomputed.
    arrivals = _sessions(3, 3, 28, 40)
    core, log = _run(64, arrivals, delay)
    _check_outputs(log, arrivals)
    stats = core.scheduler.kv.host.stats
    later = [a.request for a in arrivals if not a.request.request_id.endswith("t0")]
    assert all(r.prefix_hit_tokens >= 24 for r in later)
    assert stats.blocks_loaded > 0 and stats.hits > 0 and stats.blocks_stored > 0
    assert core.executor.num_blocks_loaded == stats.blocks_loaded
    assert not core.scheduler.kv.load_jobs and not core.scheduler.loading
    # without the tier the same turns find nothing on the device
    bare = _sessions(3, 3, 28, 40)
    core0, log0 = _run(0, bare)
    assert all(a.request.prefix_hit_tokens == 0 for a in bare)
    assert log0.outputs == log.outputs


def test_a_request_computing_before_its_load_lands_reads_stale_kv(monkeypatch):
    # The planted bug: the scheduler lets a request run as soon as its loads are issued. With loads
    # landing a step later, its first step reads device blocks that still hold another prefix's KV.
    def eager(self, req, *args):
        ok = original(self, req, *args)
        if ok:  # back in the queue at once, not when the executor reports the load
            self.loaded.append(self.loading.pop(req.request_id))
        return ok

    original = Scheduler._admit_loading
    monkeypatch.setattr(Scheduler, "_admit_loading", eager)
    with pytest.raises(ContractViolation, match="holds"):
        _run(64, _sessions(3, 3, 28, 40), delay=1)


@settings(max_examples=25, deadline=None)
@given(num_sessions=st.integers(2, 4), turns=st.integers(2, 3), prompt_len=st.integers(9, 30),
       gap=st.integers(1, 40), delay=st.integers(0, 3), tier=st.sampled_from([1, 4, 64]),
       policy=st.sampled_from(["lru", "lrfu"]), budget=st.sampled_from([6, 16]),
       spec_k=st.sampled_from([0, 0, 2]), aborts=st.lists(st.integers(0, 60), max_size=3))
def test_no_stale_read_under_preemption_drafts_and_aborts(num_sessions, turns, prompt_len, gap, delay, tier,
                                                          policy, budget, spec_k, aborts):
    # A 12-block pool forces preemption; aborts land at random steps (mid-load among them).
    arrivals = _sessions(num_sessions, turns, prompt_len, gap, max_tokens=5)
    ids = [a.request.request_id for a in arrivals]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_k) if spec_k else None
    cfg = SchedulerConfig(block_size=BS, num_blocks=12, max_num_batched_tokens=budget, max_model_len=128,
                          kv_offloading_blocks=tier, kv_offloading_policy=policy, long_prefill_token_threshold=6)
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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_host_tier_of_no_whole_block_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidConfigError, match="kv_offloading_blocks"):
        HostTier(bad)


def test_an_unknown_host_policy_is_refused_naming_the_field():
    with pytest.raises(InvalidConfigError, match="kv_offloading_policy"):
        SchedulerConfig(kv_offloading_blocks=4, kv_offloading_policy="fifo")
    with pytest.raises(InvalidConfigError, match="kv_offloading_blocks"):
        SchedulerConfig(kv_offloading_blocks=-3)


def _parent_blind_hash(parent, tokens, extra):
    """A block's key value from its own tokens alone: equal blocks behind different prefixes collide."""
    return xxhash64(None, tokens, extra)


def test_a_host_entry_behind_another_prefix_is_never_loaded():
    """Issue 53 item 14: P = A C and Q = B C share block C's tokens and (here) its key value; Q's hit
    continues from its own block B, so only the parent check keeps it off P's C in the tier."""
    a, b, c = [11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]
    flush = [Arrival(6 + 3 * i, make_request(f"f{i}", [200 + 13 * i + j for j in range(40)], 2)) for i in range(3)]
    arrivals = [Arrival(0, make_request("p", a + c + [5], 2)), Arrival(3, make_request("q1", b + [6], 2)), *flush,
                Arrival(40, make_request("q2", b + c + [7], 2))]
    core, log = _run(64, arrivals, prefix_caching_hash_algo=_parent_blind_hash)
    _check_outputs(log, arrivals)
    stats = core.scheduler.kv.host.stats
    assert stats.hits > 0  # q2's own block B came back from the tier
    assert arrivals[-1].request.prefix_hit_tokens == len(b)  # and nothing past it
