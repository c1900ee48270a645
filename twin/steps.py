"""A run's steps, judged: the profile's price of each real step against its measured time."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from twinserve.backends.sim.fit import step_kind
from twinserve.twin.verifyfit import as_decode, is_pure_verify
from twinserve.backends.sim.fitted import (FEATURE_COLUMNS, RANGE_DIMS, FittedCostModel, dims_beyond,
                                           shape_measures)


def step_residuals(profile: Any, rows: Sequence[dict[str, Any]]) -> list[tuple[str, float, float, int]]:
    """(kind, measured s, predicted s, index) of every step that computed tokens, priced as the simulator
    prices it (wake cost included).
    """
    wake_after = getattr(profile, "wake_after", None)
    verify = getattr(profile, "prices_verify", False)
    wake: list[tuple[float, float]] = []
    prev_end = None
    out = []
    for i, r in enumerate(rows):
        start = r.get("start_s")
        if wake_after is not None and start is not None and prev_end is not None:
            idle = float(start) - prev_end - float(r.get("gap_s") or 0.0)
            if idle > 0.0:
                wake = wake_after(idle)[::-1]
        if start is not None:
            prev_end = float(start) + float(r["step_time_s"])
        if r["num_prefill_tokens"] + r["num_decode_seqs"] <= 0:
            continue
        measured = r["step_time_s"] + (r.get("gap_s") or 0.0)
        if measured <= 0:
            continue
        if verify and is_pure_verify(r):  # verify rows as decode rows, plus the term
            predicted = max(profile.step_time(*as_decode(r)) + profile.verify_time(
                int(r["num_spec_reqs"]), int(r["num_draft_tokens"])), 0.0)
        else:
            predicted = profile.step_time(*(r[c] for c in FEATURE_COLUMNS))
        if wake:
            f, e = wake.pop()
            predicted = predicted * f + e
        out.append((step_kind(r["num_prefill_tokens"], r["num_decode_seqs"]), measured, predicted, i))
    return out


def step_errors(profile: FittedCostModel, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step predicted vs measured error, and the busy-time error (total over total) overall and per kind."""
    res = step_residuals(profile, rows)
    if not res:
        return {"num_steps": 0}
    a = np.asarray([(p - m) / m for _, m, p, _ in res])
    busy: dict[str, list[float]] = {}
    for kind, m, p, _ in res:
        acc = busy.setdefault(kind, [0.0, 0.0])
        acc[0] += m
        acc[1] += p
    total_m, total_p = sum(v[0] for v in busy.values()), sum(v[1] for v in busy.values())
    out = {"num_steps": len(a), "median_err": float(np.median(a)),
           "mape": float(np.mean(np.abs(a))), "p90_abs_err": float(np.percentile(np.abs(a), 90)),
           "busy_err": total_p / total_m - 1,
           "busy_err_by_kind": {k: v[1] / v[0] - 1 for k, v in sorted(busy.items())}}
    beyond = _beyond_range(profile, rows, res)
    if beyond is not None:
        out["beyond_range"] = beyond
    return out


def _beyond_range(profile: FittedCostModel, rows: list[dict[str, Any]],
                  res: list[tuple[str, float, float, int]]) -> dict[str, Any] | None:
    """Share of steps and busy time priced beyond the profile's fitted shapes, and the errors inside and beyond."""
    top = profile.shape_range
    if not top:
        return None
    dims: dict[str, dict[str, float]] = {}
    acc = {"inside": [0, 0.0, 0.0], "beyond": [0, 0.0, 0.0]}  # steps, measured s, predicted s
    for _, m, p, i in res:
        measures = shape_measures(*(float(rows[i][c]) for c in FEATURE_COLUMNS))
        out = dims_beyond(top, measures)
        side = acc["beyond" if out else "inside"]
        side[0] += 1
        side[1] += m
        side[2] += p
        seen = dict(zip(RANGE_DIMS, measures))
        for d in out:
            e = dims.setdefault(d, {"steps": 0, "max_seen": 0.0, "max_fitted": top[d]})
            e["steps"] += 1
            e["max_seen"] = max(e["max_seen"], seen[d])
    busy = acc["inside"][1] + acc["beyond"][1]
    return {"steps_share": acc["beyond"][0] / len(res), "busy_share": acc["beyond"][1] / busy,
            **{f"busy_err_{k}": (v[2] / v[1] - 1 if v[1] else None) for k, v in acc.items()},
            "dims": dims}


def step_line(st: dict[str, Any], sep: str) -> str:
    """The report's line on predicted vs measured step times, or nothing without steps."""
    if not st.get("num_steps"):
        return ""
    line = (f"{sep}step times: {st['num_steps']} steps, predicted vs measured median "
            f"{st['median_err']:+.1%}, mean abs {st['mape']:.1%}")
    if "busy_err" in st:
        kinds = ", ".join(f"{k} {v:+.1%}" for k, v in st["busy_err_by_kind"].items())
        line += f"; busy time {st['busy_err']:+.1%} ({kinds})"
    b = st.get("beyond_range")
    if b and b["steps_share"]:
        dims = ", ".join(f"{d} up to {v['max_seen']:.4g} (fitted {v['max_fitted']:.4g})"
                         for d, v in b["dims"].items())
        line += (f"{sep}beyond the profile's fitted shapes: {b['steps_share']:.0%} of the steps, "
                 f"{b['busy_share']:.0%} of the busy time ({dims}); busy time there "
                 f"{b['busy_err_beyond']:+.1%}, inside {_pct(b['busy_err_inside'])}")
    return line


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"
