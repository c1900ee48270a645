"""Speed paths `simulate search` leans on give the same runs as the plain ones."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim import disagg
from twinserve.sim.cluster_study import simulate_cluster

from .helpers import small_config
from .test_join_steps import _cached_config


def _disagg_run(prefill: int, replicas: int, rate: float):
    cfg = small_config(num_requests=120, rate=rate, prompt_dist="uniform", prompt_min=200,
                       prompt_max=1500, output_dist="uniform", output_min=20, output_max=300,
                       **{"cluster.num_replicas": replicas,
                          "cluster.num_prefill_replicas": prefill})
    _, res = simulate_cluster(cfg)
    # Every request and every replica's steps, exactly.
    return ([dataclasses.astuple(r) for r in res.total.records],
            [dataclasses.astuple(r.steps) for r in res.replicas], res.busy_time)


@pytest.mark.parametrize("prefill,replicas,rate", [(1, 2, 4.0), (2, 3, 9.0)])
def test_decode_windows_of_a_disaggregated_run_match_stepping_them(
        monkeypatch: pytest.MonkeyPatch, prefill: int, replicas: int, rate: float) -> None:
    calls = []
    inner = disagg._Discounted._decode_step_times

    def counted(self, *a):
        calls.append(a)
        return inner(self, *a)

    monkeypatch.setattr(disagg._Discounted, "_decode_step_times", counted)
    fast = _disagg_run(prefill, replicas, rate)
    assert calls, "no decode window went through the cost model's own loop"
    # The plain path: a cost model without decode_step_times steps each window in Python.
    real_init = disagg._Discounted.__init__

    def plain_init(self, inner_model):
        real_init(self, inner_model)
        self.__dict__.pop("decode_step_times", None)

    monkeypatch.setattr(disagg._Discounted, "__init__", plain_init)
    calls.clear()
    slow = _disagg_run(prefill, replicas, rate)
    assert not calls
    assert fast == slow


def test_a_window_priced_inside_a_discounted_step_is_refused() -> None:
    from twinserve.sim.build import build_cost_models

    d = disagg._Discounted(build_cost_models(small_config())[2])
    d.minus = (10, 1, 0, 50.0)
    with pytest.raises(RuntimeError, match="discounted"):
        d.decode_step_times(4, 1000, 10, 0.0, 1.0)


def test_a_nearby_answer_starts_at_every_such_searchs_ratio_with_its_own_step() -> None:
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import calibration, drive

    from .helpers import small_config as cfg

    # Done: the recheck of tp=1 moved x2 from its short runs' answer, tp=2's x8; a cost-model
    # estimate would take tp=2's (its nearest neighbour), a nearby answer the ratio of all (x4).
    a = RateSearch({"tp": 1}, cfg(), lo=2.0, hi=2.0, estimate=1.0, near_step=1.05)
    b = RateSearch({"tp": 2}, cfg(), lo=8.0, hi=8.0, estimate=1.0, near_step=1.05)
    recheck = RateSearch({"tp": 2}, cfg(), estimate=1.0, near_step=1.05, tolerance=0.05)
    rates: list[tuple[int, float]] = []

    def job(s, rate):
        rates.append((id(s), rate))
        return rate

    drive([a, b, recheck], lambda rate: {"rate": rate}, job, lambda row: row["rate"] <= 4.1,
          workers=1)
    assert calibration([a, b], RateSearch({"tp": 2}, cfg(), estimate=1.0)) == pytest.approx(8.0)
    # The nearby answer's step: 4 passes, 4 x 1.05 = 4.2 fails, settled in two runs.
    assert [r for k, r in rates if k == id(recheck)] == [4.0, 4.2]
    assert recheck.lo == 4.0 and recheck.hi == 4.2


def _dear_h100_config():
    """Short fixed-length runs, no band seeds, the H100 priced out of reach of the A100."""
    return small_config(num_requests=60, prompt_dist="fixed", prompt_mean=1500, output_dist="fixed",
                        output_mean=200, **{"search.requests_per_run": 60,
                                            "search.max_requests_per_run": 120,
                                            "search.band_seeds": 0,
                                            "search.prices": {"H100-SXM": 1000.0}})


def test_a_search_out_of_reach_stops_bisecting_with_the_bracket_it_would_have_narrowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from twinserve.sim import convergence
    from twinserve.sim.search import RateSearch

    from .test_search_speed import SLOS

    cfg = _dear_h100_config()
    grid = {"engine.hardware": ["A100-80GB", "H100-SXM"]}
    # Rates placed by steps and bisection only: here the H100's statistics are concave in the
    # rate, so two passes' line lands short and it creeps up by passes to a 5% bracket with no
    # bisection left to stop (RateSearch.crossing is tested apart, tests/sim/test_search.py).
    monkeypatch.setattr(RateSearch, "crossing", lambda self: None)
    a100, h100 = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    monkeypatch.setattr(convergence, "out_of_reach", lambda *a: None)
    full_a100, full_h100 = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    # The dominated H100 stopped early, on the same bisection path: its bracket holds the full one
    # (started at the rate below which a miss shows it dearer, it missed there: no pass at all).
    assert (h100.screened or h100.dominated) and full_h100.screened
    assert h100.runs_total < full_h100.runs_total
    assert h100.lo <= full_h100.lo < full_h100.hi <= h100.hi
    assert (h100.hi - h100.lo) / h100.hi > cfg.search.first_tolerance
    # The cheapest bisected as before.
    assert (a100.lo, a100.hi, a100.runs_total) == (full_a100.lo, full_a100.hi, full_a100.runs_total)


def test_out_of_reach_only_when_even_the_brackets_top_is_dearer_than_the_cheapests_worst() -> None:
    from twinserve.sim.search_screen import out_of_reach

    from .test_search_speed import _answered

    best = _answered("A100-80GB", 1.0, 1000.0)  # cost per token ~ 1 / rate (same GPU)
    settled = out_of_reach(0.0, 0.35)
    for lo, hi in [(0.3, 0.45), (0.3, 0.5), (0.3, 0.9), (0.46, 0.5)]:
        other = _answered("A100-80GB", lo, 1000.0 * lo)
        other.hi = hi
        # Cheapest's worst: rate 0.65; the other's best: hi x 1.35.
        assert settled(other, [best, other]) == (hi * 1.35 < 0.65), (lo, hi)
    assert not settled(best, [best])
    assert out_of_reach(0.0, 0.0) is None


def test_a_search_with_no_pass_is_out_of_reach_once_a_rate_it_missed_is() -> None:
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_screen import out_of_reach

    from .test_search_speed import _answered

    from twinserve.sim.search_commands import workload_lengths

    cfg = small_config(**{"engine.hardware": "A100-80GB"})
    tok = float(sum(workload_lengths(cfg)))  # a request's tokens: throughput per req/s at most
    best = _answered("A100-80GB", 1.0, tok)  # same GPU and price: cost goes as 1 / rate
    best.runs[1.0]["meets_slo"] = True
    settled = out_of_reach(0.0, 0.35)
    for hi in (0.3, 0.45, 0.5, 0.6, 0.9):
        other = RateSearch({"hardware": "A100-80GB"},
                           small_config(**{"engine.hardware": "A100-80GB"}), hi=hi)
        # Its answer is below hi: even at hi x 1.35 dearer than the cheapest's worst (rate 0.65)?
        assert settled(other, [best, other]) == (hi * 1.35 < 0.65), hi
    # The least rate whose miss settles it: a start raised there passes higher or ends the search.
    other = RateSearch({"hardware": "A100-80GB"}, small_config(**{"engine.hardware": "A100-80GB"}))
    floor = settled.floor(other, [best, other])
    assert floor == pytest.approx(0.65 / 1.35, rel=1e-6)
    other.hi = floor
    assert settled(other, [best, other])
    other.hi = floor * 1.001
    assert not settled(other, [best, other])
    assert settled.floor(other, [other]) == 0.0  # nothing answered yet: no floor
    # A configuration whose requests carry 4x the tokens reaches the same cost at 1/4 the rate:
    # its own workload prices it, not the cheapest's.
    long = RateSearch({"hardware": "A100-80GB"}, small_config(**{
        "engine.hardware": "A100-80GB", "prompt_dist": "fixed", "output_dist": "fixed",
        "prompt_mean": 4 * 1134, "output_mean": 4 * 187}))
    ratio = sum(workload_lengths(long.cfg)) / tok
    assert settled.floor(long, [best, long]) == pytest.approx(0.65 / 1.35 / ratio, rel=1e-6)


def test_a_search_with_no_pass_runs_at_the_floor_at_most_once_and_under_it() -> None:
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import drive

    from .helpers import small_config as cfg

    floor_rate = 2.5234567891  # rounds up to 2.52346 at six digits

    def settled(s, searches):
        return s.lo == 0.0 and s.hi <= floor_rate

    settled.floor = lambda s, searches: floor_rate
    s = RateSearch({"tp": 1}, cfg(), start=9.0, step=1.2)
    rates: list[float] = []

    def run(rate):
        rates.append(rate)
        assert len(rates) < 20, rates  # a floor rounded above itself missed there forever
        return {"rate": rate}

    drive([s], run, lambda s, rate: rate, lambda row: False, workers=1, settled=settled)
    # Misses walk down from 9 until the next step would go under the floor; then one run at
    # (not above) the floor settles it.
    assert rates[:2] == [9.0, 7.5] and rates[-1] <= floor_rate < rates[-2]
    assert all(r > floor_rate for r in rates[:-1]) and settled(s, [s])


def test_skipping_dominated_configurations_keeps_the_true_pick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from twinserve.sim import convergence
    from twinserve.sim.search import cheapest, summary_rows

    from .test_search_speed import SLOS

    cfg = _dear_h100_config()
    # The dear H100 first (nothing to compare it with yet), then the A100, the true pick, then
    # the H100 again at a price that puts it out of the A100's reach before it has passed.
    grid = {"engine.hardware": ["H100-SXM", "A100-80GB"]}
    fast = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    monkeypatch.setattr(convergence, "out_of_reach", lambda *a: None)
    full = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    pick = [cheapest(summary_rows(x))["hardware"] for x in (fast, full)]
    assert pick == ["A100-80GB", "A100-80GB"]
    assert (fast[1].lo, fast[1].hi) == (full[1].lo, full[1].hi)
    cfg.search.prices = {"A100-80GB": 1.0, "H100-SXM": 1000.0}
    grid = {"engine.hardware": ["A100-80GB", "H100-SXM"]}
    monkeypatch.undo()
    fast = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    a100, h100 = fast
    assert h100.dominated and h100.lo == 0.0 and h100.status == "dominated"
    # Its true answer lies below the rate it missed, and there it is no pick.
    monkeypatch.setattr(convergence, "out_of_reach", lambda *a: None)
    full = convergence.converged_search(cfg, grid, SLOS, workers=1, progress=False)
    assert full[1].lo < h100.hi and not full[1].dominated
    assert cheapest(summary_rows(full))["hardware"] == "A100-80GB"
    assert h100.runs_total < full[1].runs_total
    assert (a100.lo, a100.hi) == (full[0].lo, full[0].hi)


ITL_CASES = {
    "open loop": {"rate": 8.0},
    "closed loop": {"concurrency": 8, "think_time_s": 0.2, "warmup_requests": 10},
    "cluster": {"rate": 8.0, "cluster.num_replicas": 2},
    "disaggregated": {"rate": 8.0, "cluster.num_replicas": 3, "cluster.num_prefill_replicas": 1},
}


@pytest.mark.parametrize("case", list(ITL_CASES))
def test_a_row_without_itl_lists_is_the_row_with_them(case: str) -> None:
    # The search builds its rows with itl=False (ITLs from the records, numpy): same numbers.
    import math

    from twinserve.sim.study import run_point

    cfg = small_config(num_requests=60, output_dist="uniform", output_min=1,
                       output_max=80, **ITL_CASES[case])
    full, lean = run_point(cfg), run_point(cfg, itl=False)
    assert full.row.keys() == lean.row.keys()
    for k, v in full.row.items():
        w = lean.row[k]
        if k == "sim_wall_s" or k == "sim_requests_per_wall_s":
            continue
        assert (v == w) or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), k
    assert full.row["p99_itl_s"] > 0
    assert all(len(x) == 0 for x in lean.requests["itl_s"])



def test_seed_searches_start_on_the_answers_grid_at_the_ratio_other_seeds_found() -> None:
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_band import seed_step
    from twinserve.sim.search_driver import drive, on_grid

    # Both answers' first-length brackets are 5% wide (grid 1.05); this seed's answers lie 10%
    # above both (one workload seed moves every configuration alike).
    a = RateSearch({"tp": 1}, small_config(), lo=4.0, hi=4.2, first_hi=4.2)
    step = seed_step(a, 4.0, 0.05)
    assert step == pytest.approx(1.05)
    assert seed_step(RateSearch({}, small_config(), first_hi=5.0), 4.0, 0.05) == pytest.approx(1.1)
    assert seed_step(RateSearch({}, small_config()), 4.0, 0.05) == pytest.approx(1.1)
    first = RateSearch({"tp": 1}, small_config(), estimate=4.0, near_step=step, grid=step,
                       tolerance=0.05)
    second = RateSearch({"tp": 2}, small_config(), estimate=2.0, near_step=step, grid=step,
                        tolerance=0.05)
    answers = {id(first): 4.4, id(second): 2.2}
    rates: dict[int, list[float]] = {id(first): [], id(second): []}

    def job(s, rate):
        rates[id(s)].append(rate)
        return id(s), rate

    drive([first, second], lambda j: {"s": j[0], "rate": j[1]}, job,
          lambda row: row["rate"] <= answers[row["s"]], workers=1)
    # The first starts at its answer, steps on its grid and bisects to the tolerance.
    assert rates[id(first)][:2] == pytest.approx([4.0, 4.2], rel=1e-5)
    assert first.lo <= 4.4 < first.hi and (first.hi - first.lo) / first.hi <= 0.05
    # The second starts at the grid power nearest x1.077 (the first's bracket midpoint over its
    # answer), two steps up: its answer lies in the bracket under it, a miss then a pass.
    assert rates[id(second)] == pytest.approx([2.205, 2.1], rel=1e-5)
    assert on_grid(1.0766, 1.05) == pytest.approx(1.05 ** 2)
    assert on_grid(1.07, 1.05) == pytest.approx(1.05) and on_grid(0.97, 1.05) == pytest.approx(1 / 1.05)
    assert on_grid(1.3, 0.0) == 1.3


def test_a_seed_landing_a_step_above_the_bracket_its_ratio_lies_in_takes_two_runs() -> None:
    # FP8 8x H200 question: seed 1 lands ~8% over seed 0 on most configurations. The ratio the
    # seed-1 searches found so far is 1.8 grid steps (x1.092: a bracket x1.065-x1.118 of an
    # estimate, grid 1.05); this one's answer is x1.15 its estimate. Started at the bottom of the
    # grid bracket x1.092 lies in (x1.05) it passed twice and missed: three runs. Started at the
    # nearest grid power (x1.1025): a pass and a miss.
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import drive

    lo = 4.0 * 1.05 ** 1.3
    first = RateSearch({"tp": 1}, small_config(), lo=lo, hi=lo * 1.05, estimate=4.0,
                       near_step=1.05, grid=1.05, tolerance=0.05, start=4.0)
    second = RateSearch({"tp": 2}, small_config(), estimate=2.0, near_step=1.05, grid=1.05,
                        tolerance=0.05)
    rates: list[float] = []

    def job(s, rate):
        rates.append(rate)
        return rate

    drive([first, second], lambda rate: {"rate": rate}, job, lambda row: row["rate"] <= 2.3,
          workers=1)
    assert rates == pytest.approx([2.205, 2.31525], rel=1e-5)
    assert second.lo == pytest.approx(2.205) and second.hi == pytest.approx(2.31525)


def test_a_recheck_two_steps_under_its_start_walks_down_without_overshooting() -> None:
    # A recheck starts near the shorter runs' answer with a step of the tolerance. Its answer two
    # steps under the start: two misses, then a pass one step lower settles it. A squared step
    # after the second miss put the pass 2.6 steps down (x1.1025) and a further pass climbed back:
    # four runs, two of them whole (a pass runs all its requests, a miss stops early).
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import drive

    s = RateSearch({"tp": 1}, small_config(), estimate=10.0, near_step=1.05, tolerance=0.05)
    rates: list[float] = []

    def job(_, rate):
        rates.append(rate)
        return rate

    drive([s], lambda rate: {"rate": rate}, job, lambda row: row["rate"] <= 9.2, workers=1)
    assert rates == pytest.approx([10.0, 10.0 / 1.05, 10.0 / 1.05 ** 2], rel=1e-5)
    assert s.lo == pytest.approx(10.0 / 1.05 ** 2) and (s.hi - s.lo) / s.hi <= 0.05
    # A seed (on a grid) and a cost-model start still square the step on the way down.
    far = RateSearch({"tp": 1}, small_config(), start=10.0, step=1.05, tolerance=0.05)
    rates.clear()
    drive([far], lambda rate: {"rate": rate}, job, lambda row: row["rate"] <= 9.2, workers=1)
    assert rates[:3] == pytest.approx([10.0, 10.0 / 1.05, 10.0 / 1.05 / 1.05 ** 2], rel=1e-5)


@pytest.mark.parametrize("step", [1.0205, 1.0351, 1.0526, 1.0801])
def test_a_seed_bracket_one_grid_step_wide_is_settled_whatever_the_six_digit_rounding(
        step: float) -> None:
    # Rates are run rounded to six digits; a seed's tolerance is one grid step (1 - 1/g) and
    # its bracket one step wide must be settled, not bisected once more just under its top.
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_band import seed_grid

    g, tol = seed_grid(step)
    unsettled = []
    for i in range(400):
        lo = float(f"{0.5 + i * 0.0371:.6g}")
        hi = float(f"{lo * g:.6g}")
        s = RateSearch({}, small_config(), lo=lo, hi=hi, tolerance=tol)
        if s.next_rate() is not None:
            unsettled.append((lo, hi))
    assert not unsettled, unsettled[:3]


def test_a_split_starts_at_its_neighbouring_splits_answer_when_that_is_higher() -> None:
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_disagg import neighbour_splits, split_of
    from twinserve.sim.search_driver import drive

    def split(p: int, d: int, **kw) -> RateSearch:
        return RateSearch({"tp": 1, "mode": f"disagg {p}P+{d}D"}, small_config(), **kw)

    def start(other: RateSearch) -> float:
        done = split(3, 5, lo=4.0, hi=4.2, estimate=5.0, tolerance=0.05)  # found x0.82 its estimate
        rates: list[float] = []

        def job(s, rate):
            if s is other:
                rates.append(rate)
            return rate

        drive([done, other], lambda rate: {"rate": rate}, job, lambda row: row["rate"] <= 4.1,
              workers=1)
        return rates[0]

    from twinserve.sim.search_driver import _START_UP

    # Its estimate x the calibration, put _START_UP above it (2.0 x 0.82 x 1.25), is under the
    # neighbour's answer: start there.
    assert start(split(4, 4, estimate=2.0)) == pytest.approx(4.0)
    # Over it: the estimate's start stands.
    assert start(split(2, 6, estimate=8.0)) == pytest.approx(
        8.0 * (4.0 * 4.2) ** 0.5 / 5.0 * _START_UP, rel=1e-5)
    # Not a neighbour (two replicas moved): the estimate's start.
    assert start(split(5, 3, estimate=2.0)) == pytest.approx(
        2.0 * (4.0 * 4.2) ** 0.5 / 5.0 * _START_UP, rel=1e-5)
    assert split_of({"mode": "disagg 12P+4D"}) == (12, 4) and split_of({"mode": "agg"}) is None
    assert not neighbour_splits({"tp": 1, "mode": "disagg 3P+5D"}, {"tp": 2, "mode": "disagg 4P+4D"})
    assert not neighbour_splits({"tp": 1, "mode": "disagg 3P+5D"}, {"tp": 1, "mode": "disagg 5P+3D"})
    assert not neighbour_splits({"tp": 1, "mode": "disagg 3P+5D"}, {"tp": 1, "mode": "agg"})


def test_extra_seeds_bisect_on_two_grid_steps_and_the_band_carries_that_width() -> None:
    import math as _m

    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_band import add_bands, seed_grid
    from twinserve.sim.search_driver import drive

    g, tol = seed_grid(1.05)
    # tol is 1 - 1/g and 0.1% over it (rates are rounded to six digits, sim.search_band.seed_grid)
    assert g == pytest.approx(1.05 ** 2) and tol == pytest.approx(1 - 1 / 1.05 ** 2, rel=2e-3)
    # A seed whose answer lies one coarse step above its start settles in two runs: a pass at
    # the start, a miss one coarse step up (a bracket of tol, not bisected on to 5%).
    s = RateSearch({"tp": 1}, small_config(), estimate=4.0, near_step=g, grid=g, tolerance=tol)
    rates: list[float] = []

    def job(_, rate):
        rates.append(rate)
        return rate

    drive([s], lambda r: {"rate": r}, job, lambda row: row["rate"] <= 4.3, workers=1)
    assert rates == pytest.approx([4.0, 4.0 * g], rel=1e-5)
    assert s.lo == pytest.approx(4.0) and (s.hi - s.lo) / s.hi <= tol
    # The band adds the seeds' own bracket width to their spread: three seeds on one value
    # give a band wider with 10% brackets than with the first length's 5%.

    def band(resolution: float) -> tuple[float, float]:
        a = RateSearch({"tp": 1}, small_config(), lo=4.0, hi=4.2, tolerance=0.05,
                       seeds=[(0, 4.0), (1, 4.0), (2, 4.0)], seed_resolution=resolution)
        row = {"model": "m", "hardware": "h", "usd_per_hour": 1.0, "usd_per_mtok": 1.0,
               "request_rate": 4.0, "max_rate": 4.0}
        add_bands([row], [a], small_config(), 0.0)
        return row["band_lo"], row["band_hi"]

    lo5, hi5 = band(0.0)
    lo10, hi10 = band(tol)
    assert lo10 < lo5 < 4.0 < hi5 < hi10
    half = 4.303 * 4.0 * tol / _m.sqrt(12) * _m.sqrt(1 + 1 / 3)
    assert (lo10, hi10) == pytest.approx((4.0 - half, 4.0 + half))


def test_a_split_starts_at_least_at_the_rate_a_neighbour_still_searching_has_passed() -> None:
    # Two workers: a neighbour split may be in the middle of its search when this one starts;
    # the highest rate it has passed is a floor of its answer, and so a start as good as a
    # finished neighbour's (a run below the answer runs whole, one above it stops early).
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import neighbour_answer

    def split(p: int, d: int, **kw) -> RateSearch:
        return RateSearch({"tp": 1, "mode": f"disagg {p}P+{d}D"}, small_config(), **kw)

    me = split(5, 3, estimate=2.0)
    climbing = split(4, 4, lo=5.5)          # passed 5.5, no miss yet
    assert neighbour_answer(me, [me, climbing]) == pytest.approx(5.5)
    assert neighbour_answer(me, [me, climbing, split(6, 2, lo=3.0, hi=3.2)]) == pytest.approx(5.5)
    assert neighbour_answer(me, [me, split(4, 4, hi=7.0)]) == 0.0  # only a miss: no floor
    assert neighbour_answer(me, [me, split(3, 5, lo=9.0)]) == 0.0  # not a neighbour


def test_every_extra_seed_is_searched_in_one_drive_each_calibrated_by_its_own_seed(
        monkeypatch) -> None:
    # Two workers idled on the last search of seed 1 before seed 2 began: the seeds now share
    # one drive, and a seed's start is placed by the answers of its own seed's searches only.
    from twinserve.sim import search_band
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import drive

    done1 = RateSearch({"tp": 1}, small_config(), lo=4.41, hi=4.52, estimate=4.0,
                       near_step=1.05, grid=1.05, tolerance=0.05, group=1)
    fresh2 = RateSearch({"tp": 2}, small_config(), estimate=2.0, near_step=1.05, grid=1.05,
                        tolerance=0.05, group=2)
    fresh1 = RateSearch({"tp": 3}, small_config(), estimate=2.0, near_step=1.05, grid=1.05,
                        tolerance=0.05, group=1)
    first: dict[int, float] = {}

    def job(s, rate):
        first.setdefault(id(s), rate)
        return rate

    drive([done1, fresh2, fresh1], lambda r: {"rate": r}, job, lambda row: row["rate"] <= 2.3,
          workers=1)
    assert first[id(fresh2)] == pytest.approx(2.0)  # no seed-2 answer yet: its estimate
    assert first[id(fresh1)] == pytest.approx(2.0 * 1.05 ** 2)  # seed 1 found x1.116: 2.25 steps

    calls: list[list[int]] = []

    def fake(searches, *a, **k):
        calls.append(sorted({s.group for s in searches}))
        for s in searches:
            s.lo, s.hi = s.estimate, s.estimate * 1.1
        return searches

    monkeypatch.setattr(search_band, "run_searches", fake)
    a = RateSearch({"tp": 1}, small_config(), lo=4.0, hi=4.2, first_hi=4.2, tolerance=0.05)
    a.lengths = [(100, 4.0)]
    search_band.search_seeds([a], {}, 2, None, False)
    assert calls == [[1, 2]] and [k for k, _ in a.seeds] == [0, 1, 2]


def test_an_extra_seed_passing_far_inside_its_slos_steps_one_grid_step_not_to_its_margins() -> None:
    # A seed's answer lies within a step or two of its start (the seed-0 answer's grid): its
    # margins (a secant through zero) overshoot there, and a miss far up left a bracket to
    # bisect back down in two more runs.
    from twinserve.sim.search import RateSearch

    slos = {"p99_ttft_s": 2.0, "p99_tpot_s": 0.1}
    seed = RateSearch({"tp": 1}, small_config(), estimate=4.0, near_step=1.1, grid=1.1,
                      step=1.1, tolerance=1 - 1 / 1.1, slos=slos)
    seed.record(4.0, {"p99_ttft_s": 1.0, "p99_tpot_s": 0.05}, True)
    assert seed.next_rate() == pytest.approx(4.4)
    # The first run length's search (no grid) still goes to its margins: 0.9 x 2 / 1 = x1.8.
    first = RateSearch({"tp": 1}, small_config(), step=1.2, slos=slos)
    first.record(4.0, {"p99_ttft_s": 1.0, "p99_tpot_s": 0.05}, True)
    assert first.next_rate() == pytest.approx(4.0 * 1.8)


SEARCH_ROW_CASES = {
    "cluster": {"rate": 8.0, "cluster.num_replicas": 2},
    "disaggregated": {"rate": 8.0, "cluster.num_replicas": 3, "cluster.num_prefill_replicas": 1},
    "idle replicas": {"rate": 2.0, "num_requests": 2, "cluster.num_replicas": 4},
    "closed loop": {"concurrency": 8, "think_time_s": 0.2, "warmup_requests": 10,
                    "cluster.num_replicas": 2},
}


@pytest.mark.parametrize("case", list(SEARCH_ROW_CASES))
def test_a_cluster_search_row_is_the_full_rows_values(case: str) -> None:
    # The search's cluster rows skip the per-replica and per-step tables: same row, to the bit.
    import math

    from twinserve.sim.search_run import cluster_search_row
    from twinserve.sim.study import cluster_point_result

    fields = {"num_requests": 60, "output_dist": "uniform", "output_min": 1, "output_max": 80,
              **SEARCH_ROW_CASES[case]}
    cfg = small_config(**fields)
    built, res = simulate_cluster(cfg)
    point = {"rate": fields.get("rate", 0.0)}
    full = cluster_point_result(cfg, built, res, point, itl=False).row
    lean = cluster_search_row(cfg, built, res, point)
    assert list(full) == list(lean)
    for k, v in full.items():
        w = lean[k]
        assert type(v) is type(w), k
        assert (v == w) or (isinstance(v, float) and math.isnan(v) and math.isnan(w)), k
    assert full["max_kv_usage"] > 0 and full["mfu"] > 0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 16), count=st.integers(4, 30), replicas=st.sampled_from([2, 3]),
       seed=st.integers(0, 5), blocks=st.sampled_from([0, 40, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), turns=st.sampled_from([1, 2]),
       system_prompts=st.sampled_from([0, 1, 3]))
def test_a_finished_prefill_requests_tokens_go_to_decode_uncopied_and_unchanged(
        n, count, replicas, seed, blocks, budget, turns, system_prompts) -> None:
    # DisaggregatedSimulation._finish hands the decode side the finished prefill request's own
    # token list (no copy), which the decode side's Request takes over (Request.owning) and
    # appends its tokens to: equivalent only if nothing changes the prefill request's tokens,
    # the list's first items, after it finished (prefix cache with shared prefixes and pending
    # chains, which read them; small pools: preemptions).
    from twinserve.sim.cluster_study import build_cluster

    cfg = _cached_config(n, count, replicas, True, seed, blocks, budget, turns, system_prompts)
    sim = build_cluster(cfg).simulation
    finished: dict[int, tuple[list[int], list[int]]] = {}
    delivered: list[list[int]] = []
    finish, to_decode = sim._finish, sim._to_decode

    def spy_finish(rep, rid):
        req = rep.live.get(rid)
        finish(rep, rid)
        if req is not None and rep.index < sim.num_prefill:
            finished[id(req.all_token_ids)] = (req.all_token_ids, list(req.all_token_ids))

    def spy_to_decode(item, tokens):
        delivered.append(tokens)
        to_decode(item, tokens)

    sim._finish, sim._to_decode = spy_finish, spy_to_decode
    sim.run()
    assert delivered
    for tokens in delivered:
        assert id(tokens) in finished  # the prefill request's own list
    assert all(lst[:len(snap)] == snap for lst, snap in finished.values())
    assert any(len(lst) > len(snap) for lst, snap in finished.values())  # the decode side's own tokens


def _records_and_steps(cfg) -> tuple:
    from twinserve.sim.build import build
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.study import is_cluster

    if is_cluster(cfg):
        sim = build_cluster(cfg).simulation
        res = sim.run()
        return res.total.records, [r.steps for r in res.replicas]
    res = build(cfg).simulation.run()
    return res.records, [res.steps]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 16), count=st.integers(4, 30), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), blocks=st.sampled_from([0, 40, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), turns=st.sampled_from([1, 2]),
       system_prompts=st.sampled_from([0, 1, 3]))
def test_requests_keeping_the_simulators_prompt_lists_give_the_copied_runs_figures(
        n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts) -> None:
    # The simulator hands each Request the prompt list it made, or a finished prefill request's
    # tokens, as its all_token_ids (Request.owning, no copy): every record and step equals a run
    # whose Requests copy it (prefix cache with shared prefixes, follow-up turns carrying history,
    # small pools: preemptions; one engine, clusters, disagg).
    from twinserve.core.request import Request

    cfg = _cached_config(n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts)
    owned = []
    owning = Request.__dict__["owning"]

    def spy(cls, rid, prompt, *a, **k):
        req = owning.__func__(cls, rid, prompt, *a, **k)
        owned.append(req.all_token_ids is prompt and req.prompt_token_ids == prompt[:len(prompt)])
        return req

    try:
        Request.owning = classmethod(spy)
        kept = _records_and_steps(cfg)
        Request.owning = classmethod(lambda cls, rid, prompt, *a, **k: cls(rid, prompt, *a, **k))
        copied = _records_and_steps(cfg)
    finally:
        Request.owning = owning
    assert owned and all(owned)
    assert kept == copied


class _TwoWorkersInOrder:
    """search_driver._Local's interface for two workers: jobs run at submission, and finish in
    the order they were submitted (the first of the two in flight lands first)."""

    def __init__(self, workers: int) -> None:
        self.pending: list[tuple[object, object]] = []

    def submit(self, fn, job):
        handle = object()
        self.pending.append((handle, fn(job)))
        return handle

    def wait(self, handles):
        return [self.pending.pop(0)]

    def close(self) -> None:
        pass


def test_with_two_workers_a_search_from_the_cost_model_waits_for_the_first_bracket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two workers, two configurations, no answer yet: the second started at once from its raw
    # estimate (one worker: from the first's answer; FP8 8x H200 question, emulated: 155 runs
    # against 146 when it waits). It waits for the first's bracket and starts calibrated by it.
    from twinserve.sim import search_driver
    from twinserve.sim.search import RateSearch
    from twinserve.sim.search_driver import _START_UP, drive

    monkeypatch.setattr(search_driver, "_Local", _TwoWorkersInOrder)
    first = RateSearch({"tp": 1}, small_config(), estimate=4.0, tolerance=0.05)
    second = RateSearch({"tp": 2}, small_config(), estimate=2.0, tolerance=0.05)
    answers = {id(first): 6.0, id(second): 3.0}  # both x1.5 their estimates
    seen: list[tuple[int, float, float, float]] = []  # (search, rate, first's lo and hi then)

    def job(s, rate):
        seen.append((id(s), rate, first.lo, first.hi))
        return id(s), rate

    drive([first, second], lambda j: {"s": j[0], "rate": j[1]}, job,
          lambda row: row["rate"] <= answers[row["s"]], workers=2)
    rate, lo, hi = next((r, lo, hi) for sid, r, lo, hi in seen if sid == id(second))
    assert lo > 0 and math.isfinite(hi)  # the first had its bracket when the second went out
    assert rate == pytest.approx(2.0 * math.sqrt(lo * hi) / 4.0 * _START_UP, rel=1e-5)
    assert first.lo <= 6.0 < first.hi and second.lo <= 3.0 < second.hi
    # Nothing waits when nothing could calibrate it: a lone search starts at once.
    lone = RateSearch({"tp": 4}, small_config(), estimate=1.0, tolerance=0.05)
    drive([lone], lambda j: {"s": j[0], "rate": j[1]}, lambda s, r: (id(s), r),
          lambda row: row["rate"] <= 1.2, workers=2)
    assert lone.lo <= 1.2 < lone.hi


def test_workload_lengths_match_the_built_study_and_follow_every_change() -> None:
    """The memoized lengths (the screen's and pick.json's ISL/OSL) are the means over every
    request a run of the study sends, for a random and a trace workload, and a change of seed,
    length or means gives that workload's, never an earlier configuration's. (Taken from a
    built study's workload before, they left out the first request: the run had drawn it.)"""
    from twinserve.sim.build import simulate
    from twinserve.sim.config import set_field
    from twinserve.sim.search_commands import workload_lengths

    def built(cfg):
        recs = simulate(cfg)[1].records
        return (round(sum(r.num_prompt_tokens for r in recs) / len(recs)),
                round(sum(r.num_output_tokens for r in recs) / len(recs)))

    cfg = small_config(**{"engine.hardware": "A100-80GB"})
    seen = set()
    variants = [{}, {"run.seed": 7}, {"workload.num_requests": 37},
                {"workload.prompt_mean": 333}, {"workload.output_mean": 55}]
    for change in variants:
        c = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload),
                                run=dataclasses.replace(cfg.run), explicit=set(cfg.explicit))
        for k, v in change.items():
            set_field(c, k, v)
        got = workload_lengths(c)
        assert got == built(c), change
        assert workload_lengths(c) == got  # the memo's answer, again
        seen.add(got)
    assert len(seen) >= 4  # the variants do draw other lengths: a stale memo would show here
    trace = small_config(**{"engine.hardware": "A100-80GB", "workload.trace": "builtin:azure_conv",
                            "workload.num_requests": 50})
    assert workload_lengths(trace) == built(trace)
