"""The printed report: a validity banner first, then the forecast table with its verdicts."""

from __future__ import annotations

import math
from typing import Any

from twinserve.backends.real.hostload import NOISY_SHARE
from twinserve.twin.calibrate import PROBE_DRIFT_WARN
from twinserve.twin.forecast import NOWCAST
from twinserve.twin.verdict import CONFIDENCE, NO_VERDICT, P99_MIN_REQUESTS, RUNS_SHOWN_MAX, UNDEFINED, UNRESOLVED


def banner(mismatch: list[str], host_loads: list[dict[str, Any] | None], num_requests: int,
           runs: int, kind: str, profile_lines: list[str] = ()) -> list[str]:
    """Lines saying what makes this verdict weaker than it looks (empty lines are not returned)."""
    out = [f"VALIDITY (--allow-profile-mismatch): {m.split('; ')[0]}" for m in mismatch]
    shares = [(h["other_share"] + h["steal_share"]) for h in host_loads if h]
    if shares and max(shares) > NOISY_SHARE:
        out.append(f"VALIDITY: other processes took up to {max(shares):.0%} of this run's CPUs "
                   f"(over {NOISY_SHARE:.0%}): the real runs are noisy; pin to a quiet core (taskset -c N)")
    nb = [h.get("neighbour_share") for h in host_loads if h and h.get("neighbour_share") is not None]
    if nb and max(nb) > 0.5:
        out.append(f"VALIDITY: the machine's other CPUs were up to {max(nb):.0%} busy (shared memory bus and cache)")
    if num_requests < P99_MIN_REQUESTS:
        out.append(f"VALIDITY: {num_requests} requests: p99 is reported without a verdict (needs {P99_MIN_REQUESTS})")
    if runs < 2:
        out.append("VALIDITY: one real run: no noise estimate, every cell UNRESOLVED (use --repeats 3)")
    out += list(profile_lines)
    out.append(f"judged: the {kind}, written to forecast.json before the engine served")
    return out


# A profile's own validity, and why each bound: calibration under other load times steps slow;
# probes far apart mean the machine's speed drifted during calibration; a large fit error means
# the coefficients do not describe the steps; a probe ratio far from 1 scales every price by one
# number, assuming the whole machine slowed alike. The load and probe bounds are those calibrate
# warns at (hostload.NOISY_SHARE, calibrate.PROBE_DRIFT_WARN): one profile, one verdict on it.
PROFILE_LOAD_MAX = NOISY_SHARE
PROBE_SPREAD_MAX = PROBE_DRIFT_WARN
FIT_MAPE_MAX = 0.15
PROBE_RATIO_BOUNDS = (0.8, 1.25)


def profile_validity(meta: dict[str, Any], ratio: float | None) -> list[str]:
    """Lines on the profile's calibration load, probe spread, fit error and probe ratio; WARN when out of bounds."""
    prov = meta.get("provenance") or {}
    host = prov.get("host_load")
    load = (host.get("other_share", 0.0) + host.get("steal_share", 0.0)) if isinstance(host, dict) else None
    probes = [float(s) for _, s in prov.get("speed_probes") or [] if s]
    spread = max(probes) / min(probes) - 1 if len(probes) > 1 and min(probes) > 0 else None
    mape = (meta.get("fit") or {}).get("mape")
    said = lambda x, fmt, none: none if x is None else fmt.format(x)  # noqa: E731
    out = [f"profile: {said(load, 'calibrated under {:.0%} other load', 'calibration load not recorded')}, "
           f"{said(spread, 'speed probes {:.0%} apart', 'speed probes not recorded')}, "
           f"{said(mape, 'fit error (MAPE) {:.0%}', 'fit error not recorded')}; probe ratio "
           f"{'not taken' if ratio is None else f'{ratio:.3f}'} (every step price is scaled by it)"]
    warn = []
    if load is not None and load >= PROFILE_LOAD_MAX:
        warn.append(f"calibration ran under {load:.0%} other load (at or over {PROFILE_LOAD_MAX:.0%}): its steps were "
                    "timed slow")
    if spread is not None and spread > PROBE_SPREAD_MAX:
        warn.append(f"its speed probes were {spread:.0%} apart (over {PROBE_SPREAD_MAX:.0%}): the machine's "
                    "speed drifted while it was calibrated")
    if mape is not None and mape > FIT_MAPE_MAX:
        warn.append(f"its fit error is {mape:.0%} (over {FIT_MAPE_MAX:.0%}): the profile does not describe "
                    "the steps it was fitted on")
    lo, hi = PROBE_RATIO_BOUNDS
    if ratio is not None and not lo <= ratio <= hi:
        warn.append(f"the probe ratio {ratio:.2f} is outside [{lo}, {hi}]: this machine runs at another speed "
                    "than at calibration, and one factor on every price assumes all steps slowed alike")
    return out + [f"VALIDITY WARNING (profile): {w}; recalibrate (twinserve calibrate) on a quiet core"
                  for w in warn]


def _ms(x: float | None, none: str = "-") -> str:
    return none if x is None or not math.isfinite(x) else f"{x * 1e3:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{math.expm1(x):+.1%}"


