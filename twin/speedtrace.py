"""The machine's speed sampled all through a run, and a simulator that runs at that speed.

A shared VM's speed swings by ±15% within minutes (other tenants' memory traffic), so a
probe before and one after a run of several minutes estimate the speed the run saw poorly,
and near saturation queueing multiplies a few percent of speed error into tens of percent
of latency. Sampling it during the run fixes the sampling, not the machine:

- `WeightsSampler` (the default) times one row through every projection of the engine's own
  model and its LM head: a decode step's weight traffic through the same kernels and pages
  (about 33 ms for SmolLM2 fp32); `SpeedSampler` (kind "matvec", the first try) times one
  matrix-vector product over a fixed 64 MiB matrix (3 ms);
- `PrefillSampler` (kind "gemm", since Dec 2, off unless asked for) times 128 rows through
  the projections of the model's first two layers right after each weights sample (about
  14 ms): compute-bound, as a prefill chunk is; a step's prefill share (its prefill tokens
  over its tokens) is then priced at its speed and the rest at the weights sampler's
  (`step_factor`). On Dec 2 that priced six served runs worse than the weights samples alone;
- calibrate and the real replay sample after an engine step whenever `SAMPLE_EVERY_S` have
  passed since the last sample, and only while the engine has work (a sample in an idle gap
  would warm what the profile's wake prices model as gone cold);
- `SpeedTrace` turns the samples into the machine's speed over time against the profile's
  reference (the calibration's median sample, of the same kind), smoothed over `SMOOTH_S`;
- `TracedExecutor` prices each simulated step at the trace's speed at its start (`SpeedTrace.at`)
  and adds the samples' own pauses by the same rule, so both sides do the same work.

Measured on this project's 2-core VM (Dec 1, CPU 1, the other core idle):

- the matvec sampler first. 07:42-08:42, twelve fidelity runs (both Azure traces at
  0.3/0.8/1.3 of saturation, two runs a cell), judged with one profile calibrated after them:
  priced along their samples they met 12 of 36 target cells, judged by their probes 21. In
  one run the samples came out 3-5x their median for half-minute episodes in which the
  engine's prefills were at most 30% slower and its decodes no slower: a pure DRAM stream
  over-reacts when the host's memory is contended;
- then both kinds after each of 376 identical ~2 s blocks of engine steps (10:03-10:18): the
  weights samples' mean over a window missed the blocks' mean speed by 5.1% / 3.6% / 2.9% rms
  over 20 / 60 / 120 s windows, the matvec samples' by 8.1% / 6.0% / 4.9%;
- 10:23-11:22, twelve fidelity runs of the same design with the weights sampler, judged with
  their study's own profile: 25 of 36 target cells met along the samples, 10 by the probes.
  The samples priced each run's steps 3.6% too cheap on average, with an sd of 2.3% over the
  runs.

So fidelity judges by the samples by default (`--speed-from auto`) when the profile's
reference was taken by the weights sampler, and by the probes otherwise.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from twinserve.backends.sim.executor import SimExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.sim.world import Simulation

# Seconds between two samples while the engine has work (a weights sample of SmolLM2 costs
# about 33 ms, 1.6% of the engine's time; a matvec sample 3 ms).
SAMPLE_EVERY_S = 2.0
# The trace's speed at t is the median of the samples within SMOOTH_S / 2 of t: one sample is
# a 33 ms glimpse; windows of 10-20 s tracked the engine's own speed best in the measurement
# above (6.2% per 2 s block, against 7.5% over 120 s).
SMOOTH_S = 20.0
# How a window's samples make one speed (SMOOTHINGS). A sample is skewed: a stall of a tenth of a
# second makes a 33 ms sample 3-4x its neighbours while the 2 s of steps around it lose 5%.
# Over the 376 ~2 s blocks of the measurement above (1 weights sample after each), each block
# against the samples within half a window of it, sd of the log ratio (and its mean, the bias;
# experiments/speed_tracking.py --from-json): 10 s: median 7.7% (-0.2%), mean 8.3% (+1.2%);
# 20 s: median 7.5% (-0.3%), mean 8.3% (+1.5%); 40 s: median 8.5% (-0.8%), mean 9.0% (+1.6%).
# A 20% trimmed mean and a Hampel filter came within 0.2 points of the median (a one-off
# comparison). So the median, over 20 s. Profiles made before it was recorded (provenance
# "speed_sample_smoothing") were smoothed by the mean, and keep it until refitted.
SMOOTHINGS = ("median", "mean")
DEFAULT_SMOOTHING = "median"
# The prefill sampler's pass: rows through the projections of the first layers (PrefillSampler).
PREFILL_ROWS = 128
PREFILL_LAYERS = 2
# 4096 x 4096 float32: 64 MiB, larger than any last-level cache a CPU of this class has.
_SAMPLE_ROWS = 4096


class SpeedSampler:
    """One timed matrix-vector product over a fixed 64 MiB matrix: the machine's speed now."""

    kind = "matvec"

    def __init__(self, rows: int = _SAMPLE_ROWS, seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self._torch = torch
        self.matrix = torch.randn(rows, rows, generator=g)
        self.vector = torch.randn(rows, generator=g)
        for _ in range(3):  # first touch of the pages, and the kernel's own warm-up
            torch.mv(self.matrix, self.vector)

    def sample(self) -> float:
        """Seconds of one product now."""
        t = time.perf_counter()
        self._torch.mv(self.matrix, self.vector)
        return time.perf_counter() - t


class _ProjectionSampler:
    """One timed pass of `rows` rows through the four projections of each of `layers` (the
    engine's own kernels and weight pages), then through the LM head when `head`."""

    def __init__(self, model: Any, layers: Sequence[Any], rows: int, head: bool, seed: int) -> None:
        import torch

        from twinserve.backends.real.models.llama import layer_projections, linear

        self._torch, self._linear, self.model = torch, linear, model
        w = model.embed_tokens.weight
        g = torch.Generator().manual_seed(seed)

        def block(n: int) -> Any:
            return torch.randn(rows, n, generator=g).to(dtype=w.dtype, device=w.device)

        # (projection, its input) for every projection, in a step's order.
        self._calls = [(lin, block(lin.in_features)) for layer in layers for lin in layer_projections(layer)]
        self._head_in = block(w.shape[1]) if head else None
        for _ in range(3):  # first touch of the pages, and the kernels' own warm-up
            self.sample()

    def sample(self) -> float:
        """Seconds of one pass now."""
        with self._torch.inference_mode():
            t = time.perf_counter()
            for lin, x in self._calls:
                self._linear(x, lin)
            if self._head_in is not None:
                self.model.compute_logits(self._head_in)
            return time.perf_counter() - t


class WeightsSampler(_ProjectionSampler):
    """One timed pass of a single row through every projection of the engine's own model and
    its LM head: a decode step's weight traffic, through the same kernels and the same pages,
    without attention, sampling or the engine's CPU work (about 33 ms for SmolLM2 fp32 on this
    project's VM; 1.6% of the engine's time at one sample every 2 s)."""

    kind = "weights"

    def __init__(self, model: Any, seed: int = 0) -> None:
        super().__init__(model, model.layers, 1, True, seed)


class PrefillSampler(_ProjectionSampler):
    """One timed pass of PREFILL_ROWS rows through the projections of the engine's first
    PREFILL_LAYERS layers: a slice of a prefill chunk's matrix products, compute-bound where
    the weights sampler is bound by memory (about 14 ms for SmolLM2 fp32 on this project's VM:
    128 rows through one layer take 6.7 ms, 135 GFLOP/s on one core).

    Why a second kind: over studies I-O (Dec 1, 42 runs, 544 windows of 20 s;
    experiments/speed_in_runs.py) the weights samples tracked the speed of windows of mostly
    decode steps (correlation 0.84, slope 1.06 for windows of under 20% prefill tokens) far
    better than of mostly prefill (0.44, slope 0.50 above 80%). Asked for (`--prefill-samples`),
    a step's prefill share (its prefill tokens over its tokens) is priced at this sampler's
    speed, the rest at the weights sampler's (TracedExecutor). On Dec 2 that priced six served
    runs worse than the weights samples alone (the two moved together on that host, this one
    further), so it is off by default."""

    kind = "gemm"

    def __init__(self, model: Any, rows: int = PREFILL_ROWS, layers: int = PREFILL_LAYERS, seed: int = 0) -> None:
        super().__init__(model, model.layers[:layers], rows, False, seed)


def prefill_sampler_for(engine: Any) -> PrefillSampler | None:
    """A prefill (gemm) sampler for an engine whose model runs in this process on its CPU, else None."""
    model = _model_here(engine)
    return PrefillSampler(model) if model is not None else None


# What calibrate samples with (a profile records it as provenance "speed_sampler"; fidelity
# samples its runs with the profile's kind, since a reference sample is one kind's seconds).
SAMPLERS = ("weights", "matvec")
DEFAULT_SAMPLER = "weights"


def sampler_kind(record: Mapping[str, Any]) -> str:
    """The kind of sampler a profile's provenance ("speed_sampler") or a run's sampled speed
    ("sampler") was sampled by: records made before there were kinds were the matvec's."""
    return record.get("speed_sampler") or record.get("sampler") or "matvec"


def sampler_for(engine: Any, kind: str = DEFAULT_SAMPLER) -> SpeedSampler | WeightsSampler | None:
    """A sampler of this kind for an engine whose steps run on this process's CPU, else None.

    A CUDA engine's speed is the device's, which a CPU product does not see; an engine core in
    its own process runs its steps where the front end's sampler does not; the weights kind
    needs the model in this process (one in-process worker).
    """
    if kind not in SAMPLERS:
        raise ValueError(f"speed sampler {kind!r}: one of {', '.join(SAMPLERS)}")
    if not _steps_here(engine):
        return None
    if kind == "matvec":
        return SpeedSampler()
    model = _model_here(engine)
    return WeightsSampler(model) if model is not None else None


def _steps_here(engine: Any) -> bool:
    """Whether the engine runs its steps on this process's CPU."""
    return engine.args.resolve_device().type == "cpu" and getattr(engine, "core_mode", "inproc") == "inproc"


def _model_here(engine: Any) -> Any:
    """The engine's model when its steps run here on one in-process worker, else None."""
    model = getattr(getattr(engine, "worker", None), "model", None) if _steps_here(engine) else None
    return model if model is not None and hasattr(model, "layers") else None


@dataclass(slots=True)
class SampleClock:
    """When to sample: after a step that ends SAMPLE_EVERY_S or more after the last sample."""

    every_s: float = SAMPLE_EVERY_S
    last: float = float("-inf")

    def due(self, now: float) -> bool:
        if now - self.last >= self.every_s:
            self.last = now
            return True
        return False


@dataclass(slots=True)
class SpeedTrace:
    """The machine's relative slowness over a run's clock: 1.0 is the profile's reference speed,
    1.1 a machine 10% slower (step prices are multiplied by it)."""

    times: list[float]
    factors: list[float]
    every_s: float = SAMPLE_EVERY_S
    pause_s: float = 0.0          # what one sample costs the engine (the median sample)
    window_s: float = SMOOTH_S
    num_samples: int = 0
    raw: list[float] = field(default_factory=list)
    smoothing: str = DEFAULT_SMOOTHING
    # The prefill sampler's trace over the same clock, when the run took both kinds: a step's
    # prefill share is priced at its slowness (at()).
    prefill: "SpeedTrace | None" = None

    @classmethod
    def from_samples(cls, samples: Sequence[Sequence[float]], ref_s: float, every_s: float = SAMPLE_EVERY_S,
                     window_s: float = SMOOTH_S, smoothing: str = DEFAULT_SMOOTHING) -> "SpeedTrace":
        """From (time, seconds) samples against the reference sample's seconds; each point is
        the median (or mean) of the samples within window_s / 2 of it."""
        if not samples:
            raise ValueError("a speed trace needs at least one sample")
        if not ref_s or ref_s <= 0:
            raise ValueError(f"reference sample {ref_s!r}: give the calibration's positive seconds")
        if smoothing not in SMOOTHINGS:
            raise ValueError(f"speed smoothing {smoothing!r}: one of {', '.join(SMOOTHINGS)}")
        pts = sorted((float(t), float(s)) for t, s in samples)
        t = np.asarray([p[0] for p in pts])
        s = np.asarray([p[1] for p in pts]) / ref_s
        lo = np.searchsorted(t, t - window_s / 2, side="left")
        hi = np.searchsorted(t, t + window_s / 2, side="right")
        if smoothing == "mean":
            c = np.concatenate([[0.0], np.cumsum(s)])
            smooth = (c[hi] - c[lo]) / (hi - lo)
        else:
            smooth = np.asarray([np.median(s[a:b]) for a, b in zip(lo, hi)])
        return cls(t.tolist(), smooth.tolist(), every_s, float(np.median([p[1] for p in pts])), window_s,
                   len(pts), s.tolist(), smoothing)

    def factor(self, t: float) -> float:
        """The slowness at time t (linear between samples, held flat before the first and after the last)."""
        ts, fs = self.times, self.factors
        i = bisect.bisect_right(ts, t)
        if i == 0:
            return fs[0]
        if i == len(ts):
            return fs[-1]
        t0, t1 = ts[i - 1], ts[i]
        w = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
        return fs[i - 1] + w * (fs[i] - fs[i - 1])

    def at(self, t: float, num_prefill_tokens: float = 0.0, num_tokens: float = 0.0) -> float:
        """The slowness of a step that starts at t with this many prefill tokens of its tokens:
        factor(t), with the step's prefill share at the prefill trace's slowness when there is one."""
        return step_factor(self, self.prefill, t, num_prefill_tokens, num_tokens)

    def with_prefill(self, prefill: "SpeedTrace | None") -> "SpeedTrace":
        """This trace with the prefill sampler's beside it."""
        return dataclasses.replace(self, prefill=prefill)

    def mean_factor(self, starts: Sequence[float], durations: Sequence[float],
                    splits: Sequence[tuple[float, float]] | None = None) -> float:
        """The busy-time-weighted mean slowness over steps (start, measured duration; with
        splits, each step's (prefill tokens, tokens) for `at`)."""
        total = sum(durations)
        if total <= 0:
            return float(np.mean(self.factors))
        splits = splits if splits is not None else [(0.0, 0.0)] * len(starts)
        return sum(d * self.at(s, *sp) for s, d, sp in zip(starts, durations, splits)) / total

    def summary(self) -> dict[str, Any]:
        out = {"num_samples": self.num_samples, "every_s": self.every_s, "window_s": self.window_s,
               "smoothing": self.smoothing, "pause_s": self.pause_s, "min_factor": min(self.factors),
               "max_factor": max(self.factors)}
        if self.prefill is not None:
            out["prefill"] = {k: v for k, v in self.prefill.summary().items()
                              if k in ("num_samples", "pause_s", "min_factor", "max_factor")}
        return out


def without_sample_pauses(rows: Sequence[dict[str, Any]], samples: Sequence[Sequence[float]],
                          t0: float = 0.0) -> list[dict[str, Any]]:
    """Step-log rows (copies) whose gap_s no longer holds the speed samples taken before them.

    A sample runs between two steps. When requests are waiting, the engine's step log counts
    its time in the next step's gap_s (step_log.py), so a fit would price it as the engine's
    CPU overhead, and the simulator, which pauses for samples itself (TracedExecutor), would
    count it twice. A row's samples are those that started after the previous row's start
    (a sample never runs inside a step) and by its own start. Their time moves from gap_s to
    `sampler_pause_s` (the step log's own `sample_s` is the engine's token sampling), never
    taking gap_s below zero: a sample taken while nothing waited left no gap. A row that
    already has `sampler_pause_s` is left alone, so applying this twice changes nothing.
    samples: (time, seconds taken) of every sampler that ran, the time on the step log's clock
    less t0 (as profiles and fidelity runs record them, each after its own t0).
    On Dec 2 this was 61 of a calibration's 300 steps, about 47 ms each, 1.7% of its fitted time,
    and all but 0.35 points of the 2.0% the fit had called the engine's CPU overhead.
    """
    timed = sorted((float(t0) + float(t), float(sec)) for t, sec in samples)
    times = [t for t, _ in timed]
    out: list[dict[str, Any]] = []
    prev_start: float | None = None
    for r in rows:
        r = dict(r)
        start = r.get("start_s")
        if start is not None and prev_start is not None and "sampler_pause_s" not in r and times:
            lo = bisect.bisect_right(times, prev_start)
            hi = bisect.bisect_right(times, float(start) + _SAMPLE_SLACK_S)
            paused = sum(sec for _, sec in timed[lo:hi])
            gap = float(r.get("gap_s") or 0.0)
            r["sampler_pause_s"] = min(paused, gap)
            r["gap_s"] = gap - r["sampler_pause_s"]
        if start is not None:
            prev_start = float(start)
        out.append(r)
    return out


# A sample's start and the step log's times come from one clock, read a few µs apart.
_SAMPLE_SLACK_S = 1e-4


def step_factor(trace: SpeedTrace, prefill_trace: SpeedTrace | None, t: float, num_prefill_tokens: float,
                num_tokens: float) -> float:
    """A step's slowness at t: the weights trace's, with the step's prefill share (prefill
    tokens over all its tokens, as FittedCostModel.prefill_scale splits a step) at the prefill
    trace's when there is one."""
    f = trace.factor(t)
    if prefill_trace is None:
        return f
    return share_mix(f, prefill_trace.factor(t), num_prefill_tokens, num_tokens)


def share_mix(rest: float, prefill: float, num_prefill_tokens: float, num_tokens: float) -> float:
    """A step's value with its prefill share (prefill tokens over its tokens) at `prefill` and
    the rest at `rest`; `rest` for a step without prefill tokens."""
    if not num_prefill_tokens or num_tokens <= 0:
        return rest
    return rest + (prefill - rest) * num_prefill_tokens / num_tokens


class TracedExecutor(SimExecutor):
    """A SimExecutor whose step prices follow a measured speed trace, pausing for the samples.

    The world's clock is read through `clock` (set to the simulation's env.now); the world
    must not fast-forward decode windows (`waking` is always true), since a window is priced
    at one speed.
    """

    def __init__(self, cost_model: Any, trace: SpeedTrace) -> None:
        super().__init__(cost_model)
        self.trace = trace
        # A run that took both kinds of sample paused for both, the prefill sampler's right after.
        self.pause_s = trace.pause_s + (trace.prefill.pause_s if trace.prefill is not None else 0.0)
        self.clock = lambda: 0.0
        self._samples = SampleClock(trace.every_s)
        self._paused_until = float("-inf")

    @property
    def waking(self) -> bool:
        return True

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        now = self.clock()
        out = super().execute(so)
        base = out.step_time or 0.0
        pt, ds = self.last_features[0], self.last_features[4]
        t = base * self.trace.at(now, pt, pt + ds) + max(0.0, self._paused_until - now)
        self.totals.busy_time += t - base
        if self._samples.due(now + t):
            # The real loop samples once this step's outputs are out: the next step waits for it.
            self._paused_until = now + t + self.pause_s
        out.step_time = t
        return out


def run_simulation(cost_model: Any, sched_cfg: Any, workload: Any, trace: SpeedTrace | None = None,
                   fast_forward: bool = True) -> Any:
    """Simulate workload with this cost model and scheduler config: at the model's own prices,
    or along a sampled speed trace (a TracedExecutor on the simulation's clock, stepping)."""
    executor = SimExecutor(cost_model) if trace is None else TracedExecutor(cost_model, trace)
    sim = Simulation(EngineCore(dataclasses.replace(sched_cfg), executor), executor, workload,
                     fast_forward=fast_forward and trace is None)
    if trace is not None:
        executor.clock = lambda: sim.env.now
    return sim.run()


__all__ = ["DEFAULT_SAMPLER", "DEFAULT_SMOOTHING", "PREFILL_LAYERS", "PREFILL_ROWS", "PrefillSampler", "SAMPLERS",
           "SAMPLE_EVERY_S", "SMOOTHINGS", "SMOOTH_S", "SampleClock", "SpeedSampler", "SpeedTrace", "TracedExecutor",
           "WeightsSampler", "prefill_sampler_for", "run_simulation", "sampler_for", "sampler_kind", "share_mix",
           "step_factor", "without_sample_pauses"]
