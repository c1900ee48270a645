"""Drafts are verified once: a step whose executor proposes nothing (the real runner's answer at
disable_by_batch_size) leaves no drafts behind for the next step to verify again."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import EngineCore, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.sched.output import SchedulerOutput
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import make_request, reference_output


class SilentSteps:
    """A fake executor that proposes nothing (spec_token_ids None) on the steps `silent` names; it counts
    drafts scheduled that are not a prefix of a proposal made since the request's last sample."""

    def __init__(self, inner: FakeExecutor, silent: list[bool]) -> None:
        self.inner, self.silent = inner, silent
        self.fresh: dict[str, list[int] | None] = {}
        self.stale = self.verified = 0

    def execute(self, so: SchedulerOutput):
        """Run the step; check its drafts came from a proposal not yet used."""
        for rid, drafts in (so.scheduled_spec_decode_tokens or {}).items():
            self.verified += 1
            fresh = self.fresh.get(rid)
            if fresh is None or list(drafts) != fresh[:len(drafts)]:
                self.stale += 1
            self.fresh[rid] = None  # a proposal is verified once
        out = self.inner.execute(so)
        silent = self.silent[(self.inner.num_steps - 1) % len(self.silent)]
        for rid in out.sampled_token_ids:
            self.fresh[rid] = None if silent else list((out.spec_token_ids or {}).get(rid, []))
        if silent:
            out.spec_token_ids = None
        return out

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@settings(max_examples=60, deadline=None)
@given(silent=st.lists(st.booleans(), min_size=1, max_size=6), k=st.integers(1, 5),
       n=st.integers(1, 4), miss=st.sampled_from([2, 3, 10_000]))
def test_no_draft_is_verified_twice_after_a_step_that_proposed_nothing(silent, k, n, miss) -> None:
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=256, block_size=4, num_blocks=256)
    ex = SilentSteps(FakeExecutor(block_size=4, model_kv=True, num_speculative_tokens=k, draft_miss=miss), silent)
    core = EngineCore(cfg, ex, speculative_config=SpeculativeConfig(num_speculative_tokens=k))
    reqs = [make_request(f"r{i}", [i + 1, 5, 9], 30) for i in range(n)]
    for r in reqs:
        core.add_request(r)
    for step in range(400):
        if not core.has_unfinished_requests():
            break
        core.step(float(step))
    assert not core.has_unfinished_requests()
    for r in reqs:
        assert r.output_token_ids == reference_output(FakeExecutor(block_size=4), r, 256)
    assert ex.stale == 0, f"{ex.stale} of {ex.verified} draft steps verified stale drafts"
    # The acceptance counters saw every verification the executor ran, and only those.
    assert core.scheduler.spec_stats.num_drafts == ex.verified


class GatedByBatchSize(SilentSteps):
    """As the real runner (backends/real/model_runner.py): no proposals (None) while the batch it holds is
    at or over disable_by_batch_size; it counts the fresh draft tokens (proposed since the request's last sample)
    it verified, and those accepted."""

    def __init__(self, inner: FakeExecutor, spec: SpeculativeConfig) -> None:
        super().__init__(inner, [False])
        self.spec = spec
        self.draft_tokens = self.accepted_tokens = 0

    def execute(self, so: SchedulerOutput):
        """Run the step; propose only while the batch is under the threshold."""
        drafts = dict(so.scheduled_spec_decode_tokens or {})
        stale = set()
        for rid, d in drafts.items():
            self.verified += 1
            fresh = self.fresh.get(rid)
            if fresh is None or list(d) != fresh[:len(d)]:
                self.stale += 1
                stale.add(rid)
            else:
                self.draft_tokens += len(d)
            self.fresh[rid] = None
        out = self.inner.execute(so)
        for rid in drafts:
            if rid not in stale:
                self.accepted_tokens += len(out.sampled_token_ids[rid]) - 1
        silent = not self.spec.active(len(self.inner.state))
        for rid in out.sampled_token_ids:
            self.fresh[rid] = None if silent else list((out.spec_token_ids or {}).get(rid, []))
        if silent:
            out.spec_token_ids = None
        return out


