"""SLO targets are inclusive: a request exactly at its target is within it (docs/test-audit.md)."""

from __future__ import annotations

import dataclasses

from twinserve.sim.metrics import requests_frame, steps_frame, summarize

from .helpers import run, small_config


def test_targets_set_at_the_worst_observed_latencies_are_attained_by_every_request() -> None:
    cfg = small_config(num_requests=40, rate=8.0)
    res = run(cfg)
    req, steps = requests_frame(res), steps_frame(res)
    done = req[req["finish_s"].notna()]
    assert len(done) == 40 and done["tpot_s"].notna().any()
    worst = dataclasses.replace(cfg.slo, ttft_s=float(done["ttft_s"].max()), tpot_s=float(done["tpot_s"].max()))
    s = summarize(res, req, steps, worst)
    assert s["slo_attainment"] == 1.0
    assert s["goodput"] == s["request_throughput"]
    # Any tighter and the worst request misses.
    tighter = dataclasses.replace(worst, ttft_s=worst.ttft_s * (1 - 1e-9))
    assert summarize(res, req, steps, tighter)["slo_attainment"] < 1.0
