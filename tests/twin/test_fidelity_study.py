"""experiments/fidelity_study.py's summary: the cells met, told apart by load, and a repeated study's lines."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def study(experiment):
    return experiment("fidelity_study")


def _row(load: float, met: str, own: str | None, exact: bool = True) -> dict:
    return {"load": load, "targets": met, "targets_own_speed": own, "replay_exact": exact}


def test_met_summary_counts_cells_below_and_past_saturation(study) -> None:
    rows = [_row(0.3, "6/6", "5/6"), _row(0.8, "3/6", "4/6"), _row(1.3, "1/6", "2/6", exact=False),
            _row(0.3, "5/6", "6/6"), _row(0.8, "4/6", "4/6"), _row(1.3, "2/6", "3/6")]
    assert study.met_summary(rows) == ("targets met: 21 of 36 cells (below saturation 18 of 24, at or past "
                                       "it 3 of 12); at each run's own speed 24 of 36; replay exact in 5 of 6 runs")


def test_met_summary_without_both_halves_or_own_speed(study) -> None:
    rows = [_row(0.8, "4/6", None), _row(0.8, "2/6", None)]
    assert study.met_summary(rows) == "targets met: 6 of 12 cells; replay exact in 2 of 2 runs"


def _full_row(trace: str, load: float, met: str, repeated: bool) -> dict:
    """A row as fidelity_study.main builds it, with --repeats 2 when repeated."""
    cols = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99")
    row = {"trace": trace, "load": load, "rate": 0.5, **{c: 0.01 for c in cols}, "throughput": 0.0,
           "step_median": 0.0, "busy": -0.02, "replay_exact": True, "e2e_p50_band": 0.05, "band_inside": "14/14",
           "beyond_fit": None, "targets": met, "within_spread": 6 if repeated else None,
           "targets_own_speed": met, "speed_precision": 0.02, "neighbours": 0.0, "speed_from": "samples"}
    if repeated:
        row.update({f"pooled_{c}": 0.02 for c in cols} | {f"real2_{c}": -0.3 for c in cols})
        row.update(speeds=[None, None], sampled=[0.95, 1.05], busy_runs=[-0.02, 0.04],
                   sim_met_runs=[5, 3], real2_met=1)
    return row


def test_summary_table_of_a_repeated_study(study) -> None:
    # Each row carries the first run's busy-time error and one per run: a list in the main
    # table's column was the crash at the end of a 44-minute --repeats study.
    rows = [_full_row("conv", 0.3, "4/6", True), _full_row("conv", 1.3, "2/6", True)]
    text = study.summary_table(rows, repeats=2)
    assert "| -2.0% | yes |" in text
    assert "| -2.0%, +4.0% | 5/6, 3/6 | 1/6 |" in text
    assert text.endswith("per real run, the simulator met 10, 6 of 12 cells; "
                         "real run 2 as a prediction of run 1 met 2 of 12")


def test_summary_table_of_a_single_run_study_has_no_repeat_lines(study) -> None:
    text = study.summary_table([_full_row("code", 0.8, "6/6", False)])
    assert "real run 2" not in text and text.endswith("replay exact in 1 of 1 runs")


def test_cells_met_counts_each_metric_at_its_percentiles_limit(study) -> None:
    err = {"ttft": {"p50": 0.05, "p99": -0.11}, "tpot": {"p50": -0.051, "p99": 0.1},
           "e2e": {"p50": 0.0, "p99": 0.2}}
    assert study.cells_met(err) == 3
