"""The search's per-GPU and per-token figures divide by the right counts (docs/test-audit.md, round 2)."""

from __future__ import annotations

import pytest

from twinserve.sim.search import RateSearch, summary_rows

from .test_search import search_config


def test_per_gpu_throughput_and_output_token_price_of_a_tp2_configuration() -> None:
    cfg = search_config(hardware="H100-SXM", tensor_parallel_size=2)
    cfg.search.prices = {"H100-SXM": 5.0}
    s = RateSearch({}, cfg, lo=9.0, hi=9.1)
    s.runs[9.0] = {"total_token_throughput": 9000.0, "output_throughput": 2250.0}
    (row,) = summary_rows([s])
    assert (row["gpus"], row["usd_per_hour"]) == (2, 10.0)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(4500.0)
    assert row["output_tokens_per_s_per_gpu"] == pytest.approx(1125.0)
    assert row["usd_per_mtok"] == pytest.approx(10.0 / (9000 * 3600) * 1e6)
    # Per output token: the hour's price over the output tokens alone (4x the all-token price here).
    assert row["usd_per_mtok_output"] == pytest.approx(10.0 / (2250 * 3600) * 1e6)


@pytest.mark.parametrize("field,size", [("pipeline_parallel_size", 2), ("data_parallel_size", 2)])
def test_every_gpu_of_a_replica_is_paid_for_pipeline_and_data_parallel_too(field: str, size: int) -> None:
    # A replica of TP 2 x PP 2 (or attention DP 2) runs on 4 GPUs: the study's MFU counts 4, so must the bill.
    cfg = search_config(hardware="H100-SXM", tensor_parallel_size=2, **{field: size})
    cfg.search.prices = {"H100-SXM": 5.0}
    s = RateSearch({}, cfg, lo=9.0, hi=9.1)
    s.runs[9.0] = {"total_token_throughput": 9000.0, "output_throughput": 2250.0}
    (row,) = summary_rows([s])
    assert (row["gpus"], row["usd_per_hour"]) == (4, 20.0)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(2250.0)


def test_the_cost_band_runs_from_the_band_tops_price_to_its_bottoms() -> None:
    from twinserve.sim.search_band import add_bands

    cfg = search_config(hardware="H100-SXM")
    cfg.search.prices = {"H100-SXM": 4.0}
    cfg.search.model_error = ""
    s = RateSearch({}, cfg, lo=10.0, hi=10.1)
    s.runs[10.0] = {"total_token_throughput": 10000.0, "output_throughput": 2000.0}
    s.seeds = [(0, 10.0), (1, 8.0), (2, 12.0)]
    rows = summary_rows([s], target_rate=100.0)
    add_bands(rows, [s], cfg, 100.0)
    (row,) = rows
    lo, hi = row["band_lo"], row["band_hi"]
    assert 0 < lo < 10.0 < hi
    best, worst = row["usd_per_mtok_band"]
    # Price per token is inverse to the rate served: the band's top rate is its best price.
    assert best == pytest.approx(row["usd_per_mtok"] * 10.0 / hi)
    assert worst == pytest.approx(row["usd_per_mtok"] * 10.0 / lo)
    assert best < row["usd_per_mtok"] < worst
    assert row["replicas_for_target"] == -(-100.0 // lo)
    assert row["usd_per_hour_band"] == (-(-100.0 // hi) * 4.0, -(-100.0 // lo) * 4.0)
