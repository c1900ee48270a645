"""`simulate search`'s shortcuts: a run stopped early only when its SLO is surely lost, the
steady-state estimate, the driver's calibration from neighbours, and screening."""

from __future__ import annotations

import copy
import gc
import math
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.sim.convergence import convergence_note, converged_search
from twinserve.sim.search import RateSearch, meets, search_rates
from twinserve.sim.search_band import search_seeds
from twinserve.sim.search_driver import _START_UP, calibration, likeness
from twinserve.sim.search_screen import contenders, screen_notes
from twinserve.sim.search_run import SLOGuard, exceed_needed, run_search_point, steady_state_rate
from twinserve.sim.world import RequestRecord

from .helpers import small_config

SLOS = {"p99_ttft_s": 2.0, "p99_tpot_s": 0.1}


def _rec(ttft: float) -> RequestRecord:
    return RequestRecord("r", 0.0, 10, 1, 0.0, ttft, ttft, 0, 0, [], finish_reason="length")


@given(st.lists(st.floats(0.0, 4.0), min_size=1, max_size=120), st.sampled_from([50, 90, 99]))
def test_guard_stops_only_when_the_percentile_must_miss(values: list[float], p: int) -> None:
    limit = 2.0
    guard = SLOGuard.for_run({f"p{p}_ttft_s": limit}, len(values))
    assert guard is not None
    for k, v in enumerate(values):
        if guard(_rec(v)):
            # Whatever the unseen requests take (even 0 s), the run's percentile misses.
            rest = [0.0] * (len(values) - k - 1)
            assert np.percentile(values[:k + 1] + rest, p) > limit
            return
    # Not stopped: then the percentile over all requests could still be anything; but if the
    # whole run misses by a count the guard had to see, it must have stopped.
    assert sum(v > limit for v in values) < exceed_needed(len(values), p / 100)


def test_a_lost_run_stops_early_and_fails_like_the_full_run() -> None:
    cfg = small_config(num_requests=300, rate=60.0)
    early = run_search_point(({}, cfg, SLOS, True))
    full = run_search_point(({}, cfg, SLOS, False))
    assert " lost: " in early["stopped_early"]
    assert early["completed"] < 300
    assert not meets(early, SLOS) and not meets(full, SLOS)
    ok = run_search_point(({}, small_config(num_requests=100, rate=0.5), SLOS, True))
    assert ok["stopped_early"] == "" and meets(ok, SLOS)  # a run that meets is never cut


def test_estimate_is_near_the_searched_answer_and_search_starts_there() -> None:
    cfg = small_config(num_requests=150, prompt_dist="uniform", prompt_min=100, prompt_max=1500,
                       output_dist="uniform", output_min=20, output_max=300)
    est = steady_state_rate(cfg, SLOS)
    (s,) = search_rates(cfg, {}, SLOS, workers=1, progress=False)
    # First run there, put _START_UP above it (a miss above stops early, a pass below runs whole).
    assert s.estimate == est and next(iter(s.runs)) == float(f"{est * _START_UP:.6g}")
    assert 0.3 < s.lo / est < 3.0


def test_calibration_is_the_geometric_mean_of_found_over_estimated() -> None:
    a = RateSearch({}, small_config(), lo=2.0, hi=2.0, estimate=1.0)
    b = RateSearch({}, small_config(), lo=8.0, hi=8.0, estimate=1.0)
    unstarted = RateSearch({}, small_config(), estimate=5.0)
    assert calibration([a, b, unstarted]) == 4.0
    assert calibration([unstarted]) == 1.0
    assert math.isinf(unstarted.hi)


def test_a_lost_cluster_run_stops_early_and_fails_like_the_full_run() -> None:
    # Disaggregated 1P+1D and a colocated pair: both used to run whole.
    for split in (1, 0):
        cfg = small_config(num_requests=300, rate=60.0, **{"cluster.num_replicas": 2,
                                                           "cluster.num_prefill_replicas": split})
        early = run_search_point(({}, cfg, SLOS, True))
        full = run_search_point(({}, cfg, SLOS, False))
        assert " lost: " in early["stopped_early"], split
        assert early["completed"] < full["completed"] == 300
        assert not meets(early, SLOS) and not meets(full, SLOS)
        ok = small_config(num_requests=100, rate=0.5, **{"cluster.num_replicas": 2,
                                                         "cluster.num_prefill_replicas": split})
        kept = run_search_point(({}, ok, SLOS, True))
        assert kept["stopped_early"] == "" and meets(kept, SLOS)
        whole = run_search_point(({}, ok, SLOS, False))
        assert {k: v for k, v in kept.items() if "wall" not in k and k != "stopped_early"} == \
            {k: v for k, v in whole.items() if "wall" not in k}


