"""The K-wave estimate of the benchmark's 10 N means (sim/validate_estimate.py) against full runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.validate import run_to_window, simulate_row, window_means
from twinserve.sim.validate_estimate import (ESTIMATE_MIN_CLIENTS, ESTIMATE_WAVES, FEWER_WAVES,
                                             FEWER_WAVES_MIN_CLIENTS, drain_study, estimate_waves, estimator_label,
                                             uses_estimate, wave_estimate)
from twinserve.sim.validate_rows import load_rows, row_study

AGG_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c16_tp8_ep1_270"


def _frame(values: list[list[float]]) -> pd.DataFrame:
    """Per-request rows, wave after wave in send order, TTFT = TPOT = E2E = the given value (s)."""
    v = [x for wave in values for x in wave]
    return pd.DataFrame({"arrival_s": np.arange(len(v), dtype=float), "request_id": np.arange(len(v)),
                         "ttft_s": v, "tpot_s": v, "e2e_s": v})


_vals = st.floats(0.001, 10.0, allow_nan=False)


@given(st.integers(1, 6), st.integers(1, 10), st.data())
def test_every_wave_simulated_is_the_full_mean_exactly(n: int, waves: int, data: st.DataObject) -> None:
    values = [data.draw(st.lists(_vals, min_size=n, max_size=n)) for _ in range(waves)]
    req = _frame(values).sample(frac=1.0, random_state=0)  # send order is read from arrival_s
    est = wave_estimate(req, n, waves, waves)
    assert est["ttft_ms"] == window_means(req, 0, n * waves)["ttft_ms"]
    assert est["n"] == n * waves


@given(st.integers(1, 6), st.integers(2, 5), st.integers(6, 12), st.data())
def test_unsimulated_waves_weigh_as_the_last_simulated_one(n: int, k: int, total: int,
                                                           data: st.DataObject) -> None:
    # Waves before K vary (the cold wave, the transition); from wave K - 1 on the loop repeats itself.
    head = [data.draw(st.lists(_vals, min_size=n, max_size=n)) for _ in range(k - 1)]
    steady = data.draw(st.lists(_vals, min_size=n, max_size=n))
    full = _frame(head + [steady] * (total - k + 1))
    est = wave_estimate(full.iloc[:k * n], n, total, k)  # only the first K waves simulated
    # Each of the total x N requests once, as the benchmark's mean counts them.
    assert est["tpot_ms"] == pytest.approx(full["tpot_s"].mean() * 1000, rel=1e-9)
    assert est["n"] == total * n
    # Averaging the last two waves is exact as well once both are steady.
    if k >= 3:
        two = _frame(head[:-1] + [steady] * (total - k + 2))
        assert wave_estimate(two.iloc[:k * n], n, total, k, tail=2)["ttft_ms"] == pytest.approx(
            two["ttft_s"].mean() * 1000, rel=1e-9)


@given(st.integers(1, 5), st.integers(2, 5), st.integers(7, 12), st.data())
def test_the_drain_wave_stands_for_the_last_wave(n: int, k: int, total: int, data: st.DataObject) -> None:
    head = [data.draw(st.lists(_vals, min_size=n, max_size=n)) for _ in range(k - 1)]
    steady, drain = (data.draw(st.lists(_vals, min_size=n, max_size=n)) for _ in range(2))
    full = _frame(head + [steady] * (total - k) + [drain])
    short = _frame(head + [steady, drain])  # K waves, then the drain run's last wave
    est = wave_estimate(short, n, total, k, drain=True)
    assert est["tpot_ms"] == pytest.approx(full["tpot_s"].mean() * 1000, rel=1e-9) and est["n"] == total * n
    # Read as a K + 1 wave run without the drain, the last wave would count total - K times.
    assert wave_estimate(full, n, total, total - 1, drain=True)["ttft_ms"] == full["ttft_s"].mean() * 1000


def test_counted_requests_weigh_not_missing_ones() -> None:
    # A request without a TPOT (one output token) is left out of the TPOT mean, as the benchmark does.
    req = _frame([[1.0, 3.0], [2.0, 2.0], [5.0, 5.0]])
    req.loc[0, "tpot_s"] = np.nan
    est = wave_estimate(req, 2, 4, 3)
    assert est["tpot_ms"] == pytest.approx((3 + 2 + 2 + 5 + 5 + 5 + 5) / 7 * 1000)
    assert est["ttft_ms"] == pytest.approx((1 + 3 + 2 + 2 + 5 * 4) / 8 * 1000)
    with pytest.raises(ValueError, match="6 requests simulated, 4 waves of 2 need 8"):
        wave_estimate(req, 2, 10, 4)
    with pytest.raises(ValueError, match="tail 4"):
        wave_estimate(req, 2, 10, 3, tail=4)


def test_switch() -> None:
    assert uses_estimate(ESTIMATE_MIN_CLIENTS, 10) and not uses_estimate(ESTIMATE_MIN_CLIENTS - 1, 10)
    assert not uses_estimate(10_000, FEWER_WAVES)  # K covers every wave: the full run
    assert not uses_estimate(100, ESTIMATE_WAVES)
    # Fewer waves from FEWER_WAVES_MIN_CLIENTS clients on; a K given by the caller wins.
    assert estimate_waves(FEWER_WAVES_MIN_CLIENTS - 1) == ESTIMATE_WAVES == 4
    assert estimate_waves(FEWER_WAVES_MIN_CLIENTS) == FEWER_WAVES == 3
    assert uses_estimate(10_000, ESTIMATE_WAVES, waves=3) and not uses_estimate(10_000, 5, waves=5)


_CACHE: dict[str, pd.DataFrame] = {}


def _small(n: int, isl: int, osl: int) -> pd.Series:
    pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")
    if "rows" not in _CACHE:
        _CACHE["rows"] = load_rows()
    rows = _CACHE["rows"]
    r = rows[rows["id"] == AGG_70B].iloc[0].copy()
    r["concurrency"], r["batch_size"], r["isl"], r["osl"] = n, n, isl, osl
    return r


@settings(max_examples=6, deadline=None)
@given(st.integers(2, 8), st.integers(200, 2000), st.integers(8, 64))
def test_closed_loop_estimate_equals_full_run_when_k_covers_it_and_is_close_otherwise(n: int, isl: int,
                                                                                      osl: int) -> None:
    cfg = row_study(_small(n, isl, osl), window="benchmark")
    req = run_to_window(cfg, 10 * n, stop_early=False)
    full = window_means(req, 0, 10 * n)
    assert wave_estimate(req, n, 10, 10) == full  # exact: every wave simulated
    # A run stopped after 3 waves gives those requests the full run's figures, so the estimate from it
    # is the estimate from the full table.
    short = run_to_window(cfg, 3 * n, stop_early=True)
    est = wave_estimate(short, n, 10, 3)
    assert est == wave_estimate(req, n, 10, 3)
    # Stated tolerance at these few clients (wave means of 2-8 random lengths are noisy; the drain
    # is not simulated): TPOT within 8%, TTFT within 30%. Weighing the cold wave 1 in 3 breaks TTFT.
    assert est["tpot_ms"] == pytest.approx(full["tpot_ms"], rel=0.08)
    assert est["ttft_ms"] == pytest.approx(full["ttft_ms"], rel=0.30)


def test_simulate_row_switches_to_the_estimate_at_many_clients() -> None:
    n = ESTIMATE_MIN_CLIENTS
    row = _small(n, 128, 8)
    est = simulate_row((row.to_dict(), "roofline", {"window": "benchmark"}))
    full = simulate_row((row.to_dict(), "roofline", {"window": "benchmark-full"}))
    assert est["estimator"] == estimator_label(ESTIMATE_WAVES) and full["estimator"] == "full"
    cfg = row_study(row, window="benchmark")
    req = run_to_window(cfg, 10 * n, stop_early=False)
    short = run_to_window(drain_study(cfg, n), (ESTIMATE_WAVES + 1) * n, stop_early=False)
    assert len(short) == (ESTIMATE_WAVES + 1) * n
    assert est["pred_ttft_engine_ms"] == wave_estimate(short, n, 10, ESTIMATE_WAVES, drain=True)["ttft_ms"]
    assert full["pred_ttft_engine_ms"] == pytest.approx(req["ttft_s"].mean() * 1000)
    assert est["measured_requests"] == full["measured_requests"] == 10 * n
    small = simulate_row((_small(4, 128, 8).to_dict(), "roofline", {"window": "benchmark"}))
    assert small["estimator"] == "full"


def test_rows_of_many_clients_simulate_fewer_waves_unless_told() -> None:
    n = FEWER_WAVES_MIN_CLIENTS
    row = _small(n, 64, 6).to_dict()
    auto = simulate_row((row, "roofline", {"window": "benchmark"}))
    four = simulate_row((row, "roofline", {"window": "benchmark", "waves": ESTIMATE_WAVES}))
    assert auto["estimator"] == estimator_label(FEWER_WAVES) and four["estimator"] == estimator_label(ESTIMATE_WAVES)
    cfg = row_study(pd.Series(row), window="benchmark")
    short = run_to_window(drain_study(cfg, n, FEWER_WAVES), (FEWER_WAVES + 1) * n, stop_early=False)
    assert len(short) == (FEWER_WAVES + 1) * n  # K = 3 and the drain wave: 4 waves, not 5
    assert auto["pred_ttft_engine_ms"] == wave_estimate(short, n, 10, FEWER_WAVES, drain=True)["ttft_ms"]
    assert auto["measured_requests"] == four["measured_requests"] == 10 * n  # each request still weighs once
