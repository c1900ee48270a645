"""The report's per-request plots come from the middle swept rate (docs/test-audit.md, round 2)."""

from __future__ import annotations

import pandas as pd

from twinserve.sim.report import representative_points
from twinserve.sim.study import PointResult


def _point(rate: float, hw: str) -> PointResult:
    return PointResult({"rate": rate, "hardware": hw}, pd.DataFrame({"ttft_s": [0.1]}), pd.DataFrame())


def test_a_rate_sweep_is_shown_at_its_middle_rate_for_every_configuration() -> None:
    pts = [_point(r, hw) for hw in ("A", "B") for r in (4.0, 1.0, 2.0, 8.0, 16.0)]
    chosen, caption = representative_points(pts, ["rate", "hardware"])
    assert [(p.row["hardware"], p.row["rate"]) for p in chosen] == [("A", 4.0), ("B", 4.0)]
    assert caption == "at rate = 4.0 req/s"
    # An even count takes the lower of the two middle rates; no rate axis keeps every point.
    chosen, _ = representative_points([_point(r, "A") for r in (1.0, 2.0, 3.0, 4.0)], ["rate"])
    assert [p.row["rate"] for p in chosen] == [2.0]
    assert len(representative_points(pts, ["hardware"])[0]) == 10
