"""The prediction band: how far a real run may land from the simulator's prediction by noise alone.

A profile predicts a step's mean time; real steps scatter around it, and on a shared machine
the scatter is correlated in time (its speed drifts over seconds). The band is the spread of
the prediction over simulations that draw such noise: a log-normal factor per step whose log
follows an AR(1) series, with the spread per kind of step and the lag-1 correlation measured
on the run's own steps around each kind's own mean (so a bias of the profile, the mean, is
not noise and stays visible), plus one speed factor per run from the disagreement of the
speed probes around it. A run without a step log takes the spread from the calibration's
residuals, uncorrelated. Queueing amplifies all of it near saturation, so the band is wide
where small step-time errors move latencies most.

A real percentile inside the band is as close as any profile could be expected to get on
this machine at this load; one outside it is a bias of the model, which is what calibration
work should chase.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.fit import STEP_KINDS, step_kind
from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel
from twinserve.sim.world import RequestRecord
from twinserve.sim.workload import Workload

from twinserve.twin.compare import METRICS, PERCENTILES, compare
from twinserve.twin.speedtrace import run_simulation

# For a zero-mean normal error, E|x| = sigma * sqrt(2 / pi): the calibration reports the MAPE.
_MAPE_TO_SIGMA = math.sqrt(math.pi / 2)
# Fewer steps of a kind than this in a run: that kind's spread is the run's overall one.
_MIN_KIND_STEPS = 5
_MIN_RUN_STEPS = 20


def step_residuals(profile: Any, rows: Sequence[dict[str, Any]],
                   speed: Callable[[float, float, float], float] | None = None
                   ) -> list[tuple[str, float, float, int]]:
    """(kind, measured s, predicted s, index in rows) of every logged step that computed tokens,
    in order.

    The prediction is the simulator's: after the engine idled (the time since the previous
    step ended, less the step's own gap_s, in which requests were already waiting, and less
    the speed samples' time taken out of that gap, `sampler_pause_s`, see
    speedtrace.without_sample_pauses), the next steps carry the profile's wake cost; with
    `speed` ((start_s, prefill tokens, tokens) -> slowness, a sampled speed trace's `at`) each
    step's price is multiplied by the slowness at its start, as TracedExecutor does.
    """
    wake_after = getattr(profile, "wake_after", None)
    wake: list[tuple[float, float]] = []
    prev_end = None
    out = []
    for i, r in enumerate(rows):
        start = r.get("start_s")
        if wake_after is not None and start is not None and prev_end is not None:
            waited = float(r.get("gap_s") or 0.0) + float(r.get("sampler_pause_s") or 0.0)
            idle = float(start) - prev_end - waited
            if idle > 0.0:
                wake = wake_after(idle)[::-1]
        if start is not None:
            prev_end = float(start) + float(r["step_time_s"])
        if r["num_prefill_tokens"] + r["num_decode_seqs"] <= 0:
            continue
        measured = r["step_time_s"] + (r.get("gap_s") or 0.0)
        if measured <= 0:
            continue
        predicted = profile.step_time(*(r[c] for c in FEATURE_COLUMNS))
        if wake:
            f, e = wake.pop()
            predicted = predicted * f + e
        if speed is not None:  # the wake's extra scales with the machine too (time_scale)
            pt = r["num_prefill_tokens"]
            predicted *= speed(float(start), pt, pt + r["num_decode_seqs"])
        out.append((step_kind(r["num_prefill_tokens"], r["num_decode_seqs"]), measured, predicted, i))
    return out


@dataclass(slots=True)
class StepNoise:
    """Log-sd of a step's time per kind, the lag-1 correlation of its log, and the run speed's log-sd."""

    step_sigma: dict[str, float]
    speed_sigma: float = 0.0
    correlation: float = 0.0
    source: str = "calibration"

    @classmethod
    def for_run(cls, profile: FittedCostModel, speed: dict[str, Any] | None,
                rows: Sequence[dict[str, Any]] | None = None,
                trace: Callable[[float, float, float], float] | None = None) -> "StepNoise":
        """The noise of one run: from its step log when it has one, else from the calibration's fit.

        The probes before and after a run bracket its speed: half their log-ratio is taken as
        one standard deviation of the speed during it. With a sampled speed trace ((start_s,
        prefill tokens, tokens) -> slowness) the steps' spread is measured against the prices
        at the speed it sampled.
        """
        speed_sigma = 0.0
        sp = speed or {}
        before, after = sp.get("probe_before_s"), sp.get("probe_after_s")
        if before and after:
            speed_sigma = abs(math.log(before / after)) / 2
        res = [(k, m, p) for k, m, p, _ in step_residuals(profile, rows or [], trace) if p > 0]
        if len(res) >= _MIN_RUN_STEPS:
            sigma, phi = _measured_spread(res)
            return cls(sigma, speed_sigma, phi, "run")
        fit = profile.meta.get("fit") or {}
        overall = float(fit.get("mape") or 0.0)
        by_kind = fit.get("by_kind") or {}
        sigma = {k: _MAPE_TO_SIGMA * float((by_kind.get(k) or {}).get("mape", overall)) for k in STEP_KINDS}
        return cls(sigma, speed_sigma)

    def to_dict(self) -> dict[str, Any]:
        return {"step_sigma": dict(self.step_sigma), "speed_sigma": self.speed_sigma,
                "correlation": self.correlation, "source": self.source}


def _measured_spread(res: list[tuple[str, float, float]]) -> tuple[dict[str, float], float]:
    """Per-kind log-sd around each kind's own mean, and the lag-1 correlation of that series."""
    logs = np.log(np.asarray([m / p for _, m, p in res]))
    kinds = np.asarray([k for k, _, _ in res])
    centred = logs.copy()
    for k in STEP_KINDS:
        sel = kinds == k
        if sel.any():
            centred[sel] -= logs[sel].mean()
    overall = float(centred.std())
    sigma = {}
    for k in STEP_KINDS:
        sel = kinds == k
        sigma[k] = float(centred[sel].std()) if sel.sum() >= _MIN_KIND_STEPS else overall
    phi = float(np.corrcoef(centred[:-1], centred[1:])[0, 1]) if overall > 0 else 0.0
    if not math.isfinite(phi):
        phi = 0.0
    return sigma, min(max(phi, 0.0), 0.99)


class NoisyCostModel:
    """A profile whose steps draw mean-one log-normal factors (an AR(1) series); one speed factor per run.

    On purpose it breaks the cost-model rule that the same inputs give the same float, so a
    simulation with it must step (no fast-forward, which may price a window ahead).
    """

    def __init__(self, base: Any, noise: StepNoise, seed: int) -> None:
        self.base = base
        self.name = f"{getattr(base, 'name', 'cost')}+noise"
        self._rng = random.Random(seed)
        s = noise.speed_sigma
        self.speed = math.exp(self._rng.gauss(0.0, s) - s * s / 2) if s > 0 else 1.0
        self._sigma = noise.step_sigma
        self._phi = noise.correlation
        self._innov = math.sqrt(1.0 - self._phi * self._phi)
        self._z = self._rng.gauss(0.0, 1.0)  # the series' state: a standard normal at every step
        # The profile's cost of waking from idle, which the simulator's executor applies.
        self.wake_after = getattr(base, "wake_after", None)

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """The profile's time times the run's speed factor and this step's own factor."""
        t = self.base.step_time(num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn,
                                num_decode_seqs, decode_context) * self.speed
        z = self._z
        self._z = self._phi * z + self._innov * self._rng.gauss(0.0, 1.0)
        s = self._sigma.get(step_kind(num_prefill_tokens, num_decode_seqs), 0.0)
        return t * math.exp(s * z - s * s / 2) if s > 0 else t


def prediction_band(profile: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any,
                    real: Sequence[RequestRecord], noise: StepNoise, samples: int = 20,
                    level: float = 0.9, seed: int = 0, trace: Any = None) -> dict[str, Any]:
    """The central `level` range of each percentile (and throughput) over `samples` noisy runs.

    `profile` is the one judged (already speed-scaled, or priced along a sampled speed
    `trace`, speedtrace.SpeedTrace); each cell says whether the real value lies inside its
    range, and the range's half-width relative to its middle, which is the error no model
    could beat on this machine at this load.
    """
    if samples < 2:
        raise ValueError(f"a prediction band needs at least 2 samples, got {samples}")
    draws: dict[str, list[float]] = {}
    for k in range(samples):
        model = NoisyCostModel(profile, noise, seed=seed * 100_003 + k)
        recs = run_simulation(model, sched_cfg, make(), trace, fast_forward=False).records
        rep = compare(real, recs)
        for m in METRICS:
            for p in PERCENTILES:
                draws.setdefault(f"{m}.p{p}", []).append(rep["metrics"][m][f"p{p}"]["sim"])
        for t in ("output_tok_s", "request_s"):
            draws.setdefault(f"throughput.{t}", []).append(rep["throughput"][t]["sim"])
    real_rep = compare(real, real)
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    cells: dict[str, Any] = {}
    for key, vals in draws.items():
        group, name = key.split(".")
        rv = (real_rep["throughput"][name]["real"] if group == "throughput"
              else real_rep["metrics"][group][name]["real"])
        lo, hi = (float(np.percentile(vals, q)) for q in (lo_q, hi_q))
        mid = (lo + hi) / 2
        # None where the run has no real value (a recorded run without token times has no ITL).
        inside = None if math.isnan(rv) else bool(lo <= rv <= hi)
        cells.setdefault(group, {})[name] = {
            "lo": lo, "hi": hi, "real": rv, "inside": inside,
            "half_width": (hi - lo) / 2 / mid if mid else float("nan")}
    return {"samples": samples, "level": level, "noise": noise.to_dict(), "cells": cells}


def band_inside(band: dict[str, Any]) -> tuple[int, int]:
    """(cells holding the real value, cells with a real value to judge)."""
    judged = [c["inside"] for g in band["cells"].values() for c in g.values() if c["inside"] is not None]
    return sum(judged), len(judged)


def band_table(band: dict[str, Any]) -> str:
    """A markdown table of the band: range, real value, inside or not, per metric and percentile."""
    n = band["noise"]
    sig = ", ".join(f"{k} {v:.1%}" for k, v in n["step_sigma"].items())
    where = ("this run's steps around each kind's mean, lag-1 correlation "
             f"{n['correlation']:.2f}" if n["source"] == "run" else "the calibration's residuals")
    head = (f"prediction band ({band['level']:.0%} of {band['samples']} simulations; step noise from "
            f"{where} ({sig}); run speed noise {n['speed_sigma']:.1%} from the probes around it):")
    lines = [head, "", "| metric | " + " | ".join(f"p{p} band | p{p} real | ±" for p in PERCENTILES) + " |",
             "|---" * (1 + 3 * len(PERCENTILES)) + "|"]
    for m in METRICS:
        cells = [m]
        for p in PERCENTILES:
            c = band["cells"][m][f"p{p}"]
            mark = {True: "in", False: "OUT", None: "n/a"}[c["inside"]]
            cells += [f"{c['lo']:.4f}-{c['hi']:.4f}", f"{c['real']:.4f} {mark}", f"{c['half_width']:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    inside, total = band_inside(band)
    lines += ["", f"real inside the band: {inside} of {total} cells (throughput included)"]
    return "\n".join(lines)
