"""Every study file under experiments/ (the README's commands use them) validates and builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.sim.config import load_config
from twinserve.sim.study import check_points

STUDIES = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.toml"))


def test_there_are_example_studies() -> None:
    assert len(STUDIES) >= 3


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_example_study_validates_and_builds(path: Path) -> None:
    cfg = load_config(path)  # raises a ConfigError naming file, line and field
    # what `simulate run/sweep` checks before running anything (the model's context included)
    assert check_points([({}, cfg)]) == [({}, cfg)]