@settings(max_examples=40, deadline=None)
@given(arrivals=st.lists(st.integers(0, 40), min_size=2, max_size=7), lens=st.data(),
       k=st.integers(1, 5), d=st.integers(2, 4), miss=st.sampled_from([2, 3, 10_000]),
       policy=st.sampled_from(["mixed", "prefill_first"]))
def test_drafts_counted_are_the_drafts_proposed_across_disable_by_batch_size(arrivals, lens, k, d, miss,
                                                                             policy) -> None:
    """Issue 53 item 9: the batch grows past disable_by_batch_size (the runner proposes nothing) and shrinks
    under it again; every draft verified is one proposed since the request's last sample, and the counters
    (per step, per request, totals) hold exactly what the proposer proposed and the verifier accepted."""
    spec = SpeculativeConfig(num_speculative_tokens=k, disable_by_batch_size=d)
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=256, block_size=4, num_blocks=256,
                          batch_policy=policy)
    ex = GatedByBatchSize(FakeExecutor(block_size=4, model_kv=True, num_speculative_tokens=k, draft_miss=miss),
                          spec)
    core = EngineCore(cfg, ex, speculative_config=spec)
    reqs = [make_request(f"r{i}", [i + 1, 5, 9], lens.draw(st.integers(4, 40))) for i in range(len(arrivals))]
    pending = sorted(zip(arrivals, reqs), key=lambda a: a[0])
    step_drafts = step_accepted = 0
    for step in range(2000):
        while pending and pending[0][0] <= step:
            core.add_request(pending.pop(0)[1])
        if not pending and not core.has_unfinished_requests():
            break
        _, stats = core.step(float(step))
        if stats is not None:
            step_drafts += stats.num_draft_tokens
            step_accepted += stats.num_accepted_tokens
    assert not core.has_unfinished_requests()
    for r in reqs:
        assert r.output_token_ids == reference_output(FakeExecutor(block_size=4), r, 256)
    assert ex.stale == 0, f"{ex.stale} of {ex.verified} draft steps verified stale drafts"
    st_ = core.scheduler.spec_stats
    assert (st_.num_drafts, st_.num_draft_tokens, st_.num_accepted_tokens) == (
        ex.verified, ex.draft_tokens, ex.accepted_tokens)
    assert (step_drafts, step_accepted) == (ex.draft_tokens, ex.accepted_tokens)
    assert sum(r.num_draft_tokens for r in reqs) == ex.draft_tokens
    assert sum(r.num_accepted_tokens for r in reqs) == ex.accepted_tokens


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_batch_that_crosses_disable_by_batch_size_verifies_no_draft_twice(policy: str) -> None:
    """Issue 53 item 9, one fixed run: r0 drafts alone, r1 and r2 join (3 >= 2: nothing proposed), leave, and
    r0 drafts again from fresh proposals only. Under prefill_first r0 holds drafts through the prefill-only
    step and then decodes with speculation off: those drafts are for tokens it has since sampled."""
    spec = SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=2)
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=256, block_size=4, num_blocks=256,
                          batch_policy=policy)
    ex = GatedByBatchSize(FakeExecutor(block_size=4, model_kv=True, num_speculative_tokens=3, draft_miss=10_000),
                          spec)
    core = EngineCore(cfg, ex, speculative_config=spec)
    r0 = make_request("r0", [1, 5, 9], 60)
    core.add_request(r0)
    for step in range(3):
        core.step(float(step))
    assert ex.verified > 0  # r0 alone drafted
    for i in (1, 2):
        core.add_request(make_request(f"r{i}", [i + 1, 5, 9], 6))
    for step in range(3, 200):
        if not core.has_unfinished_requests():
            break
        core.step(float(step))
    assert r0.output_token_ids == reference_output(FakeExecutor(block_size=4), r0, 256)
    assert ex.stale == 0, f"{ex.stale} of {ex.verified} draft steps verified stale drafts"
    assert core.scheduler.spec_stats.num_draft_tokens == ex.draft_tokens
