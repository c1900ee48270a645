"""Drafting decode batches advanced in windows (sim/spec_window.py) against the same runs stepped.

Windows draw acceptances from another random stream, so a run is compared with stepping exactly where the
draws cannot differ (every draft accepted, or none) and statistically otherwise."""

from __future__ import annotations

import math
import statistics

import pytest

from twinserve.sim.build import build
from twinserve.sim.cluster_study import build_cluster
from twinserve.sim.config import set_field
from twinserve.sim import spec_window
from twinserve.sim.spec_window import apply_spec_window, extend_spec_window, plan_spec_window

from .helpers import small_config

RATES = [0.8, 0.6, 0.5, 0.4]


@pytest.fixture(autouse=True)
def _windows_for_any_batch(monkeypatch):
    """These small studies test the windows themselves: let every drafting batch take them."""
    monkeypatch.setattr(spec_window, "SPEC_WINDOW_MIN_BATCH", 1)


def _spec(cfg, rates=RATES, k=4):
    set_field(cfg, "speculative.method", "ngram")
    set_field(cfg, "speculative.num_speculative_tokens", k)
    cfg.speculative.acceptance_rates = list(rates)
    return cfg


def _world(cfg, fast_forward: bool):
    built = build(cfg)
    sim = built.simulation
    sim.fast_forward = fast_forward
    return sim, sim.run()


def _tpots(result) -> list[float]:
    records = result.total.records if hasattr(result, "total") else result.records
    return [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
            for r in records if r.num_output_tokens > 1]


def _cluster(cfg, fast_forward: bool):
    sim = build_cluster(cfg, keep_steps=True).simulation
    sim.fast_forward = fast_forward
    sim.spec_joins = 0
    real = sim._spec_join_step

    def spy(rep, t):
        out = real(rep, t)
        sim.spec_joins += out is not None
        return out

    sim._spec_join_step = spy
    return sim, sim.run()


def _cluster_cfg(seed: int = 0, rates=RATES, k=4):
    cfg = small_config(concurrency=24, num_requests=240, warmup_requests=0, num_replicas=2, num_prefill_replicas=1,
                       output_dist="fixed", output_mean=120)
    set_field(cfg, "run.seed", seed)
    return _spec(cfg, rates, k)


@pytest.mark.parametrize("rates", [[1.0] * 3, [0.0] * 3])
def test_with_every_draft_accepted_or_none_a_windowed_run_is_the_stepped_run(rates) -> None:
    # No randomness left: the windows' steps, tokens, finishes and KV blocks are stepping's.
    cfg = _spec(small_config(num_requests=40, rate=5.0), rates=rates, k=3)
    sim_w, windowed = _world(cfg, True)
    sim_s, stepped = _world(cfg, False)
    assert windowed.num_ff_windows > 0
    assert stepped.num_ff_windows == 0
    assert windowed.num_steps == stepped.num_steps
    assert list(windowed.steps.tokens) == list(stepped.steps.tokens)
    assert list(windowed.steps.running) == list(stepped.steps.running)
    for a, b in zip(windowed.records, stepped.records):
        assert a.num_output_tokens == b.num_output_tokens
        assert a.finish_time == pytest.approx(b.finish_time, rel=1e-9)
        assert a.first_token_time == pytest.approx(b.first_token_time, rel=1e-9)
    for a, b in zip(windowed.steps.duration, stepped.steps.duration):
        assert a == pytest.approx(b, rel=1e-9)
    sw, ss = sim_w.core.scheduler, sim_s.core.scheduler
    assert sw.spec_stats.num_draft_tokens == ss.spec_stats.num_draft_tokens
    assert sw.spec_stats.accepted_per_pos == ss.spec_stats.accepted_per_pos
    assert sw.kv.num_free_blocks == ss.kv.num_free_blocks
    assert sim_w.executor.totals.busy_time == pytest.approx(sim_s.executor.totals.busy_time, rel=1e-9)


def test_a_disaggregated_clusters_drafting_join_steps_are_its_stepped_ones_without_randomness() -> None:
    cfg = _cluster_cfg(rates=[1.0] * 3, k=3)
    sim_w, windowed = _cluster(cfg, True)
    sim_s, stepped = _cluster(cfg, False)
    assert sim_w.spec_joins > 0 and sum(r.num_ff_windows for r in windowed.replicas) > 0
    assert sim_s.spec_joins == 0
    assert [r.num_steps for r in windowed.replicas] == [r.num_steps for r in stepped.replicas]
    fin_w = sorted((r.request_id, r.num_output_tokens, round(r.finish_time, 9)) for r in windowed.total.records)
    fin_s = sorted((r.request_id, r.num_output_tokens, round(r.finish_time, 9)) for r in stepped.total.records)
    assert fin_w == fin_s


