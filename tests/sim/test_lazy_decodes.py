"""Lazy decodes (core.sched.lazy_decodes, used by sim.cluster when no token times are kept): a
replica's plain decodes held as counts, windows and join steps applied to the counts and to the few
requests that change. Everything a run reports must be the passes' (lazy off): records, step logs,
executor totals and last features, the time-weighted sums, the KV pool's free-queue order, every
request's known length when it ends, on every replica; and plain stepping's (fast-forward off)
records and known lengths."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim.executor import SimExecutor
from twinserve.sim.cluster_study import build_cluster

from .helpers import record_answers, small_config


def _run(cfg, lazy: bool, ff: bool = True, count: bool = False) -> tuple:
    """count: LazyDecodes' count_blocks (the block ids differ, so only counted runs compare with it on)."""
    built = build_cluster(cfg, keep_steps=True)
    sim = built.simulation
    sim.lazy_decodes = lazy
    sim.count_blocks = count
    sim.fast_forward = ff
    sim.keep_token_times = False
    ended: list[tuple] = []  # (replica kind, request, its known lengths, its tokens) as each ends
    real = SimExecutor.forget

    def spy(self, rid):
        s = self.state.get(rid)
        ended.append((type(self).__name__, rid, None if s is None else tuple(s)))
        real(self, rid)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SimExecutor, "forget", spy)
        res = sim.run()
    per = []
    used = 0
    for rep, rr in zip(sim.replicas, res.replicas):
        kv = rep.core.scheduler.kv
        if rep.lazy is not None:
            used += rep.lazy.num_entered
            assert not rep.lazy.active  # flushed at the end
            assert rep.lazy.owed_total == 0 and not kv.uncounted  # every count taken or given back
        per.append((tuple(dataclasses.astuple(r) for r in rr.records), dataclasses.astuple(rr.steps),
                    rr.num_steps, rr.num_preemptions, rr.end_time,
                    rep.busy_time, rep.area_in_system, rep.area_kv, rep.area_batch, rep.area_waiting,
                    dataclasses.astuple(rep.executor.totals), rep.executor.last_features,
                    [b.block_id for b in kv.pool.free_queue], kv.stats.queries, kv.stats.hits,
                    {rid: list(b.block_id for b in blocks) for rid, blocks in kv.req_to_blocks.items()}))
    return (tuple(dataclasses.astuple(r) for r in res.total.records), per, sorted(ended)), used, res


def _counts(out: tuple) -> tuple:
    """A _run's figures with the block ids left out: the free queue's length and each table's instead."""
    records, per, ended = out
    per = [p[:-4] + (len(p[-4]), p[-3], p[-2], {rid: len(ids) for rid, ids in p[-1].items()}) for p in per]
    return records, per, ended


def _fields(n, count, replicas, disagg, seed, blocks, budget, turns=1, out_max=60, policy="mixed"):
    fields = dict(batch_policy=policy, concurrency=n, num_requests=count, warmup_requests=0, num_replicas=replicas,
                  num_prefill_replicas=1 if disagg and replicas > 1 else 0, seed=seed, turns=turns,
                  followup_tokens=8, max_model_len=1024, max_num_batched_tokens=budget,
                  enable_prefix_caching=False, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                  output_dist="uniform", output_min=2, output_max=out_max)
    if blocks:
        fields["num_gpu_blocks"] = blocks  # a small pool: full pools, preemptions, waits
    if policy == "prefill_first":
        fields["max_prefill_tokens"] = budget // 2  # joiners past the first capped (SGLang's)
    return small_config(**fields)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), blocks=st.sampled_from([0, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), turns=st.sampled_from([1, 1, 2]),
       out_max=st.sampled_from([60, 400]), policy=st.sampled_from(["mixed", "prefill_first"]))
def test_lazy_decodes_give_every_figure_the_passes_and_stepping_give(n, count, replicas, disagg, seed, blocks,
                                                                    budget, turns, out_max, policy) -> None:
    cfg = _fields(n, count, replicas, disagg, seed, blocks, budget, turns, out_max, policy)
    passes, none, _ = _run(cfg, False)
    lazy, used, _ = _run(cfg, True)
    stepped, _, _ = _run(cfg, False, ff=False)
    counted, _, _ = _run(cfg, True, count=True)
    assert none == 0
    assert lazy == passes
    assert _counts(counted) == _counts(passes)  # blocks as counts: every figure but the ids
    # Stepping: the same records and known lengths (windows sum busy time in another order and hand
    # a request a window's blocks at once, so the float sums and the free queue's order are theirs).
    assert (lazy[0], lazy[2]) == (stepped[0], stepped[2])


def test_a_closed_loop_cluster_run_holds_its_decodes_as_counts() -> None:
    # 32 clients, long outputs (windows that cross block boundaries, several blocks per window), 2
    # decode replicas: requests join running batches and end one at a time.
    cfg = _fields(32, 160, 3, True, 1, 0, 2048, out_max=600)
    passes, _, _ = _run(cfg, False)
    lazy, used, res = _run(cfg, True)
    assert used >= 2  # each decode replica took its batch over at least once
    assert res.total.num_ff_windows > 50
    assert lazy == passes


def test_prefill_first_replicas_prefill_joiners_beside_the_counted_decodes() -> None:
    # SGLang's lock step: a joiner's prefill runs alone while the batch held as counts waits, and a
    # step with nobody to admit decodes the batch; both without touching the decodes.
    cfg = _fields(32, 160, 3, True, 2, 0, 2048, out_max=300, policy="prefill_first")
    passes, _, _ = _run(cfg, False)
    built = build_cluster(cfg, keep_steps=True)
    sim = built.simulation
    sim.keep_token_times = False
    prefill_only = []
    real = sim._prefill_only_step

    def spy(rep, t, lazy):
        out = real(rep, t, lazy)
        prefill_only.append(out is not None)
        return out

    sim._prefill_only_step = spy
    sim.run()
    assert sum(prefill_only) > 20
    assert [r for r in sim.replicas if r.lazy is not None and r.lazy.num_entered]
    lazy, _, _ = _run(cfg, True)
    assert lazy == passes


