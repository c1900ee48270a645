"""Run metrics on a hand-made run whose every figure is known (docs/test-audit.md, round 2).

TTFT counts from arrival (queueing included), TPOT over n - 1 gaps, ITL every gap within a request,
percentiles interpolated as numpy's default (vllm bench serve's), throughputs over completed
requests, and a one-token request judged by its TTFT alone (it has no TPOT).
"""

from __future__ import annotations

import math

import pytest

from twinserve.sim.config import SLOConfig
from twinserve.sim.metrics import requests_frame, steps_frame, summarize
from twinserve.sim.world import RequestRecord, RunResult, StepLog


def _run() -> RunResult:
    recs = [
        # Queued 0.5 s, first token at 1.0 s, then gaps 0.1, 0.2, 0.3.
        RequestRecord("a", 0.0, 10, 4, 0.5, 1.0, 1.6, 0, 0, [1.0, 1.1, 1.3, 1.6]),
        # One output token: no TPOT.
        RequestRecord("b", 1.0, 20, 1, 1.0, 1.5, 1.5, 0, 0, [1.5]),
        # Refused: never scheduled, never finished.
        RequestRecord("c", 2.0, 30, 0, None, None, None, 0, 0, [], finish_reason="refused"),
        RequestRecord("d", 2.0, 40, 2, 2.0, 2.2, 2.6, 0, 0, [2.2, 2.6]),
    ]
    return RunResult(recs, StepLog(), 4.0, 1.0, 0, 0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("pass_token_times", [False, True])
def test_latency_percentiles_and_throughputs_of_a_known_run(pass_token_times: bool) -> None:
    res = _run()
    req = requests_frame(res)
    tt = [r.token_times for r in res.records] if pass_token_times else None
    s = summarize(res, req, steps_frame(res), SLOConfig(ttft_s=1.0, tpot_s=0.3), token_times=tt)
    assert (s["num_requests"], s["completed"], s["refused"]) == (4, 3, 1)
    # TTFT from arrival: 1.0 (0.5 of it queueing), 0.5, 0.2.
    assert s["mean_ttft_s"] == pytest.approx((1.0 + 0.5 + 0.2) / 3)
    assert s["p50_ttft_s"] == pytest.approx(0.5)
    assert s["p90_ttft_s"] == pytest.approx(0.9)    # linear: 0.5 + 0.8 * (1.0 - 0.5)
    assert s["p99_ttft_s"] == pytest.approx(0.99)
    assert s["mean_tpot_s"] == pytest.approx((0.2 + 0.4) / 2)
    # ITL: 0.1, 0.2, 0.3 (a) and 0.4 (d); never a gap from one request's last token to another's first.
    assert s["mean_itl_s"] == pytest.approx(0.25)
    assert s["p50_itl_s"] == pytest.approx(0.25)
    assert s["p99_itl_s"] == pytest.approx(0.397)
    assert s["p50_e2e_s"] == pytest.approx(0.6)     # e2e 1.6, 0.5, 0.6
    # Rates over the run's 4 s, completed requests only (the refused one served nothing).
    assert s["request_throughput"] == pytest.approx(3 / 4)
    assert s["output_throughput"] == pytest.approx(7 / 4)
    assert s["total_token_throughput"] == pytest.approx((7 + 70) / 4)


def test_a_one_token_request_meets_the_slo_on_its_ttft_alone() -> None:
    res = _run()
    req = requests_frame(res)
    assert math.isnan(req.loc[req["request_id"] == "b", "tpot_s"].item())
    s = summarize(res, req, steps_frame(res), SLOConfig(ttft_s=1.0, tpot_s=0.3))
    # a: TTFT 1.0 <= 1.0, TPOT 0.2 <= 0.3: good; b: TTFT 0.5, no TPOT: good; d: TPOT 0.4: missed.
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["goodput"] == pytest.approx(2 / 4)
    # A TTFT target b misses: b is out, whatever its missing TPOT.
    s = summarize(res, req, steps_frame(res), SLOConfig(ttft_s=0.4, tpot_s=10.0))
    assert s["slo_attainment"] == pytest.approx(1 / 3)


def test_time_averages_count_idle_time_as_zero() -> None:
    # Busy 1 s of the 4 s run: 0.5 s at KV 0.4 with 2 sequences, 0.5 s at KV 0.8 with 4.
    res = _run()
    s = res.steps
    for start, kv, n in ((0.5, 0.4, 2), (1.0, 0.8, 4)):
        s.start.append(start)
        s.duration.append(0.5)
        s.in_system.append(n)
        s.running.append(n)
        s.waiting.append(1)
        s.tokens.append(n)
        s.seqs.append(n)
        s.kv_usage.append(kv)
        s.preempted.append(0)
    out = summarize(res, requests_frame(res), steps_frame(res), SLOConfig())
    assert out["mean_kv_usage"] == pytest.approx((0.5 * 0.4 + 0.5 * 0.8) / 4)
    assert out["mean_batch_size"] == pytest.approx((0.5 * 2 + 0.5 * 4) / 4)
    assert out["mean_queue_len"] == pytest.approx(1.0 / 4)
    assert out["max_kv_usage"] == pytest.approx(0.8)
