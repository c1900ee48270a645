"""The prediction band: how far a real run may land from the simulator's prediction by noise alone.

A profile predicts a step's mean time; a real step scatters around it (the calibration's own
residuals say by how much, per kind of step), and a shared machine's speed drifts during a
run (the speed probes before and after it say by how much). The band is the spread of the
prediction over simulations that draw both noises: per-step log-normal factors with the
calibration's spread, and one speed factor per run. Queueing amplifies both near
saturation, so the band is wide where small step-time errors move latencies most.

A real percentile inside the band is as close as this profile, on this machine, can be
expected to get; one outside it is a bias of the model (or a machine that behaved unlike
its probes), which is what calibration work should chase.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.core.engine_core import EngineCore
from twinserve.sim.world import RequestRecord, Simulation
from twinserve.sim.workload import Workload

from .compare import METRICS, PERCENTILES, compare

# For a zero-mean normal error, E|x| = sigma * sqrt(2 / pi): the calibration reports the MAPE.
_MAPE_TO_SIGMA = math.sqrt(math.pi / 2)
KINDS = ("prefill", "decode", "mixed")


def step_kind(num_prefill_tokens: float, num_decode_seqs: float) -> str:
    """The calibration's name for a step's kind."""
    if num_prefill_tokens <= 0:
        return "decode"
    return "prefill" if num_decode_seqs <= 0 else "mixed"


@dataclass(slots=True)
class StepNoise:
    """Log-standard deviations of a step's time around the profile, and of the run's speed."""

    step_sigma: dict[str, float]
    speed_sigma: float = 0.0

    @classmethod
    def for_run(cls, profile: FittedCostModel, speed: dict[str, Any] | None) -> "StepNoise":
        """Per-kind spread from the profile's fit diagnostics; speed spread from the run's probes.

        The probes before and after a run bracket its speed: half their log-ratio is taken as
        one standard deviation of the speed during it. A profile without fit diagnostics (hand
        made) gives zero step noise.
        """
        fit = profile.meta.get("fit") or {}
        overall = float(fit.get("mape") or 0.0)
        by_kind = fit.get("by_kind") or {}
        sigma = {k: _MAPE_TO_SIGMA * float((by_kind.get(k) or {}).get("mape", overall)) for k in KINDS}
        speed_sigma = 0.0
        sp = speed or {}
        before, after = sp.get("probe_before_s"), sp.get("probe_after_s")
        if before and after:
            speed_sigma = abs(math.log(before / after)) / 2
        return cls(sigma, speed_sigma)

    def to_dict(self) -> dict[str, Any]:
        return {"step_sigma": dict(self.step_sigma), "speed_sigma": self.speed_sigma}


class NoisyCostModel:
    """A profile whose every step draws a mean-one log-normal factor; one speed factor per run.

    On purpose it breaks the cost-model rule that the same inputs give the same float, so a
    simulation with it must step (no fast-forward, which may price a window ahead).
    """

    def __init__(self, base: FittedCostModel, noise: StepNoise, seed: int) -> None:
        self.base = base
        self.name = f"{base.name}+noise"
        self._rng = random.Random(seed)
        s = noise.speed_sigma
        self.speed = math.exp(self._rng.gauss(0.0, s) - s * s / 2) if s > 0 else 1.0
        self._sigma = noise.step_sigma

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """The profile's time times the run's speed factor and this step's own factor."""
        t = self.base.step_time(num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn,
                                num_decode_seqs, decode_context) * self.speed
        s = self._sigma.get(step_kind(num_prefill_tokens, num_decode_seqs), 0.0)
        return t * math.exp(self._rng.gauss(0.0, s) - s * s / 2) if s > 0 else t


def prediction_band(profile: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any,
                    real: Sequence[RequestRecord], noise: StepNoise, samples: int = 20,
                    level: float = 0.9, seed: int = 0) -> dict[str, Any]:
    """The central `level` range of each percentile (and throughput) over `samples` noisy runs.

    `profile` is the one judged (already speed-scaled); each cell says whether the real
    value lies inside its range, and the range's half-width relative to its middle, which
    is the error no model could beat on this machine at this load.
    """
    if samples < 2:
        raise ValueError(f"a prediction band needs at least 2 samples, got {samples}")
    draws: dict[str, list[float]] = {}
    for k in range(samples):
        model = NoisyCostModel(profile, noise, seed=seed * 100_003 + k)
        executor = SimExecutor(model)
        core = EngineCore(dataclasses.replace(sched_cfg), executor)
        recs = Simulation(core, executor, make(), fast_forward=False).run().records
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


def band_table(band: dict[str, Any]) -> str:
    """A markdown table of the band: range, real value, inside or not, per metric and percentile."""
    n = band["noise"]
    sig = ", ".join(f"{k} {v:.1%}" for k, v in n["step_sigma"].items())
    head = (f"prediction band ({band['level']:.0%} of {band['samples']} simulations with per-step noise "
            f"from the calibration's residuals ({sig}) and run speed noise {n['speed_sigma']:.1%} "
            "from this run's probes):")
    lines = [head, "", "| metric | " + " | ".join(f"p{p} band | p{p} real | ±" for p in PERCENTILES) + " |",
             "|---" * (1 + 3 * len(PERCENTILES)) + "|"]
    for m in METRICS:
        cells = [m]
        for p in PERCENTILES:
            c = band["cells"][m][f"p{p}"]
            mark = {True: "in", False: "OUT", None: "n/a"}[c["inside"]]
            cells += [f"{c['lo']:.4f}-{c['hi']:.4f}", f"{c['real']:.4f} {mark}", f"{c['half_width']:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    judged = [c["inside"] for g in band["cells"].values() for c in g.values() if c["inside"] is not None]
    inside, total = sum(judged), len(judged)
    lines += ["", f"real inside the band: {inside} of {total} cells (throughput included)"]
    return "\n".join(lines)
