"""The forecast judged against repeated real runs: a noise-aware verdict per cell.

On the log scale, bias b = ln(forecast) - mean ln(real_i) with a 90% Student-t interval over N
runs: PASS inside [ln(1 - tol), ln(1 + tol)], FAIL wholly outside, else UNRESOLVED (with the runs
that would resolve it). Also reported: whether the forecast lies in a new run's prediction interval.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from scipy import stats

# Issue 9's targets; p90 judged as p99 is.
TOLERANCE = {"p50": 0.05, "p90": 0.10, "p99": 0.10}
# p99 of fewer requests is a handful of values: reported, never judged.
P99_MIN_REQUESTS = 300
CONFIDENCE = 0.90
PASS, FAIL, UNRESOLVED, NO_VERDICT = "PASS", "FAIL", "UNRESOLVED", "no verdict"
# The most runs the report names as resolving a cell (the search stops there): a cell that needs more
# has its bias so near the band's edge that more runs are not the answer (runs_to_resolve: None).
RUNS_SHOWN_MAX = 30
# Leave-one-out counts need at least this many runs (of 2, each left-out PI rests on one run).
LOO_MIN_RUNS = 4


def _t(df: int) -> float:
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def _state(lo: float, hi: float, band: tuple[float, float]) -> str:
    if band[0] <= lo and hi <= band[1]:
        return PASS
    if hi < band[0] or lo > band[1]:
        return FAIL
    return UNRESOLVED


def runs_to_resolve(b: float, s: float, tol: float, most: int = RUNS_SHOWN_MAX) -> int | None:
    """The fewest runs, up to `most`, whose 90% interval of b (at this b and s) is PASS or FAIL; None if more."""
    band = (math.log1p(-tol), math.log1p(tol))
    if s == 0.0:
        return 2 if _state(b, b, band) != UNRESOLVED else None
    for n in range(2, most + 1):
        half = _t(n - 1) * s / math.sqrt(n)
        if _state(b - half, b + half, band) != UNRESOLVED:
            return n
    return None


def pi_half_width(sample: np.ndarray) -> float | None:
    """Half-width (log scale) of the 90% prediction interval of a new run: t(n-1) s sqrt(1 + 1/n)."""
    n = len(sample)
    if n < 2:
        return None
    return _t(n - 1) * float(np.std(sample, ddof=1)) * math.sqrt(1 + 1 / n)


def _pi_inside(value: float, sample: np.ndarray) -> bool | None:
    half = pi_half_width(sample)
    return None if half is None else bool(abs(value - float(np.mean(sample))) <= half)


def _value(v: float | None) -> float:
    return math.nan if v is None else float(v)


def judge_cell(forecast: float | None, reals: Sequence[float | None], tol: float,
               undefined: str = "no value to judge") -> dict[str, Any]:
    """The verdict of one cell: the forecast against the runs' values (seconds, all > 0; None/NaN: no value)."""
    forecast = _value(forecast)
    vals = [_value(v) for v in reals]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(np.asarray(vals, dtype=float))
    n = len(x)
    out: dict[str, Any] = {"runs": n, "tolerance": tol, "forecast": _finite(forecast),
                           "real": [_finite(v) for v in vals]}
    if not (forecast > 0 and n and np.all(np.isfinite(x))):
        return {**out, "state": NO_VERDICT, "why": undefined}
    b = math.log(forecast) - float(np.mean(x))
    out["bias"] = b
    if n < 2:
        return {**out, "state": UNRESOLVED, "why": "one run has no noise estimate",
                "runs_to_resolve": None, "pi_inside": None}
    s = float(np.std(x, ddof=1))
    half = _t(n - 1) * s / math.sqrt(n)
    band = (math.log1p(-tol), math.log1p(tol))
    state = _state(b - half, b + half, band)
    loo = [(_pi_inside(float(x[j]), np.delete(x, j)), _pi_inside(math.log(forecast), np.delete(x, j)))
           for j in range(n)] if n >= LOO_MIN_RUNS else []
    out.update(noise=s, ci=[b - half, b + half], state=state, pi_inside=_pi_inside(math.log(forecast), x),
               pi_half_width=pi_half_width(x),
               loo_real_inside=sum(bool(r) for r, _ in loo) if loo else None,
               loo_forecast_inside=sum(bool(f) for _, f in loo) if loo else None)
    if state == UNRESOLVED:
        out["runs_to_resolve"] = runs_to_resolve(b, s, tol)
    return out


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


# Why a metric can have no value at all: every output one token leaves no gap between tokens.
UNDEFINED = {"tpot": "TPOT undefined: every output is one token (no time between tokens)",
             "itl": "ITL undefined: every output is one token (no gap between tokens)"}


def judge(forecast: dict[str, dict[str, float | None]], runs: list[dict[str, dict[str, float | None]]],
          num_requests: int, metrics: Sequence[str] = ("ttft", "tpot", "itl", "e2e")) -> dict[str, Any]:
    """Every cell: forecast[m][q] against runs[i][m][q]; p99 only judged with enough requests."""
    cells: dict[str, dict[str, Any]] = {}
    for m in metrics:
        for q, tol in TOLERANCE.items():
            cell = judge_cell(forecast[m][q], [r[m][q] for r in runs], tol,
                              UNDEFINED.get(m, "no value to judge"))
            if q == "p99" and num_requests < P99_MIN_REQUESTS and cell["state"] != NO_VERDICT:
                cell = {**cell, "state": NO_VERDICT,
                        "why": f"{num_requests} requests: p99 needs {P99_MIN_REQUESTS}"}
            cells.setdefault(m, {})[q] = cell
    return {"cells": cells, "summary": summary(cells)}


def summary(cells: dict[str, dict[str, Any]]) -> dict[str, int]:
    """{"pass", "fail", "unresolved", "cells"}: cells with a verdict, by state."""
    flat = [c["state"] for per in cells.values() for c in per.values() if c["state"] != NO_VERDICT]
    return {"pass": flat.count(PASS), "fail": flat.count(FAIL), "unresolved": flat.count(UNRESOLVED),
            "cells": len(flat)}
