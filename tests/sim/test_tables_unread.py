"""The simulator's schedulers hand the cost model no block ids and no copy of a new request's tokens
(Scheduler.executor_reads_tables False, set by sim/build.py): the executor reads counts only, so
every figure a run reports must be the run's with the tables made (issue 50: ~9% of a search)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core.sched.fast_loop import NO_IDS
from twinserve.sim.build import build
from twinserve.sim.cluster_study import build_cluster

from .test_join_steps import _cached_config as _config


def _spy(core, seen: list) -> None:
    """Record what each step hands the executor: new requests' token counts and ids, block id lists."""
    real = core.executor.execute

    def execute(so, *args, **kw):
        seen.append((tuple((n.req_id, len(n.token_ids), n.num_prompt_tokens, n.num_computed_tokens,
                            type(n.block_ids) is tuple and not n.block_ids) for n in so.scheduled_new_reqs),
                     tuple(type(b) is tuple and not b for b in so.scheduled_cached_reqs.new_block_ids),
                     tuple(so.scheduled_cached_reqs.req_ids), tuple(so.num_scheduled_tokens.items())))
        return real(so, *args, **kw)

    core.executor.execute = execute


def _cluster(cfg, reads: bool) -> tuple:
    built = build_cluster(cfg, keep_steps=True)
    sim = built.simulation
    seen: list = []
    for rep in sim.replicas:
        assert rep.core.scheduler.executor_reads_tables is False  # the simulator's default
        rep.core.scheduler.executor_reads_tables = reads
        _spy(rep.core, seen)
    res = sim.run()
    per = []
    for rep, rr in zip(sim.replicas, res.replicas):
        kv = rep.core.scheduler.kv
        per.append((tuple(dataclasses.astuple(r) for r in rr.records), dataclasses.astuple(rr.steps),
                    rr.num_steps, rr.num_preemptions, rr.end_time, dataclasses.astuple(rep.executor.totals),
                    [b.block_id for b in kv.pool.free_queue], kv.stats.queries, kv.stats.hits))
    return (tuple(dataclasses.astuple(r) for r in res.total.records), per), seen


def _same_but_tables(lean_seen: list, full_seen: list) -> None:
    """Each step handed the same requests and counts; the lean run's id lists all empty, the full
    run's not where blocks were taken."""
    assert len(lean_seen) == len(full_seen)
    for lean, full in zip(lean_seen, full_seen):
        assert [x[:4] for x in lean[0]] == [x[:4] for x in full[0]]
        assert lean[2:] == full[2:]
        assert all(x[4] for x in lean[0]) and all(lean[1])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), blocks=st.sampled_from([0, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), turns=st.sampled_from([1, 1, 2]),
       system_prompts=st.sampled_from([0, 0, 3]), caching=st.booleans())
def test_cluster_runs_without_tables_give_every_figure_of_runs_with_them(
        n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts, caching) -> None:
    cfg = _config(n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts, caching)
    full, full_seen = _cluster(cfg, True)
    lean, lean_seen = _cluster(cfg, False)
    assert lean == full
    _same_but_tables(lean_seen, full_seen)
    assert any(not x[4] for step in full_seen for x in step[0])  # the full run made ids


def _engine(cfg, reads: bool) -> tuple:
    built = build(cfg)
    sim = built.simulation
    assert sim.core.scheduler.executor_reads_tables is False
    sim.core.scheduler.executor_reads_tables = reads
    seen: list = []
    _spy(sim.core, seen)
    res = sim.run()
    kv = sim.core.scheduler.kv
    return (tuple(dataclasses.astuple(r) for r in res.records), dataclasses.astuple(res.steps), res.num_steps,
            res.num_preemptions, res.end_time, res.prefix_hits, [b.block_id for b in kv.pool.free_queue]), seen


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), seed=st.integers(0, 5),
       blocks=st.sampled_from([0, 60, 200]), budget=st.sampled_from([64, 256, 2048]),
       turns=st.sampled_from([1, 2]), system_prompts=st.sampled_from([0, 3]), caching=st.booleans(),
       open_loop=st.booleans())
def test_one_engine_runs_without_tables_give_every_figure_of_runs_with_them(
        n, count, seed, blocks, budget, turns, system_prompts, caching, open_loop) -> None:
    cfg = _config(n, count, 1, False, seed, blocks, budget, turns, system_prompts, caching)
    if open_loop:
        cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, concurrency=0, rate=40.0))
    full, full_seen = _engine(cfg, True)
    lean, lean_seen = _engine(cfg, False)
    assert lean == full
    _same_but_tables(lean_seen, full_seen)


def test_a_lean_new_request_carries_its_own_token_list_and_the_full_one_a_copy() -> None:
    cfg = _config(4, 8, 1, False, 0, 0, 256, 1, 0, True)
    for reads in (True, False):
        built = build(cfg)
        core = built.simulation.core
        core.scheduler.executor_reads_tables = reads
        got = []
        real = core.executor.execute

        def execute(so, *args, _real=real, **kw):
            for new in so.scheduled_new_reqs:
                req = core.scheduler.requests[new.req_id]
                got.append((new.token_ids is req.all_token_ids, new.token_ids == req.all_token_ids,
                            list(new.block_ids) == core.scheduler.kv.get_block_ids(new.req_id),
                            new.block_ids is NO_IDS))
            return _real(so, *args, **kw)

        core.executor.execute = execute
        built.simulation.run()
        assert got and all(equal for _, equal, _, _ in got)
        if reads:
            assert not any(same for same, _, _, _ in got) and all(ids for _, _, ids, _ in got)
        else:
            assert all(same for same, _, _, _ in got) and all(empty for _, _, _, empty in got)


def test_the_real_engines_scheduler_reads_tables_by_default() -> None:
    from twinserve.core.sched.config import SchedulerConfig
    from twinserve.core.sched.scheduler import Scheduler

    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16))
    assert sched.executor_reads_tables is True
    sched.executor_reads_tables = False
    assert sched.executor_reads_tables is False
    sched.executor_reads_tables = True
    assert sched.executor_reads_tables is True