def test_calibration_takes_the_nearest_neighbours_answers() -> None:
    agg = RateSearch({"tp": 2, "mode": "agg"}, small_config(), lo=2.0, hi=2.0, estimate=1.0)
    dis = RateSearch({"tp": 2, "mode": "disagg 1P+1D"}, small_config(), lo=8.0, hi=8.0,
                     estimate=1.0)
    dis4 = RateSearch({"tp": 4, "mode": "disagg 1P+1D"}, small_config(), lo=16.0, hi=16.0,
                      estimate=1.0)
    done = [agg, dis, dis4]
    # The estimate errs one way for aggregated runs and another for disaggregated ones.
    assert calibration(done, RateSearch({"tp": 4, "mode": "agg"}, small_config())) == pytest.approx(2.0)
    assert calibration(done, RateSearch({"tp": 2, "mode": "disagg 2P+2D"}, small_config())) == \
        pytest.approx(8.0)
    assert calibration(done, RateSearch({"tp": 4, "mode": "disagg 3P+1D"}, small_config())) == \
        pytest.approx(16.0)
    assert likeness(dis, dis4) > likeness(dis, agg)


def _answered(hardware: str, rate: float, tok_s: float) -> RateSearch:
    s = RateSearch({"hardware": hardware}, small_config(**{"engine.hardware": hardware}),
                   lo=rate, hi=rate * 1.02)
    s.runs[rate] = {"total_token_throughput": tok_s, "output_throughput": tok_s / 5}
    return s


@given(st.floats(0.2, 5.0), st.floats(0.05, 0.6))
def test_screened_configuration_cannot_be_the_pick_or_a_tie(ratio: float, margin: float) -> None:
    # Same GPU and price: cost per token goes as 1 / throughput.
    best, other = _answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", ratio, 1000.0 * ratio)
    keep = contenders([best, other], 0.0, margin)
    # Kept exactly when its best case (rate + margin) reaches the cheapest's worst (the higher
    # rate - margin): no rates within the margins could make it the pick or a tie otherwise.
    best_case, cheapest_worst = ratio * (1 + margin), max(1.0, ratio) * (1 - margin)
    if not math.isclose(best_case, cheapest_worst):
        assert keep[1] == (best_case >= cheapest_worst)
    assert keep[0] or keep[1]  # the cheapest itself is always kept


def test_a_dominated_configuration_is_not_rechecked_nor_banded() -> None:
    cfg = small_config(num_requests=60, prompt_dist="fixed", prompt_mean=1500, output_dist="fixed",
                       output_mean=200, **{"search.requests_per_run": 60,
                                           "search.max_requests_per_run": 120,
                                           "search.band_seeds": 1,
                                           "search.prices": {"H100-SXM": 1000.0}})
    searches = converged_search(cfg, {"engine.hardware": ["A100-80GB", "H100-SXM"]}, SLOS,
                                workers=1, progress=False)
    search_seeds(searches, SLOS, 1, None, False)
    a100, h100 = searches
    assert not a100.screened and len(a100.lengths) == 2 and len(a100.seeds) == 2
    # Screened after a pass, or (its start raised to where a miss shows it dearer) dominated
    # with none: either way not rechecked and not banded.
    assert h100.seeds == [] and (h100.screened and len(h100.lengths) == 1
                                 or h100.dominated and not h100.lengths)
    assert convergence_note(h100, 0.05).startswith(("screened", "dominated"))
    cfg.search.screen_margin = 0.0
    again = converged_search(cfg, {"engine.hardware": ["A100-80GB", "H100-SXM"]}, SLOS,
                             workers=1, progress=False)
    assert not again[1].screened and len(again[1].lengths) == 2


def test_summary_warns_when_the_picks_band_is_wider_than_the_screen() -> None:
    best, other = _answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", 0.3, 300.0)
    other.screened = True
    row = {"max_rate": 1.0, "band_lo": 0.8}
    (line,) = screen_notes([best, other], row, 0.35)  # 20% below: inside the 35% screened
    assert line.startswith("screened: 1 configuration(s)")
    lines = screen_notes([best, other], {"max_rate": 1.0, "band_lo": 0.5}, 0.35)
    assert len(lines) == 2 and lines[1].startswith("WARNING") and "50%" in lines[1]
    assert screen_notes([best], row, 0.35) == []


