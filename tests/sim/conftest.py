"""Fixtures shared by the simulator's tests."""

from __future__ import annotations

import pandas as pd
import pytest


@pytest.fixture(scope="session")
def rows() -> pd.DataFrame:
    """aiconfigurator-core's measured rows, read once for every validate test (needs the 'aic' extra)."""
    pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")
    from twinserve.sim.validate_rows import load_rows

    return load_rows()