def test_a_chunked_joiner_and_a_full_pool_give_the_batch_back() -> None:
    # Budget 64 against prompts up to 300 (a joiner still in its chunk) and a 60-block pool (no room
    # for a step's blocks and the tail's chunks, preemptions): the batch is flushed to core.step and
    # taken over again.
    cfg = _fields(16, 200, 2, False, 3, 60, 64)
    passes, _, _ = _run(cfg, False)
    built = build_cluster(cfg, keep_steps=True)
    sim = built.simulation
    sim.keep_token_times = False
    sim.run()
    flushed = sum(rep.lazy.num_flushed for rep in sim.replicas if rep.lazy is not None)
    entered = sum(rep.lazy.num_entered for rep in sim.replicas if rep.lazy is not None)
    assert entered > 3 and flushed >= entered
    lazy, _, _ = _run(cfg, True)
    assert lazy == passes


@settings(max_examples=12, deadline=None)
@given(n=st.integers(4, 24), seed=st.integers(0, 5), disagg=st.booleans(), budget=st.sampled_from([48, 64, 128]),
       blocks=st.sampled_from([0, 0, 120]))
def test_a_joiner_still_in_its_chunk_stays_in_the_batch_held(n, seed, disagg, budget, blocks) -> None:
    # Budgets of 48-128 tokens against prompts up to 300 (and, disaggregated, transferred prompts):
    # a joiner takes several steps' chunks after the counted decodes. It stays running after them (the
    # held batch's tail) and the join steps schedule it request by request (sim.cluster._tail_plan:
    # schedule_batch's two loops, chunks to the budget left, blocks after the decodes'), instead of the
    # batch going back to core.step: every figure the passes' (core.step there).
    import twinserve.sim.cluster as C

    cfg = _fields(n, 60, 3 if disagg else 2, disagg, seed, blocks, budget, out_max=200)
    passes, _, _ = _run(cfg, False)
    plans = []
    real = C._tail_plan

    def spy(sched, k):
        plan = real(sched, k)
        plans.append(plan)
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "_tail_plan", spy)
        lazy, used, res = _run(cfg, True)
    assert lazy == passes
    assert used and len([p for p in plans if p]) > 5


def test_tail_plans_cover_chunks_and_a_decode_within_its_blocks() -> None:
    # The tail's shapes the test above must meet: a chunk short of the prompt, its last chunk, a
    # request with one token left within its blocks (no allocate_slots call).
    # And with room for every step the batch is taken over once and given back once, at the end (it
    # was given back for each chunked joiner: 18-31 times a replica on these runs).
    import twinserve.sim.cluster as C

    seen = {"partial": 0, "last chunk": 0, "within": 0}
    real = C._tail_plan

    def spy(sched, k):
        plan = real(sched, k)
        for req, q, _, alloc in plan or ():
            left = len(req.all_token_ids) - req.num_computed_tokens
            seen["partial"] += q > 1 and q < left
            seen["last chunk"] += q > 1 and q == left
            seen["within"] += not alloc
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "_tail_plan", spy)
        for seed in range(3):
            _run(_fields(24, 80, 2, False, seed, 0, 48, out_max=200), True)
    assert all(seen.values()), seen
    for disagg in (False, True):
        sim = build_cluster(_fields(24, 80, 3 if disagg else 2, disagg, 0, 0, 48, out_max=200),
                            keep_steps=True).simulation
        sim.keep_token_times = False
        sim.run()
        lazies = [rep.lazy for rep in sim.replicas if rep.lazy is not None and rep.lazy.num_entered]
        assert len(lazies) == 2 and all(lz.num_entered == lz.num_flushed == 1 for lz in lazies)


def test_token_times_kept_means_no_lazy_decodes() -> None:
    cfg = _fields(8, 20, 2, True, 0, 0, 2048)
    sim = build_cluster(cfg, keep_steps=True).simulation
    sim.run()  # keep_token_times defaults to True: the passes (they extend each request's times)
    assert all(rep.lazy is None for rep in sim.replicas)


@pytest.mark.parametrize("seed", [0, 3])
def test_blocks_held_as_counts_leave_guaranteed_no_evict_admissions_as_they_were(monkeypatch, seed) -> None:
    # TensorRT-LLM's admission in a pool small enough to hold joiners back: it sums the running requests'
    # owed blocks (peaks less the blocks held), which must count the blocks a counted request holds as a
    # count (LazyDecodes._owed_sum) and those of a request that ended but is not freed yet.
    from twinserve.core.sched.lazy_decodes import LazyDecodes
    from twinserve.sim.config import set_field

    answered = record_answers(monkeypatch, LazyDecodes, "_owed_sum")
    cfg = _fields(24, 120, 2, True, seed, 0, 2048, out_max=400)
    set_field(cfg, "capacity_policy", "guaranteed_no_evict")
    set_field(cfg, "engine.num_gpu_blocks", 160)
    passes, _, _ = _run(cfg, False)
    counted, used, res = _run(cfg, True, count=True)
    assert used >= 1 and sum(answered) > 0
    assert max(res.replicas[-1].steps.waiting) > 0  # joiners held back: the owed sum decided admissions
    assert _counts(counted) == _counts(passes)