def test_summary_warns_when_an_answer_moved_more_than_the_screen_between_lengths() -> None:
    best, other = _answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", 0.3, 300.0)
    other.screened = True
    best.lengths = [(300, 1.8), (600, 1.0)]  # -44%: the first answers were not near
    lines = screen_notes([best, other], {"max_rate": 1.0, "band_lo": 0.9}, 0.35)
    assert len(lines) == 2 and "moved more than screen_margin" in lines[1]
    best.lengths = [(300, 1.1), (600, 1.0)]
    assert len(screen_notes([best, other], {"max_rate": 1.0, "band_lo": 0.9}, 0.35)) == 1


def test_a_rechecked_answer_out_of_reach_gets_no_seed_band() -> None:
    from twinserve.sim.search_screen import skip_bands

    best, near, dear = (_answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", 0.6, 600.0),
                        _answered("A100-80GB", 0.4, 400.0))
    for s in (best, near, dear):
        s.lengths = [(60, s.lo), (120, s.lo)]  # rechecked: unmoved
    skip_bands([best, near, dear], 0.0, 0.35)
    # 0.6 x 1.35 reaches 1.0 x 0.65; 0.4 x 1.35 does not: no band can make it a tie.
    assert [s.unbanded for s in (best, near, dear)] == [False, False, True]
    search_seeds([dear], SLOS, 1, None, False)  # skipped (else seed 1 is searched for real)
    assert dear.seeds == [] and dear.runs_total == 0
    assert "no seed band" in convergence_note(dear, 0.05)
    assert "no seed band" not in convergence_note(near, 0.05)
    lines = screen_notes([best, near, dear], {"max_rate": 1.0, "band_lo": 0.9}, 0.35)
    assert len(lines) == 1 and lines[0].startswith("no seed band: 1 rechecked")
    skip_bands([best, near, dear], 0.0, 0.0)  # screen_margin = 0: every answer banded
    assert not dear.unbanded


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 0), (2, 1)])
def test_a_ttft_miss_is_counted_at_its_first_token_not_at_finish(replicas: int, split: int) -> None:
    # Long outputs: a late first token is known long before its request ends. Counted only at
    # finish, the guard could not stop before `need` requests had finished.
    slos = {"p90_ttft_s": 0.5}
    cfg = small_config(num_requests=200, rate=40.0, **{"workload.output_dist": "fixed",
                                                       "workload.output_mean": 400,
                                                       "cluster.num_replicas": replicas,
                                                       "cluster.num_prefill_replicas": split})
    need = exceed_needed(200, 0.9)
    early = run_search_point(({}, cfg, slos, True))
    full = run_search_point(({}, cfg, slos, False))
    assert early["stopped_early"].startswith("p90_ttft_s lost")
    assert early["completed"] < need  # stopped before `need` requests had finished
    assert not meets(full, slos) and not meets(early, slos)


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 0), (2, 1)])
def test_a_run_just_meeting_its_ttft_slo_is_not_stopped(replicas: int, split: int) -> None:
    # The limit sits just above the run's own p90 TTFT: counting any first token that is not the
    # request's (a decode replica's, in a disaggregated split) or counting one twice stops it.
    cfg = small_config(num_requests=200, rate=4.0, **{"workload.output_dist": "fixed",
                                                      "workload.output_mean": 400,
                                                      "cluster.num_replicas": replicas,
                                                      "cluster.num_prefill_replicas": split})
    full = run_search_point(({}, cfg, {"p90_ttft_s": 1e9}, False))
    slos = {"p90_ttft_s": full["p90_ttft_s"] * 1.001}
    early = run_search_point(({}, cfg, slos, True))
    assert early["stopped_early"] == "" and meets(early, slos)
    assert {k: v for k, v in early.items() if "wall" not in k and k != "stopped_early"} == \
        {k: v for k, v in full.items() if "wall" not in k}


