"""Drafts are verified once: a step whose executor proposes nothing (the real runner's answer at
disable_by_batch_size) leaves no drafts behind for the next step to verify again."""

from __future__ import annotations

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
