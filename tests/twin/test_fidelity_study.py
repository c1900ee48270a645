"""experiments/fidelity_study.py: held-out seeds by default, and its table of verdicts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def study(experiment):
    return experiment("fidelity_study")


def _row(load: float, states: dict, pi: dict, summary: dict) -> dict:
    keys = [f"{m}_{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in ("p50", "p90", "p99")]
    return {"trace": "conv", "load": load, "rate": 0.5, "runs": 3, "summary": summary,
            "states": {k: states.get(k, "no verdict") for k in keys}, "bias": {k: 0.01 for k in keys},
            "pi_inside": {k: pi.get(k) for k in keys}, "other_cpu": 0.4, "schedule_equivalent": True}


def test_the_default_study_is_held_out_and_the_development_seeds_are_named(study) -> None:
    assert study.HELD_OUT_SEED not in study.DEVELOPMENT_SEEDS
    assert study.HELD_OUT_SEED + 2 not in study.DEVELOPMENT_SEEDS and study.HELD_OUT_OFFSET > 0
    assert "Development set: seeds (0, 1, 2)" in study.__doc__ or "seeds 0, 1, 2" in study.__doc__


def test_summary_table_counts_verdicts_and_prediction_intervals(study) -> None:
    rows = [_row(0.3, {"ttft_p50": "PASS", "e2e_p50": "FAIL"}, {"ttft_p50": True, "e2e_p50": False},
                 {"pass": 1, "fail": 1, "unresolved": 6, "cells": 8}),
            _row(1.3, {"ttft_p50": "UNRESOLVED"}, {"ttft_p50": True, "ttft_p99": True},
                 {"pass": 0, "fail": 0, "unresolved": 8, "cells": 8})]
    t = study.summary_table(rows)
    assert "| conv | 0.3 | 0.500 | 3 | PASS +0.01 |" in t and "| 1/1/6 | 1/2 | 40% | yes |" in t
    # p99 is not a column (too few requests in a study to judge it), so its PI flag is not counted.
    assert "over the study 1 PASS, 1 FAIL, 14 UNRESOLVED of 16 cells" in t and "in 2 of 3" in t
