"""A decode replica discounts a joining request's transferred prefill (sim/disagg.DecodeExecutor):
looking only at requests that may still be in their transferred tokens gives every step's
discount of the full scan over the batch, bit for bit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.cluster_study import simulate_cluster
from twinserve.sim.disagg import DecodeExecutor, _Discounted

from .helpers import small_config


def _full_scan(ex: DecodeExecutor, so) -> tuple[int, int, int, float]:
    """The discount over every scheduled request, new ones first (the reference)."""
    tr = ex.transferred
    num = so.num_scheduled_tokens
    a = b = c = 0
    d = 0.0
    pairs = [(n.req_id, n.num_computed_tokens) for n in so.scheduled_new_reqs]
    cached = so.scheduled_cached_reqs
    pairs += list(zip(cached.req_ids, cached.num_computed_tokens))
    for rid, done in pairs:
        t = tr.get(rid, 0)
        q = num.get(rid, 0)
        if done >= t or q == 0:
            continue
        qt = min(done + q, t) - done
        a += qt
        c += done
        d += qt * (done + qt * 0.5)
        if qt == q:
            b += 1
    return a, b, c, d


def _run_checked(cfg) -> dict[str, int]:
    """Simulate cfg, asserting each decode step's discount equals the full scan's; counts what ran."""
    seen: list[tuple] = []
    counts = {"steps": 0, "chunked": 0, "preempted": 0}
    execute = DecodeExecutor.execute
    step_time = _Discounted.step_time

    def checked(self, so, decodes=None):
        # decodes: a join step's decode half (sim.cluster._join_step), plain decodes outside so: past
        # their transferred tokens, so the full scan over so is still the reference.
        want = _full_scan(self, so)
        cached = so.scheduled_cached_reqs
        if any(done < self.transferred.get(r, 0) for r, done in zip(cached.req_ids, cached.num_computed_tokens)):
            counts["chunked"] += 1  # a running request still in its transferred tokens
        counts["preempted"] += len(so.preempted_req_ids)
        seen.clear()
        out = execute(self, so, decodes)
        assert seen and seen[0] == want
        counts["steps"] += 1
        return out

    def record(self, *features):
        seen.append(self.minus)
        return step_time(self, *features)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodeExecutor, "execute", checked)
        mp.setattr(_Discounted, "step_time", record)
        simulate_cluster(cfg)
    return counts


def _config(budget: int, blocks: int, seed: int, concurrency: int):
    return small_config(concurrency=concurrency, num_requests=4 * concurrency, warmup_requests=0, num_replicas=3,
                        num_prefill_replicas=1, seed=seed, max_model_len=1024, max_num_batched_tokens=budget,
                        num_gpu_blocks=blocks, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                        output_dist="uniform", output_min=2, output_max=60)


@settings(max_examples=25, deadline=None)
@given(budget=st.sampled_from([32, 64, 256]), blocks=st.sampled_from([40, 80, 2000]), seed=st.integers(0, 5),
       concurrency=st.integers(2, 12))
def test_each_decode_step_discounts_what_the_full_scan_does(budget, blocks, seed, concurrency):
    # Small budgets chunk a joiner's transferred prompt over several steps (it runs as a cached
    # request then); small pools preempt decode requests, which recompute their prompt from scratch.
    assert _run_checked(_config(budget, blocks, seed, concurrency))["steps"] > 0


def test_chunked_joins_and_preempted_decodes_are_discounted_as_by_the_full_scan():
    counts = _run_checked(_config(32, 40, 1, 12))
    assert counts["chunked"] > 0 and counts["preempted"] > 0  # both rare paths ran
