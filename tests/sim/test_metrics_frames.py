"""sim.metrics' shortcuts give pandas' own frames and summarize's own values, exactly."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from twinserve.sim.config import SLOConfig
from twinserve.sim.metrics import requests_frame, slo_row, steps_frame, summarize
from twinserve.sim.world import RequestRecord, RunResult, StepLog

from .helpers import run, small_config


def _from_lists(res: RunResult) -> pd.DataFrame:
    s = res.steps
    return pd.DataFrame({
        "start_s": s.start, "duration_s": s.duration, "num_in_system": s.in_system,
        "num_running": s.running, "num_waiting": s.waiting, "num_tokens": s.tokens,
        "batch_size": s.seqs, "kv_usage": s.kv_usage, "num_preempted": s.preempted})


def test_steps_frame_is_the_frame_pandas_makes_from_the_step_lists() -> None:
    # A speed change (numpy arrays first: pandas goes through object arrays): the frame,
    # dtypes included, must be the one built from the lists; an empty log keeps pandas' dtypes.
    res = run(small_config(num_requests=60))
    assert len(res.steps) > 100
    pd.testing.assert_frame_equal(steps_frame(res), _from_lists(res), check_exact=True)
    empty = RunResult([], StepLog(), 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0)
    pd.testing.assert_frame_equal(steps_frame(empty), _from_lists(empty), check_exact=True)


def test_slo_row_gives_summarize_values_on_a_hand_made_run() -> None:
    # A refused request (no times), a one-token one (no TPOT), and ITLs from token times.
    recs = [RequestRecord("a", 0.0, 10, 4, 0.5, 1.0, 1.6, 0, 0, [1.0, 1.1, 1.3, 1.6]),
            RequestRecord("b", 1.0, 20, 1, 1.0, 1.5, 1.5, 0, 0, [1.5]),
            RequestRecord("c", 2.0, 30, 0, None, None, None, 0, 0, [], finish_reason="refused"),
            RequestRecord("d", 2.0, 40, 2, 2.0, 2.2, 2.6, 0, 0, [2.2, 2.6])]
    res = RunResult(recs, StepLog(), 4.0, 1.0, 0, 0, 0, 0, 0, 0, 0)
    cols = [f"{s}_{m}_s" for s in ("mean", "p50", "p90", "p99")
            for m in ("ttft", "tpot", "e2e", "queue", "itl")]
    full = summarize(res, requests_frame(res), steps_frame(res), SLOConfig())
    lean = slo_row(res, cols)
    assert lean["refused"] == 1 and lean["completed"] == 3 and lean["num_requests"] == 4
    assert lean["p50_tpot_s"] == pytest.approx(0.3) and math.isclose(lean["mean_itl_s"], 1.0 / 4)
    for k in ["num_requests", "completed", "refused", "duration_s", "request_throughput",
              "output_throughput", "total_token_throughput", *cols]:
        assert lean[k] == full[k], k
    assert set(slo_row(res, ["p99_ttft_s"])) >= {"p99_ttft_s"} and \
        "p99_tpot_s" not in slo_row(res, ["p99_ttft_s"])
