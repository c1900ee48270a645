"""`simulate search`: SLO parsing, the rate bracket, costs, the CLI, and failing points."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.sim import cli
from twinserve.sim.errors import ConfigError
from twinserve.sim.search import RateSearch, cheapest, meets, parse_slos, search_rates, summary_rows
from twinserve.sim.study import run_point

from .helpers import small_config

SLOS = {"p99_ttft_s": 2.0, "p99_tpot_s": 0.1}


def search_config(**fields):
    cfg = small_config(num_requests=80, prompt_dist="uniform", prompt_min=100, prompt_max=1500,
                       output_dist="uniform", output_min=20, output_max=300, **fields)
    cfg.search.start_rate = 2.0
    return cfg


def test_parse_slos_and_errors() -> None:
    assert parse_slos(["ttft_p99=2", "tpot_mean=0.05"]) == {"p99_ttft_s": 2.0,
                                                           "mean_tpot_s": 0.05}
    for bad in ("ttft=2", "latency_p99=1", "ttft_p99=fast", "ttft_p99=0", "ttft_p99"):
        with pytest.raises(ConfigError, match="--slo"):
            parse_slos([bad])


def test_meets_needs_every_request_and_every_limit() -> None:
    row = {"num_requests": 10, "completed": 10, "refused": 0, "p99_ttft_s": 1.0,
           "p99_tpot_s": 0.05}
    assert meets(row, SLOS)
    assert not meets(dict(row, p99_ttft_s=2.5), SLOS)
    assert not meets(dict(row, completed=9), SLOS)
    assert not meets(dict(row, p99_tpot_s=float("nan")), SLOS)


def test_bracket_converges_reuses_runs_and_brackets_the_truth() -> None:
    (s,) = search_rates(search_config(), {}, SLOS, workers=1, progress=False)
    assert s.status == "ok"
    assert 0 < s.lo < s.hi and (s.hi - s.lo) / s.hi <= 0.02
    assert s.runs[s.lo]["meets_slo"] and not s.runs[s.hi]["meets_slo"]
    assert len(s.runs) <= 14  # doubling then bisection, no rate simulated twice
    # The reported ends are real runs: simulating them again gives the same verdicts.
    for rate, ok in ((s.lo, True), (s.hi, False)):
        cfg = search_config(rate=rate)
        assert meets(run_point(cfg).row, SLOS) is ok


def test_costs_and_cheapest_for_a_target_rate() -> None:
    cfg = search_config()
    cfg.search.prices = {"A100-80GB": 2.0}
    a = RateSearch({"hardware": "A100-80GB"}, cfg, lo=4.0, hi=4.05)
    a.runs[4.0] = {"total_token_throughput": 4000.0, "output_throughput": 1000.0}
    h_cfg = search_config(hardware="H100-SXM", tensor_parallel_size=2)
    h = RateSearch({"hardware": "H100-SXM"}, h_cfg, lo=9.0, hi=9.1)
    h.runs[9.0] = {"total_token_throughput": 9000.0, "output_throughput": 2250.0}
    none = RateSearch({"hardware": "H200"}, search_config(hardware="H200"), lo=0.0, hi=0.01)
    rows = summary_rows([a, h, none], target_rate=20.0)
    assert rows[0]["usd_per_hour"] == 2.0  # the TOML price wins over the catalog's
    assert rows[0]["usd_per_mtok"] == pytest.approx(2.0 / (4000 * 3600) * 1e6)
    assert rows[1]["gpus"] == 2 and rows[1]["usd_per_hour"] == 2 * 3.0  # catalog price, 2 GPUs
    assert rows[0]["replicas_for_target"] == 5 and rows[1]["replicas_for_target"] == 3
    assert rows[2]["usd_per_mtok"] == math.inf and rows[2]["status"] == "no rate meets the SLOs"
    assert cheapest(rows, 20.0)["hardware"] == "A100-80GB"  # 5 x 2.0 < 3 x 6.0
    assert cheapest(rows)["hardware"] == "A100-80GB"


def test_rate_in_grid_is_refused() -> None:
    with pytest.raises(ConfigError, match="rate"):
        search_rates(search_config(), {"workload.rate": ["1", "2"]}, SLOS, progress=False)


def test_cli_search_writes_table_figure_and_lists_a_config_that_cannot_exist(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[engine]\nmodel = "Llama-2-7B"\nhardware = "A100-80GB"\n'
                 '[workload]\nprompt_dist = "uniform"\nprompt_min = 100\n'
                 'prompt_max = 1000\noutput_dist = "uniform"\noutput_min = 20\noutput_max = 200\n'
                 '[search]\nstart_rate = 4.0\ntarget_rate = 10.0\nrequests_per_run = 60\n'
                 'max_requests_per_run = 120\n[search.prices]\n"A100-80GB" = 1.5\n')
    out = tmp_path / "out"
    rc = cli.main(["search", "--config", str(f), "--slo", "ttft_p99=2", "--slo", "tpot_p99=0.1",
                   "--grid", "tensor_parallel_size=1,2,3", "--workers", "2", "--out", str(out)])
    capsys.readouterr()
    assert rc == 0  # an answer was found; TP 3 (cannot split Llama-2-7B's heads) is listed
    summary = (out / "summary.md").read_text()
    assert "does not fit: tensor_parallel_size=3" in summary and "does not divide" in summary
    table = pd.read_csv(out / "search.csv")
    assert list(table["tensor_parallel_size"]) == [1, 2, 3]
    assert (table.loc[:1, "max_rate"] > 0).all() and table.loc[2, "status"] == "does not fit"
    # Each answer was rechecked at twice the run length and says what it found.
    assert list(table.loc[:1, "num_requests"]) == [120, 120]
    assert table.loc[:1, "convergence"].str.contains("from 60 to 120 requests").all()
    assert table.loc[0, "usd_per_hour"] == 1.5
    runs = pd.read_csv(out / "search_runs.csv")
    assert set(runs["tensor_parallel_size"]) == {1, 2}
    assert (out / "figures" / "search.png").stat().st_size > 1000
    assert "cheapest" in (out / "summary.md").read_text()
    assert cli.main(["search", "--slo", "ttft=2", "--out", str(tmp_path / "x")]) == 2
    assert "--slo" in capsys.readouterr().err


def test_cluster_configuration_pays_for_every_replica() -> None:
    cfg = search_config(tensor_parallel_size=2, num_replicas=3)
    cfg.cluster.replicas = [{"engine.hardware": "H100-SXM"}]
    cfg.search.prices = {"A100-80GB": 2.0, "H100-SXM": 5.0}
    s = RateSearch({}, cfg, lo=1.0, hi=1.01)
    s.runs[1.0] = {"total_token_throughput": 1000.0, "output_throughput": 500.0}
    (row,) = summary_rows([s])
    assert row["gpus"] == 6 and row["usd_per_hour"] == 2 * 5.0 + 2 * 2 * 2.0


def _passed_at(rate: float, ttft: float, tpot: float) -> RateSearch:
    s = RateSearch({}, search_config(), slos=dict(SLOS), step=1.2)
    s.record(rate, {"p99_ttft_s": ttft, "p99_tpot_s": tpot}, True)
    return s


@pytest.mark.parametrize("ttft,tpot,expected", [
    (0.5, 0.06, 1.5),    # TPOT binds: 0.9 x 0.1 / 0.06, not TTFT's 2 / 0.5
    (0.5, 0.03, 2.0),    # margins of 3x are capped at 2x
    (1.9, 0.099, 1.2),   # little margin: the plain step
])
def test_a_pass_with_margins_places_the_next_rate_by_its_binding_slo(
        ttft: float, tpot: float, expected: float) -> None:
    assert _passed_at(1.0, ttft, tpot).next_rate() == pytest.approx(expected)


def test_two_passes_place_the_next_rate_at_their_lines_crossing_of_the_limit() -> None:
    from twinserve.sim import search

    s = _passed_at(1.0, 1.0, 0.01)
    s.record(1.1, {"p99_ttft_s": 1.5, "p99_tpot_s": 0.011}, True)
    # TTFT's line through (1.0, 1.0) and (1.1, 1.5) crosses 2 s at 1.2; TPOT's far above. The
    # squared step (1.1 x 1.44) and the one-pass margin (1.1 x 0.9 x 2 / 1.5) would both overshoot.
    rate = s.next_rate()
    assert rate is not None and 1.1 * 1.02 <= rate <= 1.2
    assert rate == pytest.approx(max(1.1 * 1.02, 1.2 * search._SECANT_AIM), rel=1e-5)
    # A statistic that did not rise between the passes says nothing of its crossing: read as
    # one pass (0.9 x limit / value), here TPOT's 0.9 x 0.1 / 0.0625 = 1.44.
    flat = _passed_at(1.0, 0.2, 0.0625)
    flat.record(1.1, {"p99_ttft_s": 0.2, "p99_tpot_s": 0.0625}, True)
    assert flat.next_rate() == pytest.approx(1.1 * 1.44, rel=1e-5)
    # A crossing within one tolerance of lo: the next rate is lo x (1 + tolerance), so that a
    # miss there settles the bracket.
    near = _passed_at(1.0, 1.0, 0.01)
    near.record(1.1, {"p99_ttft_s": 1.99, "p99_tpot_s": 0.011}, True)
    assert near.next_rate() == pytest.approx(1.1 * (1 + near.cfg.search.tolerance), rel=1e-5)


@given(st.floats(0.5, 50.0), st.floats(0.05, 0.9), st.floats(1.05, 3.0))
def test_margin_steps_keep_the_bracket_around_the_answer(answer: float, floor: float,
                                                         start: float) -> None:
    # Queue-like latency: flat at low load, unbounded at the answer's knee; pass iff within limits.
    s = RateSearch({}, search_config(), slos=dict(SLOS), start=answer / start)

    def row(rate: float) -> dict:
        q = rate / answer
        return {"p99_ttft_s": 2.0 * (floor + (1 - floor) * q ** 3) if q < 1 else math.inf,
                "p99_tpot_s": 0.1 * min(q, 1.0) ** 0.5 if q < 1 else math.inf}

    while (rate := s.next_rate()) is not None:
        r = row(rate)
        s.record(rate, r, meets(dict(r, completed=1, num_requests=1), SLOS))
    # The bracket means what it did: lo passed, hi failed, narrowed to the tolerance.
    assert s.lo < answer <= s.hi and (s.hi - s.lo) / s.hi <= s.cfg.search.tolerance
