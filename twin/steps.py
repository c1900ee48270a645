"""A run's steps, judged: the machine speed they ran at, and the profile's error on each of them."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from twinserve.backends.sim.fitted import (FEATURE_COLUMNS, RANGE_DIMS, FittedCostModel, dims_beyond,
                                           shape_measures)

from twinserve.twin.band import step_residuals
from twinserve.twin.calibrate import ProbeParts


def speed_ratios(profile: FittedCostModel, probes: list[ProbeParts | None]) -> dict[str, float]:
    """The machine's speed during a run against calibration's: overall, and per probe part when
    the profile recorded its parts (decode and prefill drift apart on a shared machine)."""
    got = [p for p in probes if p is not None]
    prov = profile.meta.get("provenance", {})
    out = {"machine_speed_ratio": float(np.mean([p.total for p in got])) / prov["speed_probe_s"]}
    parts = prov.get("speed_probe_parts")
    if parts:
        out["machine_speed_ratio_decode"] = float(np.mean([p.decode_s for p in got])) / parts["decode_s"]
        out["machine_speed_ratio_prefill"] = float(np.mean([p.prefill_s for p in got])) / parts["prefill_s"]
    return out


def scaled_profile(profile: FittedCostModel, speed: dict[str, Any], by_part: bool = False) -> FittedCostModel:
    """The profile priced at a run's measured speed: overall, or per probe part when asked and measured."""
    d, p = speed.get("machine_speed_ratio_decode"), speed.get("machine_speed_ratio_prefill")
    if by_part and d and p:
        return dataclasses.replace(profile, time_scale=d, prefill_scale=p / d)
    return dataclasses.replace(profile, time_scale=speed["machine_speed_ratio"], prefill_scale=1.0)


def step_errors(profile: FittedCostModel, rows: list[dict[str, Any]],
                speed: Callable[[float, float, float], float] | None = None) -> dict[str, Any]:
    """Predicted vs measured time of every real step that computed tokens.

    Besides the per-step errors, the busy-time error (total predicted over total measured)
    overall and per kind: long steps weigh as much as they last, which is what latencies feel.
    With `speed` ((start_s, prefill tokens, tokens) -> slowness, a sampled speed trace's `at`)
    each step is priced at the speed sampled at its start.
    """
    res = step_residuals(profile, rows, speed)
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
    quarters = _by_quarter(rows, res)
    if quarters is not None:
        out["busy_err_by_quarter"] = quarters
    beyond = _beyond_range(profile, rows, res)
    if beyond is not None:
        out["beyond_range"] = beyond
    return out


def _by_quarter(rows: list[dict[str, Any]], res: list[tuple[str, float, float, int]]) -> list[float] | None:
    """The busy-time error in each quarter of the run's steps (by start time), or None without
    start times or with fewer than 8 steps. On a steady machine and a steady workload the
    quarters agree; quarters apart by more than the kinds' mix explains are the machine's
    speed moving during the run, which no probe before and after it can see."""
    if len(res) < 8 or any(rows[i].get("start_s") is None for *_, i in res):
        return None
    order = sorted(range(len(res)), key=lambda j: float(rows[res[j][3]]["start_s"]))
    out = []
    for k in range(4):
        part = [res[j] for j in order[k * len(order) // 4:(k + 1) * len(order) // 4]]
        out.append(sum(p for _, _, p, _ in part) / sum(m for _, m, _, _ in part) - 1)
    return out


def _beyond_range(profile: FittedCostModel, rows: list[dict[str, Any]],
                  res: list[tuple[str, float, float, int]]) -> dict[str, Any] | None:
    """How much of the run the profile priced beyond the shapes it was fitted on, and its error there.

    None when the profile does not record its range (made by hand, or before it was recorded).
    Otherwise: the share of the steps and of the busy time beyond it, the busy-time error
    inside and beyond, and per measure the steps beyond and the largest value seen against the
    largest fitted.
    """
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
    if st.get("busy_err_by_quarter"):
        line += ("; by quarter of the run " + " / ".join(f"{x:+.1%}" for x in st["busy_err_by_quarter"]))
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
