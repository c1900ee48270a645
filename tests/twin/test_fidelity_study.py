"""experiments/fidelity_study.py's closing line: the cells met, told apart by load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "fidelity_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("fidelity_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