def _guarded_run(cfg, limit: float, p: int, never_stop: bool, waiting: bool = True):
    """A run under a p-percentile TTFT guard counting misses at the first token and (waiting)
    while requests still wait; never_stop: the guard counts but never ends the run.
    Returns (the guard, the simulation after its run)."""
    from twinserve.sim.build import build
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.search_run import _watch_waiting
    from twinserve.sim.study import is_cluster

    n = cfg.workload.num_requests
    guard = SLOGuard.for_run({f"p{p}_ttft_s": limit}, n)
    assert guard is not None
    if never_stop:
        guard.checks = [(c, m, lim, n + 1) for c, m, lim, _ in guard.checks]
    sim = (build_cluster(cfg, on_record=guard) if is_cluster(cfg) else build(cfg)).simulation
    if not is_cluster(cfg):
        sim.abort = guard
    sim.first_token = guard.first_token
    if waiting:
        _watch_waiting(guard, sim, cfg.workload)
        assert guard.arrived is not None
    sim.run()
    return guard, sim


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 0), (2, 1), (3, 1)])
@given(rate=st.floats(10.0, 60.0), limit=st.floats(0.05, 3.0))
def test_requests_counted_while_waiting_past_their_ttft_limit_are_misses(
        replicas: int, split: int, rate: float, limit: float) -> None:
    # Counted while still waiting (no first token at the clock's now) or at the first token, each
    # miss is counted once, before its request finishes, and every request counted is a miss as
    # its record holds it: the stop moves earlier, the verdict cannot change.
    cfg = small_config(num_requests=60, rate=rate, **{"workload.output_dist": "fixed",
                                                      "workload.output_mean": 100,
                                                      "cluster.num_replicas": replicas,
                                                      "cluster.num_prefill_replicas": split})
    guard, sim = _guarded_run(cfg, limit, 50, never_stop=True)
    recs = [r for r in sim.records if r.finish_reason != "refused"]
    assert len(recs) == 60
    misses = {r.request_id for r in recs if r.first_token_time - r.arrival_time > limit}
    assert guard.early[0] == misses and guard.counts[0] == len(misses)


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 1)])
def test_a_ttft_lost_run_stops_while_its_requests_still_wait(replicas: int, split: int) -> None:
    # Overloaded: requests queue for seconds before their first token. Counted at the first
    # token only, the loss is seen when the need-th late request is prefilled; counted while
    # waiting, once need requests have waited past the limit: an earlier stop, the same verdict.
    cfg = small_config(num_requests=100, rate=60.0, **{"workload.output_dist": "fixed",
                                                       "workload.output_mean": 100,
                                                       "cluster.num_replicas": replicas,
                                                       "cluster.num_prefill_replicas": split})
    _, old = _guarded_run(cfg, 1.0, 50, never_stop=False, waiting=False)
    guard, new = _guarded_run(cfg, 1.0, 50, never_stop=False)
    assert old.aborted and new.aborted and guard.reason.startswith("p50_ttft_s lost")
    assert new.env.now < old.env.now and len(new.records) <= len(old.records)


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 1)])
def test_a_run_on_recycled_kv_blocks_gives_the_row_of_a_run_on_new_ones(replicas: int,
                                                                         split: int) -> None:
    # Each search run hands its KV blocks to the next run's pools: block ids, eviction order
    # and prefix hits (shared system prompts) must come out as with blocks made new.
    from twinserve.core.kv import block_pool

    cfg = small_config(num_requests=120, rate=8.0, **{"workload.num_system_prompts": 3,
                                                      "workload.system_prompt_len": 600,
                                                      "cluster.num_replicas": replicas,
                                                      "cluster.num_prefill_replicas": split})
    block_pool._SPARE.clear()
    new = run_search_point(({}, cfg, SLOS, True))
    assert block_pool._SPARE  # handed on
    reused = run_search_point(({}, cfg, SLOS, True))
    assert len(block_pool._SPARE) > 0 and new["prefix_hit_rate"] > 0
    block_pool._SPARE.clear()
    assert {k: v for k, v in reused.items() if "wall" not in k} == \
        {k: v for k, v in new.items() if "wall" not in k}


def test_the_waiting_watch_leaves_no_wrapper_on_the_source() -> None:
    # The wrapper refers to the source that holds it: left on, every run's source is garbage
    # only a full collection frees.
    from twinserve.sim.build import build
    from twinserve.sim.search_run import _watch_waiting

    cfg = small_config(num_requests=20)
    guard = SLOGuard.for_run(SLOS, 20)
    sim = build(cfg).simulation
    sim.first_token = guard.first_token
    _watch_waiting(guard, sim, cfg.workload)
    assert "pop_until" in vars(sim.source)
    sim.run()
    guard.unwatch()
    assert "pop_until" not in vars(sim.source) and guard.source is None