def test_windowed_and_stepped_runs_agree_on_tpot_and_tokens_per_step_within_sampling_error() -> None:
    # Eight seeds each way: the means of the runs' mean TPOT and accepted drafts per verification must agree
    # within four standard errors of their difference.
    tpot = {True: [], False: []}
    per_verify = {True: [], False: []}
    for seed in range(8):
        for ff in (True, False):
            cfg = _spec(small_config(num_requests=60, rate=4.0))
            set_field(cfg, "run.seed", seed)
            sim, res = _world(cfg, ff)
            if ff:
                assert res.num_ff_windows > 0
            tpot[ff].append(statistics.mean(_tpots(res)))
            st = sim.core.scheduler.spec_stats
            per_verify[ff].append(st.num_accepted_tokens / st.num_drafts)
    for series in (tpot, per_verify):
        a, b = series[True], series[False]
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        assert abs(statistics.mean(a) - statistics.mean(b)) <= 4 * se + 1e-12, (a, b)
    # The expected accepted drafts per full verification: 0.8 + 0.48 + 0.24 + 0.096.
    assert statistics.mean(per_verify[True]) == pytest.approx(1.616, abs=0.08)


def test_cluster_windows_agree_with_stepping_on_tpot_within_sampling_error() -> None:
    tpot = {True: [], False: []}
    for seed in range(6):
        for ff in (True, False):
            sim, res = _cluster(_cluster_cfg(seed), ff)
            assert (sim.spec_joins > 0) == ff
            tpot[ff].append(statistics.mean(_tpots(res)))
    a, b = tpot[True], tpot[False]
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    assert abs(statistics.mean(a) - statistics.mean(b)) <= 4 * se + 1e-12, (a, b)


def test_a_window_stops_at_the_first_finish_and_before_the_deadline_and_never_passes_a_length() -> None:
    cfg = _spec(small_config(num_requests=8, rate=1000.0, output_dist="fixed", output_mean=50))
    built = build(cfg)
    sim = built.simulation
    core = sim.core
    sched = core.scheduler
    ex = sim.executor
    sim.fast_forward = False
    # Admit everything and step until every request drafts.
    for item in sim.source.pop_until(float("inf")):
        sim._admit_items([item])
    t = 0.0
    while sched.waiting or not all(r.spec_token_ids and r.output_token_ids for r in sched.running):
        _, stats = core.step(t)
        t += stats.duration
    limits = {r.request_id: r.stop_check_len for r in sched.running}
    reqs = list(sched.running)
    # A deadline cuts the window: no planned step starts at or after it.
    win = plan_spec_window(sched, ex, 1 << 30, t, t + 0.05)
    assert win is not None
    starts = [t, *win.ends[:-1]]
    assert all(s < t + 0.05 for s in starts)
    # Without one, the window runs to the first finish and ends there.
    while sched.running:
        win = plan_spec_window(sched, ex, 1 << 30, t, float("inf"))
        assert win is not None
        n_before = len(sched.running)
        finished = apply_spec_window(sched, ex, win, len(win.ends), False)
        for req in sched.running:
            assert len(req.all_token_ids) < limits[req.request_id]
        if win.finishing is not None:
            assert finished and len(sched.running) == n_before - len(finished)
        else:
            assert len(win.ends) == 256  # only the cap ends a window without a finish
        t = win.ends[-1]
    # Each ended exactly at its length limit, and gave every block back.
    assert all(len(r.all_token_ids) == limits[r.request_id] and len(r.output_token_ids) == 50 for r in reqs)
    assert not any(sched.kv.req_to_blocks.get(r.request_id) for r in reqs)


def _free_order(kv) -> list[int]:
    """The pool's free queue, front to back (block ids): the order later allocations take them in."""
    q = kv.pool.free_queue
    out, b = [], q._head.next_free
    while b is not q._tail:
        out.append(b.block_id)
        b = b.next_free
    return out


@pytest.mark.parametrize("rates", [[1.0] * 3, [0.0] * 3])
def test_without_a_prefix_cache_windows_hand_out_and_free_stepping_s_blocks_in_its_order(rates) -> None:
    # The replays' pooled path (no prefix cache: one pool call a step for the drafts' blocks, one for the
    # rejected ones') leaves the free queue as stepping's per-request calls do, block for block.
    cfg = _spec(small_config(num_requests=40, rate=5.0), rates=rates, k=3)
    set_field(cfg, "scheduler.enable_prefix_caching", False)
    sim_w, windowed = _world(cfg, True)
    sim_s, stepped = _world(cfg, False)
    kw, ks = sim_w.core.scheduler.kv, sim_s.core.scheduler.kv
    assert not kw.enable_caching
    assert windowed.num_ff_windows > 0 and stepped.num_ff_windows == 0
    assert list(windowed.steps.tokens) == list(stepped.steps.tokens)
    assert [r.finish_time for r in windowed.records] == pytest.approx([r.finish_time for r in stepped.records],
                                                                        rel=1e-9)
    assert _free_order(kw) == _free_order(ks) and len(_free_order(kw)) > 0
    ccfg = _cluster_cfg(rates=rates, k=3)
    set_field(ccfg, "scheduler.enable_prefix_caching", False)
    cw, rw = _cluster(ccfg, True)
    cs, rs = _cluster(ccfg, False)
    assert cw.spec_joins > 0
    assert [r.num_steps for r in rw.replicas] == [r.num_steps for r in rs.replicas]
    assert ([_free_order(r.core.scheduler.kv) for r in cw.replicas]
            == [_free_order(r.core.scheduler.kv) for r in cs.replicas])


