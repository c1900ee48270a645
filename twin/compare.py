"""Measured vs predicted: latency percentiles, per-request errors, throughput."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from twinserve.sim.world import RequestRecord

METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)


def per_request(records: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """request id -> {ttft, tpot, itl (mean), e2e} for finished requests."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if r.finish_time is None or r.first_token_time is None:
            continue
        n = r.num_output_tokens
        tt = r.token_times
        gaps = [b - a for a, b in zip(tt, tt[1:])]
        out[r.request_id] = {
            "ttft": r.first_token_time - r.arrival_time,
            "tpot": (r.finish_time - r.first_token_time) / (n - 1) if n > 1 else float("nan"),
            "itl": float(np.mean(gaps)) if gaps else float("nan"),
            "e2e": r.finish_time - r.arrival_time,
        }
    return out


def measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records the figures count: all but a closed loop's warm-up requests."""
    return [r for r in records if not r.warmup]


def pooled(records: Sequence[RequestRecord], metric: str) -> np.ndarray:
    """Every value of metric over the measured requests (ITL: every gap between two tokens)."""
    records = measured(records)
    if metric == "itl":
        vals = [b - a for r in records if r.finish_time is not None
                for a, b in zip(r.token_times, r.token_times[1:])]
        return np.asarray(vals, dtype=float)
    vals = [v[metric] for v in per_request(records).values()]
    arr = np.asarray(vals, dtype=float)
    return arr[~np.isnan(arr)]


def _throughput(records: Sequence[RequestRecord]) -> dict[str, float]:
    # Over the measured window: first measured send to last measured finish (sim.metrics's).
    records = measured(records)
    done = [r for r in records if r.finish_time is not None]
    if not done:
        return {"output_tok_s": float("nan"), "request_s": float("nan"), "duration_s": 0.0}
    start = min(r.arrival_time for r in records)
    end = max(r.finish_time for r in done)
    dur = end - start
    return {"output_tok_s": sum(r.num_output_tokens for r in done) / dur,
            "request_s": len(done) / dur, "duration_s": dur}


def _err(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def compare(real: Sequence[RequestRecord], sim: Sequence[RequestRecord]) -> dict[str, Any]:
    """The fidelity.json 'metrics' and 'throughput' sections."""
    out: dict[str, Any] = {"metrics": {}}
    for m in METRICS:
        r_vals, s_vals = pooled(real, m), pooled(sim, m)
        entry: dict[str, Any] = {}
        for p in PERCENTILES:
            rv = float(np.percentile(r_vals, p)) if len(r_vals) else float("nan")
            sv = float(np.percentile(s_vals, p)) if len(s_vals) else float("nan")
            entry[f"p{p}"] = {"real": rv, "sim": sv, "err": _err(sv, rv)}
        out["metrics"][m] = entry
    rt, st = _throughput(real), _throughput(sim)
    out["throughput"] = {k: {"real": rt[k], "sim": st[k], "err": _err(st[k], rt[k])}
                         for k in ("output_tok_s", "request_s")}
    return out