def test_a_first_token_over_two_ttft_limits_counts_for_both() -> None:
    # One early-counted set per check: a shared one skipped the second check's count.
    from types import SimpleNamespace

    guard = SLOGuard.for_run({"p50_ttft_s": 1.0, "p90_ttft_s": 2.0}, 10)
    assert guard is not None
    late = SimpleNamespace(payload=None, request_id="r0", arrival_time=0.0, first_token_time=3.0)
    assert not guard.first_token(late)
    assert guard.counts == [1, 1]
    rec = RequestRecord("r0", 0.0, 10, 2, 0.0, 3.0, 4.0, 0, 0, [], finish_reason="length")
    assert not guard(rec) and guard.counts == [1, 1]  # not again at finish


@pytest.mark.parametrize("split", [1, 0])
@pytest.mark.parametrize("rate", [0.5, 60.0])  # a run that meets its SLOs whole; one stopped lost
def test_a_cluster_search_run_is_freed_by_reference_counting(monkeypatch: pytest.MonkeyPatch,
                                                             rate: float, split: int) -> None:
    # Left to the collector, a finished cluster run (its SimPy generators suspended for good,
    # or a stop's traceback) was walked whole by the young collection at the end of its GC
    # policy: ~20 ms of a 0.15-0.25 s run on the FP8 8x H200 question.
    import twinserve.sim.cluster_study as cluster_study

    made: list[weakref.ref] = []
    build = cluster_study.build_cluster

    def spy(cfg: Any, **kw: Any) -> Any:
        built = build(cfg, **kw)
        made.append(weakref.ref(built.simulation))
        return built

    monkeypatch.setattr(cluster_study, "build_cluster", spy)
    cfg = small_config(num_requests=100 if rate < 1 else 300, rate=rate,
                       **{"cluster.num_replicas": 2, "cluster.num_prefill_replicas": split})
    gc.collect()
    gc.disable()
    try:
        row = run_search_point(({}, cfg, SLOS, True))
        alive = [r() is not None for r in made]
    finally:
        gc.enable()
    assert (" lost: " in row["stopped_early"]) == (rate > 1)
    assert alive == [False]


_EVERY_SLO = {f"{stat}_{metric}_s": 1e9 for stat in ("mean", "p50", "p90", "p99")
              for metric in ("ttft", "tpot", "e2e", "queue", "itl")}