def _err(x: float | None) -> str:
    """A relative error as a signed percentage; n/a where it has no value (TPOT of one-token outputs)."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _undefined(c: dict[str, Any]) -> bool:
    """The cell's metric has no value at all on this workload (verdict.UNDEFINED)."""
    return c["state"] == NO_VERDICT and c.get("why") in UNDEFINED.values()


def excluded_line(cells: dict[str, dict[str, Any]]) -> str | None:
    """One line naming the metrics left out of the verdict for having no value, and why; None if none."""
    gone = [m for m, per in cells.items() if per and all(_undefined(c) for c in per.values())]
    if not gone:
        return None
    return (f"not judged: {', '.join(m.upper() for m in gone)} (n/a: every output is one token, so there is no "
            "time between tokens); the verdict counts the other metrics' cells")


def verdict_table(cells: dict[str, dict[str, Any]]) -> str:
    """The forecast against the runs, cell by cell (percent figures are exp(log figure) - 1)."""
    lines = ["| metric | pct | forecast ms | real ms (each run) | bias | run noise | 90% CI of bias | verdict "
             "| in 90% PI of a new run |", "|---|---|---|---|---|---|---|---|---|"]
    for m, per in cells.items():
        for q, c in per.items():
            ci = c.get("ci")
            state = c["state"]
            if state == UNRESOLVED and c.get("runs_to_resolve") and c["runs_to_resolve"] <= RUNS_SHOWN_MAX:
                state += f" ({c['runs_to_resolve']} runs would resolve)"
            elif state == UNRESOLVED and "ci" in c:  # runs_to_resolve searches up to the cap
                state += f" (over {RUNS_SHOWN_MAX} runs would resolve: the bias is near the band's edge)"
            elif state == NO_VERDICT and c.get("why"):
                state += f" ({c['why']})"
            na = "n/a" if _undefined(c) else "-"
            pi = c.get("pi_inside")
            loo = c.get("loo_forecast_inside")
            hw = c.get("pi_half_width")
            pi_s = "-" if pi is None else ("yes" if pi else "no") + (
                f" (+-{math.expm1(hw):.1%})" if hw is not None else "") + (
                f" (LOO {loo}/{c['runs']})" if loo is not None else "")
            noise = "-" if c.get("noise") is None else f"{c['noise']:.1%}"
            lines.append(f"| {m.upper()} | {q} | {_ms(c.get('forecast'), na)} | "
                         + " / ".join(_ms(v, na) for v in c.get("real", [])) + f" | {_pct(c.get('bias'))} | {noise} | "
                         + (f"{_pct(ci[0])} .. {_pct(ci[1])}" if ci else "-") + f" | {state} | {pi_s} |")
    return "\n".join(lines)


def summary_line(s: dict[str, int], pi: tuple[int, int]) -> str:
    """One line: the verdicts counted, and the always-measurable prediction-interval count."""
    return (f"verdict: {s['pass']} PASS, {s['fail']} FAIL, {s['unresolved']} UNRESOLVED of {s['cells']} cells "
            f"(+-5% at p50, +-10% at p90/p99, {CONFIDENCE:.0%} CI); forecast inside the {CONFIDENCE:.0%} prediction "
            f"interval of a new run (mean of the runs' logs +- t(n-1) s sqrt(1 + 1/n), half-widths in the table) "
            f"in {pi[0]} of {pi[1]} cells")


def pi_count(cells: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(cells whose forecast lies inside the runs' prediction interval, cells with one)."""
    flags = [c["pi_inside"] for per in cells.values() for c in per.values()
             if c.get("pi_inside") is not None and c["state"] != NO_VERDICT]
    return sum(flags), len(flags)


def forecast_table(pct: dict[str, dict[str, float | None]], kind: str) -> str:
    """The forecast alone (printed before the engine serves)."""
    lines = [f"{kind}:", "| metric | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|"]
    lines += [f"| {m.upper()} | " + " | ".join(_ms(v.get(q), "n/a") for q in ("p50", "p90", "p99")) + " |"
              for m, v in pct.items()]
    return "\n".join(lines)


def free_running_line(fr: dict[str, Any]) -> str:
    """Schedule drift against step pricing, at p50 (run 1)."""
    at = lambda e: ", ".join(f"{m.upper()} {_err(v['p50'])}" for m, v in e.items())  # noqa: E731
    return ("free running (simulator on its own clock, each step at its shape's measured duration, run 1; "
            f"{fr['steps_by_measured_shape']} steps by shape, {fr['steps_by_kind_ratio']} unseen shapes at the "
            f"profile's price x their kind's measured ratio): schedule drift at p50 {at(fr['schedule_drift'])}; "
            f"step pricing (forecast against it) at p50 {at(fr['step_pricing'])}")


def nowcast_line(nowcasts: list[dict[str, Any]], label: str = NOWCAST) -> str:
    """Each run priced at its own speed: p50 error per metric (n/a where the metric has no value)."""
    return f"{label}, never judged: p50 error per run " + "; ".join(
        ", ".join(f"{m.upper()} {_err(v)}" for m, v in n["err_p50"].items()) for n in nowcasts)