def test_a_window_drawn_a_few_steps_at_a_time_is_the_window_drawn_at_once() -> None:
    # No randomness: extend_spec_window's steps continue plan_spec_window's exactly, up to the same end.
    cfg = _spec(small_config(num_requests=8, rate=1000.0, output_dist="fixed", output_mean=300), rates=[1.0] * 3,
                k=3)
    sim = build(cfg).simulation
    sched, ex = sim.core.scheduler, sim.executor
    sim.fast_forward = False
    for item in sim.source.pop_until(float("inf")):
        sim._admit_items([item])
    t = 0.0
    while sched.waiting or not all(r.spec_token_ids and r.output_token_ids for r in sched.running):
        t += sim.core.step(t)[1].duration
    whole = plan_spec_window(sched, ex, 200, t, math.inf)
    part = plan_spec_window(sched, ex, 200, t, math.inf, first=2)
    assert len(part.ends) == 2 < len(whole.ends)
    while extend_spec_window(ex, part, len(part.ends)):
        pass
    assert part.closed or len(part.ends) == 200
    assert part.ends == whole.ends and part.durations == whole.durations
    assert [a.tolist() for a in part.accepted] == [a.tolist() for a in whole.accepted]
    assert [[x.tolist() for x in a] for a in part.allocs] == [[x.tolist() for x in a] for a in whole.allocs]
    assert [[x.tolist() for x in a] for a in part.trims] == [[x.tolist() for x in a] for a in whole.trims]


def _drawn_and_applied(first: int, monkeypatch) -> tuple[int, int]:
    from twinserve.sim import cluster
    monkeypatch.setattr(cluster, "SPEC_FIRST_DRAW", first)
    cfg = small_config(concurrency=96, num_requests=600, warmup_requests=0, num_replicas=2, num_prefill_replicas=1,
                       output_dist="fixed", output_mean=60)
    set_field(cfg, "run.seed", 1)
    sim = build_cluster(_spec(cfg), keep_steps=True).simulation
    drawn = applied = 0
    real = sim._apply_spec_window

    def spy(rep, t, plan, m):
        nonlocal drawn, applied
        drawn += len(plan.ends)
        applied += m
        return real(rep, t, plan, m)

    sim._apply_spec_window = spy
    sim.run()
    return drawn, applied


def test_cluster_windows_drawn_a_few_steps_at_a_time_waste_fewer_draws(monkeypatch) -> None:
    # A replica's window is cut by arrivals: drawn a few steps at a time (doubling), fewer of its draws are
    # never applied than drawn whole (up to MAX_SPEC_WINDOW steps).
    few, few_applied = _drawn_and_applied(2, monkeypatch)
    whole, whole_applied = _drawn_and_applied(256, monkeypatch)
    assert few_applied > 1000 and whole_applied > 1000
    assert few - few_applied < 0.6 * (whole - whole_applied)


def test_a_narrow_drafting_batch_steps_and_a_wide_one_takes_windows(monkeypatch) -> None:
    # Below SPEC_WINDOW_MIN_BATCH running requests a drafting batch steps (cheaper there: a window's numpy
    # calls a step outweigh a Python pass over a few requests); from it on, windows.
    monkeypatch.setattr(spec_window, "SPEC_WINDOW_MIN_BATCH", 8)
    narrow = _spec(small_config(num_requests=40, concurrency=4, warmup_requests=0))
    wide = _spec(small_config(num_requests=120, concurrency=24, warmup_requests=0))
    assert _world(narrow, True)[1].num_ff_windows == 0
    assert _world(wide, True)[1].num_ff_windows > 0
    sim, res = _cluster(_cluster_cfg(), True)  # 24 clients on one decode replica: windows and drafting joins
    assert sim.spec_joins > 0 and sum(r.num_ff_windows for r in res.replicas) > 0
    monkeypatch.setattr(spec_window, "SPEC_WINDOW_MIN_BATCH", 64)
    sim, res = _cluster(_cluster_cfg(), True)
    assert sim.spec_joins == 0 and sum(r.num_ff_windows for r in res.replicas) == 0