@pytest.mark.parametrize("replicas,split", [(1, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("slos", [SLOS, _EVERY_SLO], ids=["ttft+tpot", "every"])
def test_a_lean_row_judges_like_the_full_row_to_the_bit(replicas: int, split: int,
                                                        slos: dict[str, float]) -> None:
    # The extra seeds' rows are only judged (verdict, and the SLO statistics that place the
    # next rate): a lean row must give every one of them exactly, one-token outputs (no TPOT)
    # and, without an ITL SLO, a run that records no token times included.
    cfg = small_config(num_requests=120, rate=4.0, output_dist="uniform", output_min=1,
                       output_max=200, **{"cluster.num_replicas": replicas,
                                          "cluster.num_prefill_replicas": split})
    full = run_search_point(({}, cfg, slos, True, False))
    lean = run_search_point(({}, cfg, slos, True, True))
    assert full["stopped_early"] == lean["stopped_early"] == ""
    kept = ["num_requests", "completed", "refused", "duration_s", "request_throughput",
            "output_throughput", "total_token_throughput", *slos]
    assert {k: lean[k] for k in kept} == {k: full[k] for k in kept}
    assert "mean_kv_usage" in full and "mean_kv_usage" not in lean  # no tables were made
    assert meets(lean, slos) == meets(full, slos) and meets(lean, slos)
    if "p99_itl_s" not in slos:  # nor token times recorded: the lean run's p99 TPOT still equal
        assert not math.isnan(lean["p99_tpot_s"])


def test_only_the_extra_seeds_runs_are_lean(monkeypatch: pytest.MonkeyPatch) -> None:
    import twinserve.sim.search as search_mod

    seen: list[tuple[int, bool]] = []
    real = search_mod.run_search_point

    def spy(job: tuple) -> dict:
        seen.append((job[1].run.seed, bool(job[4:] and job[4])))
        return real(job)

    monkeypatch.setattr(search_mod, "run_search_point", spy)
    cfg = small_config(num_requests=60, **{"search.band_seeds": 1})
    searches = converged_search(cfg, {}, SLOS, workers=1, progress=False)
    written = [r for s in searches for r in s.runs.values() if r["meets_slo"]]
    assert written and all("mean_kv_usage" in r for r in written)  # search_runs.csv's: full
    search_seeds(searches, SLOS, 1, None, False)
    assert {lean for seed, lean in seen if seed == cfg.run.seed} == {False}
    assert {lean for seed, lean in seen if seed != cfg.run.seed} == {True}


def test_seeds_driven_with_the_rechecks_find_what_the_stages_found_one_after_another() -> None:
    """banded_search drives the extra seeds in the first recheck round's queue: every answer,
    bracket and seed rate is the one the staged search (rechecks, skip_bands, then seeds)
    finds, on one worker (a fixed order) and on a pool of two."""
    from twinserve.sim.search_band import banded_search
    from twinserve.sim.search_screen import skip_bands

    cfg = small_config(num_requests=60, prompt_dist="fixed", prompt_mean=1500, output_dist="fixed",
                       output_mean=200, **{"search.requests_per_run": 60,
                                           "search.max_requests_per_run": 120,
                                           "search.band_seeds": 2})
    grid = {"engine.hardware": ["A100-80GB", "H100-SXM"]}
    for workers in (1, 2):
        staged = converged_search(cfg, grid, SLOS, workers=workers, progress=False)
        skip_bands(staged, 0.0, cfg.search.screen_margin)
        search_seeds(staged, SLOS, workers, None, False)
        assert all(len(s.seeds) == 3 for s in staged)  # both rechecked and banded: seeds to compare
        merged = banded_search(cfg, grid, SLOS, workers, None, False)
        for a, b in zip(staged, merged):
            assert (a.lo, a.hi, a.lengths) == (b.lo, b.hi, b.lengths)
            assert sorted(a.seeds) == sorted(b.seeds)
            assert a.seed_resolution == b.seed_resolution
            if workers == 1:  # one order of runs: the very same runs
                assert a.runs_total == b.runs_total and a.simulated == b.simulated


def test_seeds_of_an_answer_the_rechecks_put_out_of_reach_are_dropped() -> None:
    from twinserve.sim.search_band import record_seeds

    best, dear = _answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", 0.4, 400.0)
    seeded = []
    for s in (best, dear):
        s.lengths = [(60, s.lo), (120, s.lo)]  # rechecked: unmoved
        s.seeds, s.seed_resolution = [(0, s.lo)], 0.1
        r = _answered("A100-80GB", s.lo * 1.05, 1000.0)
        r.cfg = copy.deepcopy(r.cfg)
        r.cfg.run.seed, r.runs_total, r.simulated = 1, 2, 120
        seeded.append((s, r))
    dear.unbanded = True  # skip_bands, after the rechecks
    record_seeds(seeded)
    assert best.seeds == [(0, 1.0), (1, 1.05)] and best.seed_resolution == 0.1
    assert dear.seeds == [] and dear.seed_resolution == 0.0
    assert "no seed band" in convergence_note(dear, 0.05)
    assert dear.runs_total == best.runs_total  # the work done still counts


def test_an_answer_the_rechecks_bring_under_the_cap_still_gets_its_seeds(monkeypatch) -> None:
    """A first answer at max_rate (capped: no seeds driven with the rechecks) that its recheck
    answers below the cap is banded afterwards, as the staged search bands it."""
    import twinserve.sim.search_band as band

    cfg = small_config(**{"search.band_seeds": 1})
    ok, capped = _answered("A100-80GB", 1.0, 1000.0), _answered("A100-80GB", 1.0, 1000.0)
    capped.hi = math.inf  # capped at the first length
    for s in (ok, capped):
        s.lengths = [(150, 1.0)]
        s.cfg.search.band_seeds = 1
    seeded: list[RateSearch] = []
    ran: list[list[RateSearch]] = []

    def fake_converged(base, grid, slos, workers, ray, progress, alongside):
        seeded.extend(r for r in alongside([ok, capped]))
        capped.hi = 1.02  # its recheck found the top
        for s in (ok, capped):
            s.lengths.append((300, 1.0))
        return [ok, capped]

    def fake_run(searches, *a, **k):
        ran.append(list(searches))
        for r in searches:
            r.lo, r.hi = 1.05, 1.07
        return searches

    monkeypatch.setattr(band, "converged_search", fake_converged)
    monkeypatch.setattr(band, "run_searches", fake_run)
    band.banded_search(cfg, {}, SLOS, 1, None, False)
    assert len(seeded) == 1  # only the uncapped answer's seed rode with the rechecks
    assert len(ran) == 1 and len(ran[0]) == 1  # the capped one's seed, searched after
    assert ok.seeds == [(0, 1.0)]  # fake_converged drove nothing: its seed search stays unanswered
    assert capped.seeds == [(0, 1.0), (1, 1.05)]
