"""`twinserve calibrate`: run a designed set of steps on the real engine and fit a step profile.

The design is made from step shapes, never drawn from a trace:

- single prefill chunks: new tokens q x cached context c (the context comes from a
  prefix-cache hit on a base prompt computed once), each step sampling one token;
- several prefills in one step (k prompts of q tokens);
- decode batches: b sequences with contexts spread evenly over [c/2, 3c/2] (distinct
  prompts, so no KV block is shared and attention reads as much memory as it does in
  service; spread lengths, as in service, where attention works in length buckets), a
  few steps each;
- mixed steps: a decode batch plus one new prefill chunk, from a small prompt beside a few
  short decodes up to nearly the whole token budget beside a large batch at long context
  (the steps a loaded server runs);
- idle gaps: the engine idles 0.25, 1 or 3 s, then a fresh prompt arrives. The steps after
  such a gap run slower (caches, and on a VM the vCPU, gone cold), so they are kept out of the
  step model and priced per gap by an extra time per step, which the simulator applies after its own
  idle gaps.

Every step runs through the whole engine (schedule, forward, sample, update, detokenize,
outputs), so the profile prices what a request waits for between two tokens, split into
the device path and the engine's CPU overhead (backends/sim/fit.py). A warm-up runs
first and is not fitted; the design is repeated `repeats` times, each repeat in a fresh
shuffled order, so a slow minute of a shared machine does not land on one kind of step.

A shared machine's speed drifts while the design runs (tens of percent over minutes on
this project's VM). On a CPU engine in this process a speed sample (speedtrace.py: by
default one row through the model's own weights and LM head, about 33 ms for SmolLM2) runs
between steps every 2 s; each step's times are divided by the machine's relative slowness at
that moment (the median sample within 10 s of it, `correct_drift_by_samples`), so the
profile prices the machine at its median sample's speed, which the profile records with the
sampler's kind. With `--prefill-samples` a prefill sampler (128 rows through the first two
layers' projections, about 14 ms) samples the compute-bound speed right after each, and each
step's prefill share (prefill tokens over its tokens) is corrected by it instead
(`correct_drift_split`), its median smoothed sample recorded beside the other. Samples that
the steps around them contradict (`contradicted_samples`: a sampler slowed 2-3x while the
steps ran at full speed) are left out first. On Dec 1 one
calibration's fit had a MAPE of 7.9% corrected by the weights sampler, 8.2% by the probes and
8.6% uncorrected (the same steps refitted); two earlier ones 9.9% and 9.1% corrected by the
64 MiB product, against 11.5% and 9.7% by the probes.
Elsewhere (a CUDA engine, a core in its own process) a fixed speed probe (`speed_probe`,
about half a minute of steps) every `probe_every` design points does the correction
(`correct_drift`, median probe speed). The probes run on a CPU too and are recorded:
`twinserve fidelity` samples the real run as calibrate did and prices each simulated step at
the speed sampled at its start when the profile's reference came from the weights sampler,
and otherwise (or with `--speed-from probes`) probes before and after the real run and scales
the simulated times by their ratio to the profile's.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.catalog import MODELS
from twinserve.backends.sim.fit import fit_step_profile, select_regimes
from twinserve.backends.sim.fitted import (FEATURE_COLUMNS, FittedCostModel, ProfileError, recorded_small_batch_rows,
                                           resolve_profile)
from twinserve.core.errors import InvalidConfigError
from twinserve.core.sampling_params import SamplingParams

from twinserve.backends.real.step_log import TIME_COLUMNS, StepLog
from twinserve.twin.hostload import HostLoad
from twinserve.twin.speedtrace import (DEFAULT_SAMPLER, DEFAULT_SMOOTHING, SAMPLE_EVERY_S, SAMPLERS, SMOOTH_S, PrefillSampler,
                         SampleClock, SpeedSampler, SpeedTrace, WeightsSampler, prefill_sampler_for, sampler_for,
                         share_mix, step_factor, without_sample_pauses)


# Design points between two speed probes, where the probes correct the drift.
PROBE_EVERY = 12


@dataclass(slots=True)
class CalibrationDesign:
    """The step shapes to measure; `for_limits` scales it to an engine's limits."""

    prefill_sizes: list[int] = field(default_factory=lambda: [8, 32, 96, 192, 384])
    prefill_contexts: list[int] = field(default_factory=lambda: [0, 192, 448])
    multi_prefill: list[tuple[int, int]] = field(
        default_factory=lambda: [(2, 32), (4, 32), (8, 32), (2, 128), (4, 128)])
    decode_batches: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 24, 32])
    decode_contexts: list[int] = field(default_factory=lambda: [48, 256])
    decode_steps: int = 4
    # (decode batch, prompt tokens[, decode context]; context 32 when not given)
    mixed: list[tuple[int, ...]] = field(default_factory=lambda: [(4, 64), (8, 192), (16, 64), (16, 256),
                                                                  (8, 448, 256), (24, 448, 256)])
    repeats: int = 1
    # Run the speed probe every this many design points (0: only before and after). None: every
    # PROBE_EVERY where the probes correct the drift, only before and after where the speed
    # samples do (each probe is ~10 s of steps on this project's VM that nothing is fitted on).
    probe_every: int | None = None
    # Idle gaps (seconds) before a fresh prompt, each measured idle_repeats times per repeat:
    # the first steps after the engine idled cost more, the more the longer it idled (a vCPU
    # descheduled, caches gone cold; on this project's VM +8% after 1 s, +47% after 3 s).
    idle_gaps: list[float] = field(default_factory=lambda: [0.25, 1.0, 3.0])
    idle_repeats: int = 3
    # Sample the machine's speed after a step every this many seconds (speedtrace.py; 0: never).
    sample_every_s: float = SAMPLE_EVERY_S
    # What samples it (speedtrace.SAMPLERS): a pass through the model's own weights, or a
    # product over a fixed 64 MiB matrix.
    sampler: str = DEFAULT_SAMPLER
    # Also sample with the prefill sampler (speedtrace.PrefillSampler) right after each weights
    # sample: the steps' prefill shares are corrected by its speed, the rest by the weights'.
    # Off by default: on Dec 2 (docs/twin-log.md, "A compute-bound sample for prefill") it
    # tracked the served steps worse than the weights sampler alone.
    prefill_samples: bool = False

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise InvalidConfigError("sampler", self.sampler, f"one of {', '.join(SAMPLERS)}")

    @classmethod
    def quick(cls) -> "CalibrationDesign":
        """A small design for tests and tiny models."""
        return cls([4, 12, 24], [0, 16], [(2, 8), (3, 4)], [1, 2, 4, 6], [8, 24], 3,
                   [(2, 8), (4, 12)], 1, 0, [0.05], 2)

    def for_limits(self, max_num_seqs: int, max_num_batched_tokens: int,
                   max_model_len: int) -> "CalibrationDesign":
        """Drop shapes the engine could not run in one step."""
        fits = lambda q, c: q <= max_num_batched_tokens and q + c + 1 < max_model_len  # noqa: E731
        sizes = [q for q in self.prefill_sizes if fits(q, 0)]
        # A full-budget chunk too: every prompt longer than the token budget is cut into them, so
        # under load they are the commonest prefill step. On Dec 2 the default sizes stopped at
        # 384 with a 512 budget: six served runs' 512-token chunks (45 of their 72 steps of one
        # prompt and no context) were priced from other shapes, no one prompt that long measured.
        if sizes and max_num_batched_tokens > max(sizes) and fits(max_num_batched_tokens, 0):
            sizes.append(max_num_batched_tokens)
        return CalibrationDesign(
            sizes,
            [c for c in self.prefill_contexts if c + 2 < max_model_len],
            [(k, q) for k, q in self.multi_prefill
             if k * q <= max_num_batched_tokens and k <= max_num_seqs],
            [b for b in self.decode_batches if b <= max_num_seqs],
            [c for c in self.decode_contexts if 1.5 * c + self.decode_steps + 2 < max_model_len],
            self.decode_steps,
            [m for m in self.mixed if m[0] + 1 <= max_num_seqs and m[0] + m[1] <= max_num_batched_tokens
             and _mixed_context(m) + 8 < max_model_len],
            self.repeats, self.probe_every, list(self.idle_gaps), self.idle_repeats, self.sample_every_s,
            self.sampler, self.prefill_samples)

    def reaching(self, max_context: int) -> "CalibrationDesign":
        """This design, with decodes and prefill chunks that reach max_context tokens of context.

        The default design's decodes reach 1.5 x 256 + 4 tokens of context each and its chunks
        start after at most 448 cached tokens; steps of a workload with longer sequences are
        priced by extrapolating the fit (fidelity and the simulator report how much). One
        more decode context, whose spread tops out at max_context, and one more cached context
        for the chunks measure them, at the price of a longer calibration (the decode batches
        at that context prefill everything they hold).
        """
        if max_context < 1:
            raise InvalidConfigError("max_context", max_context, ">= 1")
        decode, chunks = list(self.decode_contexts), list(self.prefill_contexts)
        if decode and max_context > 1.5 * max(decode) + self.decode_steps:
            decode.append(-(-2 * (max_context - self.decode_steps) // 3))
        if chunks and self.prefill_sizes and max_context - max(self.prefill_sizes) > max(chunks):
            chunks.append(max_context - max(self.prefill_sizes))
        return replace(self, decode_contexts=decode, prefill_contexts=chunks)

    def num_points(self) -> int:
        """Design points per repeat (what the progress bar counts)."""
        return (len(self.prefill_sizes) * len(self.prefill_contexts) + len(self.multi_prefill)
                + (len(self.decode_contexts) if self.decode_batches else 0) + len(self.mixed)
                + len(self.idle_gaps) * self.idle_repeats)


# The steps after an idle gap that cost extra (measured: +8%/+6%/+2% for the first three after
# 1 s on this project's VM, +47%/+29%/+5% after 3 s), and the prompt the calibration sends then.
WAKE_STEPS = 2
WAKE_PROMPT = 192


def split_wake(rows: list[dict[str, Any]], marks: Sequence[Sequence[float]]) -> tuple[
        list[dict[str, Any]], list[tuple[float, list[dict[str, Any]]]]]:
    """(rows to fit the step model on, [(idle gap, the WAKE_STEPS rows after it)]).

    marks: (index of the first step after the idle gap in rows, the gap in seconds), as the
    calibrator records them (provenance "idle_steps"; a speed probe between two points also
    leaves a gap in the log, but the engine was busy, so gaps are not read off the times).
    Those steps are left out of the step model's fit and priced by factors instead.
    """
    skip: set[int] = set()
    episodes = []
    for index, gap in marks:
        i = int(index)
        if 0 <= i and i + WAKE_STEPS <= len(rows):
            episodes.append((float(gap), rows[i:i + WAKE_STEPS]))
            skip.update(range(i, i + WAKE_STEPS))
    return [r for i, r in enumerate(rows) if i not in skip], episodes


def fit_wake(profile: FittedCostModel, episodes: list[tuple[float, list[dict[str, Any]]]]) -> None:
    """Set the profile's wake cost: per design gap and step after it, the median of measured less
    predicted time (the step model fitted without those steps), never below zero. An extra
    time, not a factor: in service the same gap adds about as much to a long step as to a
    short one (fitted.FittedCostModel.wake_extra_s)."""
    by_gap: dict[float, list[list[float]]] = {}
    for gap, steps in episodes:
        extra = [float(r["step_time_s"]) + float(r.get("gap_s") or 0.0)
                 - profile.step_time(*(float(r[c]) for c in FEATURE_COLUMNS)) for r in steps]
        by_gap.setdefault(gap, []).append(extra)
    gaps = sorted(by_gap)
    profile.wake_idle_s = tuple(gaps)
    profile.wake_factors = ()
    profile.wake_extra_s = tuple(tuple(max(0.0, float(np.median(col))) for col in zip(*by_gap[g]))
                                 for g in gaps)


def _spread(batch: int, context: int) -> list[int]:
    """A decode batch's prompt lengths: evenly over [context/2, 3 context/2] (one: context)."""
    return [max(1, round(context * (0.5 + (i / (batch - 1) if batch > 1 else 0.5)))) for i in range(batch)]


def _evenly(n: int, k: int, keep: int | None = None) -> list[int]:
    """k of the indices 0..n-1, evenly spaced from first to last (one: the middle); with `keep`,
    that index replaces the nearest of them (an inner one on a tie) when it is not one already."""
    if k >= n:
        return list(range(n))
    if k == 1:
        picked = [(n - 1) // 2]
    else:
        picked = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    if keep is not None and keep not in picked:
        ends = (0, len(picked) - 1)
        picked[min(range(len(picked)), key=lambda j: (abs(picked[j] - keep), j in ends))] = keep
    return sorted(picked)


def _mixed_context(point: tuple[int, ...]) -> int:
    """The decode context of a mixed design point (b, q[, c])."""
    return point[2] if len(point) > 2 else 32


# Steps a core process may run past what its front end has read (core_proc.MAX_UNCONSUMED_BATCHES),
# plus the one in flight.
_CORE_RUN_AHEAD = 3


class Calibrator:
    """Drives an LLMEngine through a design, logging every step in memory."""

    def __init__(self, engine: Any, seed: int = 0) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.vocab = engine.vocab_size
        self._n = 0
        self.log = StepLog(keep=True)
        # (monotonic time, seconds) of every speed probe run during the design, and its parts.
        self.probes: list[tuple[float, float]] = []
        self.probe_parts: list[ProbeParts] = []
        # (index in the log of the first step after an idle gap, the gap's seconds)
        self.idle_steps: list[tuple[int, float]] = []
        # The machine's speed sampled between steps (speedtrace.py): set by calibrate().
        self.sampler: SpeedSampler | WeightsSampler | None = None
        self.samples: list[tuple[float, float]] = []  # (monotonic time, seconds)
        # The prefill sampler's, each right after a speed sample (when there is one).
        self.prefill_sampler: PrefillSampler | None = None
        self.prefill_samples: list[tuple[float, float]] = []
        self.sample_clock = SampleClock()
        self._order_rng = random.Random(seed + 1)

    def _tokens(self, n: int) -> list[int]:
        hi = self.vocab - 1
        return [self.rng.randint(2, hi) for _ in range(n)]

    def _add(self, ids: list[int], max_tokens: int) -> str:
        self._n += 1
        rid = f"cal-{self._n}"
        self.engine.add_request(rid, {"prompt_token_ids": ids},
                                SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0))
        return rid

    def _step(self) -> None:
        self.engine.step()
        if self.sampler is not None and self.sample_clock.due(now := time.monotonic()):
            self.samples.append((now, self.sampler.sample()))
            if self.prefill_sampler is not None:
                self.prefill_samples.append((time.monotonic(), self.prefill_sampler.sample()))

    def _drain(self, max_steps: int | None = None) -> None:
        # Counted in the core's steps: over a core process one step() may take several, or none.
        core = self.engine.core
        first = core.num_steps
        while self.engine.has_unfinished_requests() and (max_steps is None
                                                         or core.num_steps - first < max_steps):
            self._step()

    def warm_up(self) -> None:
        """A few unlogged steps: first-touch allocations, thread pools, kernel caches."""
        off = StepLog()
        self.engine.set_step_log(off)
        self._add(self._tokens(64), 4)
        self._add(self._tokens(16), 4)
        self._drain()
        self.engine.set_step_log(self.log)

    def _probe(self) -> None:
        """The speed probe now (fresh prompts, so the design's cached bases stay cached)."""
        t = time.monotonic()
        parts = speed_probe_parts(self.engine, seed=self.rng.randrange(1 << 30), reset_prefix_cache=False)
        if parts is not None:
            self.probes.append(((t + time.monotonic()) / 2, parts.total))
            self.probe_parts.append(parts)

    def prefill_single(self, q: int, context: int, base: list[int]) -> None:
        """One chunk of q new tokens after `context` cached ones (a prefix-cache hit on base)."""
        self._add(base[:context] + self._tokens(q), 1)
        self._drain()

    def multi_prefill(self, k: int, q: int) -> None:
        """k prompts of q tokens admitted together."""
        for _ in range(k):
            self._add(self._tokens(q), 1)
        self._drain()

    def decode(self, batch: int, context: int, steps: int) -> None:
        """batch distinct prompts, lengths spread over [context/2, 3 context/2], then `steps`
        decodes of the whole batch."""
        lens = _spread(batch, context)
        # The prompts prefilled first decode while the rest prefill: each must outlive the
        # batch's prefill (every step of it also carries up to `batch` decodes) for the whole
        # batch to decode together, else large batches at long context are never measured.
        room = max(self.engine.scheduler_config.max_num_batched_tokens - batch, 1)
        prefill_steps = -(-sum(lens) // room)
        for n in lens:
            self._add(self._tokens(n), steps + prefill_steps + 1)
        self._drain()

    def decode_sweep(self, batches: Sequence[int], context: int, steps: int) -> None:
        """Every batch size in `batches` decoding `steps` times at one context, from one set of
        prompts: the largest batch (lengths spread over [context/2, 3 context/2]) is prefilled
        once, then each size, largest first, decodes while the sequences left out are aborted,
        the rest keeping the spread and the middle prompt (one sequence decodes at `context`).

        A decode point per batch size prefilled sum(batches) prompts, this prefills max(batches):
        32 of 132 with the default design, whose prefills were most of calibration's time. The
        largest batch's prefill, chunked while its first sequences decode, still gives the fit
        chunks with decodes beside them.
        """
        order = sorted({b for b in batches if b > 0}, reverse=True)
        if not order:
            return
        lens = _spread(order[0], context)
        room = max(self.engine.scheduler_config.max_num_batched_tokens - order[0], 1)
        prefill_steps = -(-sum(lens) // room)
        # Enough tokens to outlive the prefill and every size's decodes (a core process runs a
        # few steps ahead of what this loop sees after each abort).
        ahead = 0 if getattr(self.engine, "core_mode", "inproc") == "inproc" else _CORE_RUN_AHEAD
        budget = prefill_steps + (steps + ahead + 1) * len(order) + 1
        live = [self._add(self._tokens(n), budget) for n in lens]  # shortest first
        # The prompt at the middle of the spread (`context` tokens) stays in every batch, so the
        # single decode is measured at the design's context. Kept only evenly, the default sweep
        # (..., 3, 2, 1) ended on the shortest: on Dec 2 the calibrations timed one sequence only
        # below 300 tokens of context, while served runs had 86% of their single decodes at
        # 200-606 (docs/twin-log.md, "Single decodes at the design's context").
        middle = (len(live) - 1) // 2
        for b in order:
            picked = _evenly(len(live), b, keep=middle)
            middle, kept = picked.index(middle), set(picked)
            gone = [r for i, r in enumerate(live) if i not in kept]
            if gone:
                self.engine.abort_request(gone)
            live = [r for i, r in enumerate(live) if i in kept]
            seen, done, tries = len(self.log.records), 0, prefill_steps + 4 * (steps + ahead) + 4
            while done < steps and tries and self.engine.has_unfinished_requests():
                self._step()
                tries -= 1
                # A core process may log several steps per step(), or none: count the new ones.
                done += sum(1 for r in self.log.records[seen:]
                            if r.num_prefill_tokens == 0 and r.num_decode_seqs == b)
                seen = len(self.log.records)
        self.engine.abort_request(live)
        self._drain()

    def mixed(self, batch: int, q: int, context: int = 32) -> None:
        """A decode batch running when a q-token prompt arrives: one mixed step, then decodes."""
        # A core in its own process runs ahead of the front end by a few steps (core_proc's
        # backpressure bound): the batch lives that much longer so the prompt still meets it.
        ahead = 0 if getattr(self.engine, "core_mode", "inproc") == "inproc" else _CORE_RUN_AHEAD
        # As in decode(): a batch at long context prefills over several steps, and each of its
        # requests must outlive them to be part of the batch the prompt meets.
        room = max(self.engine.scheduler_config.max_num_batched_tokens - batch, 1)
        prefill_steps = -(-batch * context // room)
        for _ in range(batch):
            self._add(self._tokens(context), 4 + ahead + prefill_steps)
        self._drain(max_steps=prefill_steps + 1)  # prefill, then a first decode step
        self._add(self._tokens(q), 2)
        self._drain()

    def after_idle(self, seconds: float) -> None:
        """The engine idles this long, then a fresh prompt arrives: its prefill and decodes."""
        self._drain()  # a core process may still owe an answer: idle means idle
        time.sleep(seconds)
        self.idle_steps.append((len(self.log.records), seconds))
        self._add(self._tokens(WAKE_PROMPT), WAKE_STEPS + 2)
        self._drain()

    def run(self, design: CalibrationDesign, progress: bool = True) -> StepLog:
        """Warm up, then every design point `repeats` times; returns the step log."""
        points: list[tuple[str, Callable[[], None]]] = []
        bases = {c: self._tokens(c) for c in design.prefill_contexts if c > 0}
        for c, base in bases.items():
            points.append((f"base {c}", lambda base=base: (self._add(base + self._tokens(1), 1),
                                                            self._drain())))
        for q in design.prefill_sizes:
            for c in design.prefill_contexts:
                points.append((f"prefill q={q} c={c}",
                               lambda q=q, c=c: self.prefill_single(q, c, bases.get(c, []))))
        for k, q in design.multi_prefill:
            points.append((f"{k} prefills q={q}", lambda k=k, q=q: self.multi_prefill(k, q)))
        for c in design.decode_contexts if design.decode_batches else []:  # as num_points counts
            points.append((f"decodes c={c}",
                           lambda c=c: self.decode_sweep(design.decode_batches, c, design.decode_steps)))
        for m in design.mixed:
            b, q, c = m[0], m[1], _mixed_context(m)
            points.append((f"mixed b={b} q={q} c={c}", lambda b=b, q=q, c=c: self.mixed(b, q, c)))
        for g in design.idle_gaps:
            points += [(f"idle {g:g} s", lambda g=g: self.after_idle(g))] * design.idle_repeats
        self.warm_up()
        todo = list(points[:len(bases)])
        for _ in range(max(design.repeats, 1)):
            rest = points[len(bases):]
            self._order_rng.shuffle(rest)
            todo += rest
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(todo), desc="calibrate", unit="pt")
        self._probe()
        for i, (name, fn) in enumerate(todo, 1):
            if bar is not None:
                bar.set_postfix_str(name)
            fn()
            if design.probe_every and i % design.probe_every == 0:
                self._probe()
            if bar is not None:
                bar.update()
        self._probe()
        if bar is not None:
            bar.close()
        return self.log


@dataclass(slots=True)
class ProbeParts:
    """The speed probe's two parts: bandwidth-bound decode and compute-bound prefill."""

    decode_s: float   # ten 4-sequence decode steps (the median step, times ten)
    prefill_s: float  # one 128-token prefill (the median of one per round)

    @property
    def total(self) -> float:
        """The probe's seconds (what `speed_probe` returns)."""
        return self.decode_s + self.prefill_s

    def to_dict(self) -> dict[str, float]:
        return {"decode_s": self.decode_s, "prefill_s": self.prefill_s}


def speed_probe_parts(engine: Any, seed: int = 1234, reset_prefix_cache: bool = True,
                      rounds: int = 3) -> ProbeParts | None:
    """A fixed set of steps (4-sequence decodes and 128-token prefills), timed now, by part.

    A shared machine's speed drifts by tens of percent over minutes (other tenants, memory
    traffic), and not alike for every kind of step: decode streams the weights, prefill
    computes. Calibrate records this probe and fidelity repeats it around the real run, so a
    drift is measured and reported instead of being mistaken for model error. None when the
    engine's limits cannot run the probe's shapes in single steps. Each round is six 4-sequence
    decodes and one 128-token prefill; the parts are medians over all rounds, so more rounds
    estimate the same thing with less noise.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sc = engine.scheduler_config
    if sc.max_num_batched_tokens < 128 or sc.max_num_seqs < 4 or sc.max_model_len < 256:
        return None
    # The probe must compute every token: a cold prefix cache, or (reset_prefix_cache=False)
    # a seed no earlier probe used, whose random prompts share no block with anything cached.
    if reset_prefix_cache:
        cold_prefix_cache(engine)
    cal = Calibrator(engine, seed)
    probe_log = StepLog(keep=True)
    previous = engine.step_log
    engine.set_step_log(probe_log)
    try:
        for _ in range(rounds):
            cal.decode(4, 128, 6)
            cal.prefill_single(128, 0, [])
    finally:
        engine.set_step_log(previous)
    decodes = sorted(r.step_time_s for r in probe_log.records if r.num_prefill_seqs == 0)
    prefills = sorted(r.step_time_s for r in probe_log.records
                      if r.num_prefill_tokens == 128 and r.num_decode_seqs == 0)
    return ProbeParts(decodes[len(decodes) // 2] * 10, prefills[len(prefills) // 2])


# Probes this far apart (slowest / fastest - 1) mean the machine's speed moved while the design
# ran; the drift correction assumes it moved smoothly between probes, which a swing this size on
# this project's VM did not (Nov 30: a calibration with probes 1.29-1.61 s priced two studies'
# steps 7-20% too dear where one with probes within 7% priced them within 0-7%).
PROBE_DRIFT_WARN = 0.15


def drift_warning(provenance: dict[str, Any]) -> str | None:
    """A one-line warning when calibration's speed probes disagree by more than PROBE_DRIFT_WARN."""
    drift = provenance.get("speed_probe_drift")
    if drift is None or drift <= PROBE_DRIFT_WARN:
        return None
    secs = [s for _, s in provenance.get("speed_probes") or []]
    how = "by the speed samples" if provenance.get("drift_source") == "samples" else "between probes"
    return (f"warning: the machine's speed moved {drift:.0%} during calibration (speed probes "
            f"{min(secs):.3f}-{max(secs):.3f} s), so the profile is only as good as the drift "
            f"correction {how}: calibrate again on a quieter machine or core")


def cold_prefix_cache(engine: Any) -> None:
    """Drain what the engine (or its core process) still owes, then forget every cached prefix."""
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_prefix_cache()


def speed_probe(engine: Any, seed: int = 1234, reset_prefix_cache: bool = True) -> float | None:
    """Seconds of the speed probe now (`speed_probe_parts`, both parts together)."""
    parts = speed_probe_parts(engine, seed, reset_prefix_cache)
    return parts.total if parts is not None else None


def _scaled(row: dict[str, Any], k: float, time_columns: tuple[str, ...] = TIME_COLUMNS) -> dict[str, Any]:
    """A copy of a step-log row with its times multiplied by k."""
    out = dict(row)
    for c in time_columns:
        if out.get(c) is not None:
            out[c] = float(out[c]) * k
    return out


def correct_drift(rows: list[dict[str, Any]], probes: list[tuple[float, float]],
                  time_columns: tuple[str, ...] = TIME_COLUMNS) -> tuple[list[dict[str, Any]], float]:
    """Rows with their times at the machine's median probe speed, and that probe (seconds).

    A step at time t is scaled by ref / probe(t), probe(t) interpolated linearly between the
    probes around it (held flat before the first and after the last). With fewer than two
    probes the rows come back unchanged.
    """
    if not probes:
        return rows, float("nan")
    times = [t for t, _ in probes]
    secs = [s for _, s in probes]
    ref = float(np.median(secs))
    if len(probes) < 2:
        return rows, ref
    scale = ref / np.interp([float(r["start_s"]) for r in rows], times, secs)
    return [_scaled(r, float(k), time_columns) for r, k in zip(rows, scale)], ref


def correct_drift_by_samples(rows: list[dict[str, Any]], samples: list[tuple[float, float]],
                             window_s: float = SMOOTH_S,
                             smoothing: str = DEFAULT_SMOOTHING) -> tuple[list[dict[str, Any]], float]:
    """correct_drift by the speed samples (speedtrace.py), each smoothed over window_s as the
    fidelity trace smooths them: rows at the median smoothed sample's speed, and that sample."""
    trace = SpeedTrace.from_samples(samples, 1.0, window_s=window_s, smoothing=smoothing)
    return correct_drift(rows, list(zip(trace.times, trace.factors)))


def correct_drift_split(rows: list[dict[str, Any]], samples: list[tuple[float, float]],
                        prefill_samples: list[tuple[float, float]], window_s: float = SMOOTH_S,
                        smoothing: str = DEFAULT_SMOOTHING) -> tuple[list[dict[str, Any]], float, float]:
    """correct_drift_by_samples with each step's prefill share (its prefill tokens over its
    tokens) at the prefill sampler's speed and the rest at the weights sampler's, as
    speedtrace.step_factor prices a simulated step: rows at the median smoothed sample of
    each kind, and those two samples (weights, prefill)."""
    traces = []
    for smp in (samples, prefill_samples):
        tr = SpeedTrace.from_samples(smp, 1.0, window_s=window_s, smoothing=smoothing)
        ref = float(np.median(tr.factors))  # the trace in seconds; against its median sample:
        traces.append((replace(tr, factors=[f / ref for f in tr.factors]), ref))
    (weights, ref_w), (prefill, ref_p) = traces
    out = []
    for r in rows:
        pt = float(r["num_prefill_tokens"])
        k = step_factor(weights, prefill, float(r["start_s"]), pt, pt + float(r["num_decode_seqs"]))
        out.append(_scaled(r, 1.0 / k))
    return out, ref_w, ref_p


# A speed sample the steps around it contradict: it says the machine ran more than this much
# slower (or faster) than the steps within half a smoothing window of it ran against a fit of
# every step. On Dec 1 (18:05, CPU 1) eight samples in a row ran 1.2-3.7x the median for 25 s
# while the 500-token mixed steps around them ran as fast as the same steps later; corrected
# by them, those steps were priced at half their time and the fit's MAPE went from 7.5% to
# 12.6% (mixed steps 5.9% to 25.3%, worst +130%). One sample is noisy (neighbouring samples
# differ by 10% sd, ~2 s blocks of steps by 5%, in speed_tracking.py's 376-block log), so the
# bar is set well above that.
SAMPLE_VETO = 0.25


def contradicted_samples(rows: list[dict[str, Any]], samples: Sequence[tuple[float, float]],
                         fit: Callable[[list[dict[str, Any]]], FittedCostModel],
                         idle_steps: Sequence[Sequence[float]] = (), window_s: float = SMOOTH_S,
                         veto: float = SAMPLE_VETO) -> list[int]:
    """Indices of the speed samples that the calibration's own steps contradict.

    rows: the step log as measured; samples: (time on its clock, seconds); fit: rows to a
    profile (the calibration's own fit). The steps are corrected by every sample and fitted;
    then each sample's slowness (against the reference, the median smoothed sample) is set
    beside the median of measured / fitted time over the steps (steps after idle gaps left
    out) that started within window_s / 2 of it, and a sample more than `veto` away from
    them, with at least three steps to judge by, is contradicted.
    """
    if len(samples) < 3:
        return []
    corrected, ref = correct_drift_by_samples(rows, list(samples), window_s)
    profile = fit(split_wake(corrected, idle_steps)[0])
    raw = split_wake(rows, idle_steps)[0]
    starts = np.asarray([float(r["start_s"]) for r in raw])
    ratio = np.asarray([float(r["step_time_s"]) / max(profile.step_time(*(float(r[c]) for c in FEATURE_COLUMNS)),
                                                       1e-12) for r in raw])
    bar = np.log1p(veto)
    out = []
    for i, (t, sec) in enumerate(samples):
        near = np.abs(starts - float(t)) <= window_s / 2
        if near.sum() >= 3 and abs(np.log(float(sec) / ref / float(np.median(ratio[near])))) > bar:
            out.append(i)
    return out if len(samples) - len(out) >= 2 else []


def catalog_name(cfg: Any, fallback: str) -> str:
    """The simulator catalog's name for a model with this config's shape, else fallback."""
    for spec in MODELS.values():
        if (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_heads,
                spec.num_kv_heads, spec.vocab_size) == (
                cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size,
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size):
            return spec.name
    return fallback


def _cpuinfo(key: str) -> str | None:
    """The first value of `key` in /proc/cpuinfo (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def device_name(device: Any) -> str:
    """A human name for the device the engine runs on."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu: " + (_cpuinfo("model name") or platform.processor() or platform.machine())


# CPU features that choose which kernels torch runs: oneDNN's bf16 path needs AVX512-BF16 or
# AMX, without them a bf16 matmul takes aten's generic path, several times dearer; VNNI serves
# int8. A VM's model name ("Intel(R) Xeon(R) Processor") does not tell them apart.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8")


def cpu_features() -> dict[str, Any]:
    """{"capability": torch's CPU kernel level, "flags": the KERNEL_FLAGS this CPU has}.

    flags is None where /proc/cpuinfo does not list them (not Linux on x86).
    """
    import torch

    got = _cpuinfo("flags")
    have = set(got.split()) if got is not None else None
    return {"capability": torch.backends.cpu.get_cpu_capability(),
            "flags": [f for f in KERNEL_FLAGS if f in have] if have is not None else None}


def _git_commit() -> str | None:
    # A copy of the tree whose .git is not the tree's own (a device machine's) names it here.
    if os.environ.get("TWINSERVE_GIT_COMMIT"):
        return os.environ["TWINSERVE_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def regime_bounds(engine: Any) -> list[int]:
    """Token counts where the engine switches code path (CPU fp32: small-batch weights, padding)."""
    device = engine.args.resolve_device()
    return _code_path_bounds(device.type, str(engine.args.resolve_dtype(device)),
                             engine.args.resolve_small_batch_rows(device), _pad_rows())


def _code_path_bounds(device_type: str, dtype: str, small_rows: int, pad_rows: int = 0) -> list[int]:
    """small_rows: products of at most this many rows take the transposed weight copies (0: none)."""
    from twinserve.backends.real.models.llama import PAD_MIN_ROWS

    if device_type != "cpu" or dtype.replace("torch.", "") != "float32":
        return []
    bounds = [small_rows] if small_rows else []
    # Products of PAD_MIN_ROWS..pad_rows-1 rows that F.linear runs cost what pad_rows rows cost.
    lo = max(PAD_MIN_ROWS, small_rows + 1)
    if pad_rows and lo < pad_rows:
        bounds += [lo - 1, pad_rows - 1]
    return sorted(set(bounds))


def _pad_rows() -> int:
    from twinserve.backends.real.models.llama import PAD_ROWS

    return PAD_ROWS


def graph_max_decodes(device_type: str, enforce_eager: bool, attention_backend: str | None,
                      max_num_seqs: int) -> int | None:
    """The largest decode batch an engine so configured replays from a CUDA graph (the worker's
    rule: CUDA, not eager, a backend with supports_cuda_graphs), or None when it runs eagerly."""
    from twinserve.backends.real.attention import backend_name
    from twinserve.backends.real.cuda_graphs import graph_buckets

    # Only the Triton backend's launches are graph-safe (TritonPagedAttention.supports_cuda_graphs).
    if device_type != "cuda" or enforce_eager or backend_name(attention_backend, device_type) != "triton":
        return None
    return graph_buckets(max_num_seqs)[-1]


def _comm_share(rows: list[dict[str, Any]]) -> float:
    """Tensor parallelism: the share of step time spent in collectives (rank 0's host time)."""
    comm = sum(float((r.get("extra") or {}).get("comm_time_s", 0.0)) for r in rows)
    total = sum(float(r["step_time_s"]) for r in rows)
    return comm / total if total > 0 else 0.0


def fitter(base: Sequence[int], candidates: Sequence[int],
           graph_max: int | None) -> Callable[..., FittedCostModel]:
    """Step-log rows (and profile meta) to a profile, as calibrate fits them: token-count
    breakpoints chosen among the candidates on top of the code path's own (base), then the fit."""
    def fit(rows: list[dict[str, Any]], **meta: Any) -> FittedCostModel:
        bounds = select_regimes(rows, base, candidates, graph_max_decodes=graph_max)
        return fit_step_profile(rows, regime_max_tokens=bounds, graph_max_decodes=graph_max, **meta)
    return fit


@dataclass(slots=True)
class Prepared:
    """One calibration's step log as this version fits it: drift-corrected (`rows` at the
    machine's `ref` speed: the reference sample's or probe's seconds, None uncorrected; their
    prefill shares at `prefill_ref`, the prefill sampler's, where it sampled), the steps after
    idle gaps apart (`wake`), and the fit that suits its engine."""

    profile: FittedCostModel
    prov: dict[str, Any]
    note: dict[str, Any]
    rows: list[dict[str, Any]]
    wake: list[tuple[float, list[dict[str, Any]]]]
    fit: Callable[..., FittedCostModel]
    ref: float | None
    prefill_ref: float | None = None


def prepare(profile_path: str | Path, steps_path: str | Path | None = None) -> Prepared:
    """A calibrated profile's step log (the `.steps.csv` beside it, or steps_path), corrected
    for the machine's drift as this version corrects it (refit's first half)."""
    from twinserve.backends.real.step_log import read_step_log

    old = FittedCostModel.load(profile_path)
    prov = dict(old.meta.get("provenance") or {})
    if prov.get("merged_from"):
        raise ProfileError(f"{profile_path} was merged from {len(prov['merged_from'])} calibrations and has no "
                           "step log of its own: merge their profiles again (twinserve calibrate --merge)")
    steps = Path(steps_path) if steps_path else resolve_profile(profile_path).with_suffix(".steps.csv")
    rows = read_step_log(steps)
    probes = prov.get("speed_probes") or []
    t0 = prov.get("speed_probe_t0")
    note: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "git_commit": _git_commit(), "step_log": steps.name,
                            "previous_fit": {k: (old.meta.get("fit") or {}).get(k) for k in ("r2", "mape")}}
    samples, s0 = prov.get("speed_samples") or [], prov.get("speed_sample_t0")
    if samples and s0 is not None:
        # As calibrate now does: the samples' own time out of the steps' gaps. Calibrations
        # made before it fitted that time as the engine's overhead.
        rows = without_sample_pauses(rows, samples + (prov.get("prefill_speed_samples") or []), t0=s0)
    eng = prov.get("engine") or {}
    device_type = str(prov.get("device", "cpu")).split(":")[0]
    graph_max = eng.get("cuda_graph_max_batch")
    if "cuda_graph_max_batch" not in eng:  # profiles made before it was recorded
        graph_max = graph_max_decodes(device_type, bool(eng.get("enforce_eager")), eng.get("attention_backend"),
                                      int(eng.get("max_num_seqs", 256)))
        if graph_max is not None:
            note["cuda_graph_max_batch_inferred"] = graph_max
    batches = (prov.get("design") or {}).get("decode_batches") or []
    # Profiles made before row padding existed record no pad_rows: their engine padded nothing.
    base = _code_path_bounds(device_type, str(prov.get("dtype", "")), recorded_small_batch_rows(eng, copies=False),
                             int(eng.get("pad_rows") or 0))
    fit = fitter(base, [b for b in batches if 4 < b < max(batches)], graph_max)

    idle = prov.get("idle_steps") or []
    ref: float | None = None
    prefill_ref: float | None = None
    if prov.get("drift_source") == "samples" and samples and s0 is not None:
        # Smoothed as this version smooths, without the samples the steps contradict (the
        # profile's reference sample with them), whatever the first fit did.
        window = float(prov.get("speed_sample_window_s") or SMOOTH_S)
        timed = [(s0 + float(rel), float(sec)) for rel, sec in samples]
        dropped = contradicted_samples(rows, timed, fit, idle, window)
        if dropped != (prov.get("speed_samples_dropped") or []):
            note["speed_samples_dropped_was"] = prov.get("speed_samples_dropped") or []
        prov["speed_samples_dropped"] = dropped
        kept = [x for i, x in enumerate(timed) if i not in set(dropped)]
        prefill = [(s0 + float(rel), float(sec)) for rel, sec in prov.get("prefill_speed_samples") or []]
        if len(prefill) >= 2:
            rows, ref, prefill_ref = correct_drift_split(rows, kept, prefill, window)
            prov["prefill_speed_sample_s"] = prefill_ref
        else:
            rows, ref = correct_drift_by_samples(rows, kept, window)
        prov["speed_sample_s"] = ref
        if prov.get("speed_sample_smoothing", "mean") != DEFAULT_SMOOTHING:
            note["speed_sample_smoothing_was"] = prov.get("speed_sample_smoothing", "mean")
        prov["speed_sample_smoothing"] = DEFAULT_SMOOTHING
    elif prov.get("drift_corrected") and len(probes) >= 2:
        if t0 is None:  # profiles made before t0 was recorded: the first probe ran just before step 1
            t0 = min(float(r["start_s"]) for r in rows)
            note["speed_probe_t0_estimated"] = True
        rows, ref = correct_drift(rows, [(t0 + float(rel), float(sec)) for rel, sec in probes])
    # Logs made before the design had idle points have none: their profiles price no wake.
    rows, wake = split_wake(rows, idle)
    return Prepared(old, prov, note, rows, wake, fit, ref, prefill_ref)


def refit(profile_path: str | Path, steps_path: str | Path | None = None) -> FittedCostModel:
    """A calibrated profile fitted again by this version's fit, from the step log it was made from.

    The log is the `.steps.csv` that calibrate wrote beside the profile (or steps_path). The
    provenance is kept; the drift correction is redone from its speed samples (smoothed and
    checked against the steps as this version does: the reference sample and the samples left
    out are updated) or its probes; the code-path regimes come from the recorded engine
    settings (a CUDA engine that did not run eagerly replayed decode batches of up to its
    largest bucket from graphs). So a change to the cost model can be judged on a device's
    measurements after the device is gone.
    """
    p = prepare(profile_path, steps_path)
    prov, note = p.prov, p.note
    if prov.get("refit"):  # an earlier refit's note, kept (its previous_fit is the first fit's)
        note["earlier_refit"] = prov["refit"]
    meta = {k: v for k, v in p.profile.meta.items() if k not in ("fit", "provenance", "format")}
    profile = p.fit(p.rows, **meta, provenance={**prov, "refit": note})
    profile.meta["fit"]["comm_share"] = _comm_share(p.rows)
    fit_wake(profile, p.wake)
    return profile


# What calibrations must share to be fitted as one: the model and the machine's kind, how the
# engine ran (threads, dtype, limits, code paths) and how its speed was measured.
MERGE_KEYS = ("engine_model", "device", "dtype", "quantization", "tensor_parallel_size", "engine_core_mode",
              "threads", "engine", "drift_source", "speed_sampler")


def _share_scale(row: dict[str, Any], k: float, k_prefill: float) -> float:
    """A step's scale with its prefill share (prefill tokens over its tokens) at k_prefill."""
    pt = float(row["num_prefill_tokens"])
    return share_mix(k, k_prefill, pt, pt + float(row["num_decode_seqs"]))


def merge(profile_paths: Sequence[str | Path]) -> FittedCostModel:
    """One profile fitted on the step logs of several calibrations of one engine.

    A calibration prices the machine at its own reference speed (the median speed sample,
    or probe), and on this project's VM two calibrations minutes to hours apart priced the
    same runs' steps up to 5.4% apart even so (docs/twin-log.md, "Several calibrations,
    fitted as one").
    Each log is corrected as refit corrects it, its times scaled to the median of the
    calibrations' references, and all are fitted together, so the profile stands on several
    of the machine's moods rather than one.
    """
    paths = list(profile_paths)
    if len(paths) < 2:
        raise InvalidConfigError("merge", paths, "two or more calibrated profiles")
    parts = [prepare(p) for p in paths]
    first = parts[0]
    for path, part in zip(paths[1:], parts[1:]):
        for key in MERGE_KEYS:
            a, b = first.prov.get(key), part.prov.get(key)
            if a != b:
                raise ProfileError(f"{path}: {key} is {b!r} where {paths[0]} has {a!r}; merge calibrations "
                                   "of one engine, run the same way")
        if first.profile.model != part.profile.model:
            raise ProfileError(f"{path} was calibrated for model {part.profile.model!r}, {paths[0]} for "
                               f"{first.profile.model!r}")
        if first.profile.meta.get("hardware") != part.profile.meta.get("hardware"):
            raise ProfileError(f"{path} was calibrated on {part.profile.meta.get('hardware')!r}, {paths[0]} on "
                               f"{first.profile.meta.get('hardware')!r}; merge calibrations of one machine")
    for path, part in zip(paths, parts):
        if not part.ref:
            raise ProfileError(f"{path}: its steps were not corrected for the machine's speed (no speed "
                               "samples or probes), so there is no reference to merge it by")
    by_samples = first.prov.get("drift_source") == "samples"
    common = float(np.median([p.ref for p in parts]))
    # Prefill shares at the median of the prefill sampler's references, where every
    # calibration took prefill samples; else the steps are priced by the weights samples alone.
    split = by_samples and all(p.prefill_ref for p in parts)
    common_p = float(np.median([p.prefill_ref for p in parts])) if split else None
    rows: list[dict[str, Any]] = []
    wake: list[tuple[float, list[dict[str, Any]]]] = []
    sources = []
    for path, part in zip(paths, parts):
        k = common / float(part.ref)  # every part has a reference: checked above
        k_p = common_p / float(part.prefill_ref) if split else k
        rows += [_scaled(r, _share_scale(r, k, k_p)) for r in part.rows]
        wake += [(gap, [_scaled(r, _share_scale(r, k, k_p)) for r in steps]) for gap, steps in part.wake]
        sources.append({"profile": str(path), "date": part.prov.get("date"), "wall_s": part.prov.get("wall_s"),
                        "num_steps": len(part.rows), "reference_s": part.ref, "scaled_by": k,
                        **({"prefill_reference_s": part.prefill_ref, "prefill_scaled_by": k_p} if split else {}),
                        "speed_samples_dropped": len(part.prov.get("speed_samples_dropped") or [])})
    # Per calibration, not of the whole: the samples, probes and idle steps stay in its own file.
    prov = {k: v for k, v in first.prov.items()
            if k not in ("speed_samples", "speed_sample_t0", "speed_samples_dropped", "speed_probes",
                         "prefill_speed_samples", "prefill_speed_sample_s", "prefill_speed_sampler",
                         "speed_probe_t0", "speed_probe_drift", "idle_steps", "refit", "note", "host_load",
                         "git_commit", "date", "wall_s")}
    prov.update(made_by="twinserve calibrate --merge", merged_from=sources, git_commit=_git_commit(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                wall_s=round(sum(float(p.prov.get("wall_s") or 0.0) for p in parts), 1))
    if by_samples:
        prov["speed_sample_s"] = common
        if split:
            prov.update(prefill_speed_sample_s=common_p, prefill_speed_sampler=first.prov.get("prefill_speed_sampler"))
        # Each calibration's probe, at the common reference speed (fidelity --speed-from probes).
        probe = [float(p.prov["speed_probe_s"]) * s["scaled_by"] for p, s in zip(parts, sources)
                 if p.prov.get("speed_probe_s")]
        prov["speed_probe_s"] = float(np.median(probe)) if probe else None
    else:
        prov["speed_probe_s"] = common
    probe_parts = [(p.prov["speed_probe_parts"], s["scaled_by"]) for p, s in zip(parts, sources)
                   if p.prov.get("speed_probe_parts")]
    if probe_parts:
        prov["speed_probe_parts"] = {f: float(np.median([pp[f] * k for pp, k in probe_parts]))
                                     for f in ("decode_s", "prefill_s")}
    meta = {k: v for k, v in first.profile.meta.items() if k not in ("fit", "provenance", "format")}
    # One engine, so one code path: the first calibration's fit (its design's breakpoint candidates).
    profile = first.fit(rows, **meta, provenance=prov)
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    fit_wake(profile, wake)
    return profile


def calibrate(engine: Any, design: CalibrationDesign | None = None, threads: int | None = None,
              progress: bool = True, seed: int = 0) -> tuple[FittedCostModel, StepLog]:
    """Run the design on engine and fit its profile (with diagnostics and provenance)."""
    import torch

    a = engine.args
    sc = engine.scheduler_config
    if not sc.enable_prefix_caching:
        raise InvalidConfigError("enable_prefix_caching", False,
                                 "True for calibration (cached-context chunks come from prefix hits)")
    design = (design or CalibrationDesign()).for_limits(sc.max_num_seqs, sc.max_num_batched_tokens,
                                                        sc.max_model_len)
    # The code that runs the design: read now, since a commit may land while it runs.
    commit = _git_commit()
    wall = time.perf_counter()
    host = HostLoad()
    cal = Calibrator(engine, seed)
    if design.sample_every_s > 0:
        cal.sampler = sampler_for(engine, design.sampler)
        cal.sample_clock = SampleClock(design.sample_every_s)
        if cal.sampler is not None and design.prefill_samples:
            cal.prefill_sampler = prefill_sampler_for(engine)
    if design.probe_every is None:
        design = replace(design, probe_every=0 if cal.sampler is not None else PROBE_EVERY)
    log = cal.run(design, progress)
    wall = time.perf_counter() - wall
    host_load = host.result()
    cfg = engine.model_config
    device = engine.args.resolve_device()
    tp = engine.args.tensor_parallel_size
    name = catalog_name(cfg, engine.model_name)
    # Breakpoints: the engine's own code-path switch, plus batch sizes where the measured
    # cost per row changes slope (candidates from the design's decode batches).
    graph_max = graph_max_decodes(device.type, a.enforce_eager, a.attention_backend, sc.max_num_seqs)
    fit = fitter(regime_bounds(engine), [b for b in design.decode_batches if 4 < b < max(design.decode_batches)],
                 graph_max)
    # The drift correction: by the speed samples taken all through the design when there are
    # some (a CPU engine in this process), else by the probes between design points.
    by_samples = len(cal.samples) >= 2
    dropped: list[int] = []
    prefill_ref: float | None = None
    # The samples' own time is the measurement's, not the engine's (without_sample_pauses).
    steps = without_sample_pauses(log.rows(), cal.samples + cal.prefill_samples)
    if by_samples:
        dropped = contradicted_samples(steps, cal.samples, fit, cal.idle_steps)
        kept = [x for i, x in enumerate(cal.samples) if i not in set(dropped)]
        if len(cal.prefill_samples) >= 2:
            rows, sample_ref, prefill_ref = correct_drift_split(steps, kept, cal.prefill_samples)
        else:
            rows, sample_ref = correct_drift_by_samples(steps, kept)
        probe_ref = float(np.median([sec for _, sec in cal.probes])) if cal.probes else float("nan")
    else:
        rows, probe_ref = correct_drift(steps, cal.probes)
    rows, wake = split_wake(rows, cal.idle_steps)
    probe_secs = [sec for _, sec in cal.probes]
    profile = fit(
        rows, model=name,
        hardware=device_name(device), tensor_parallel_size=tp,
        provenance={
            "made_by": "twinserve calibrate",
            "engine_model": engine.model_name,
            "device": str(device),
            "dtype": str(engine.args.resolve_dtype(device)).replace("torch.", ""),
            "quantization": engine.args.quantization,
            "tensor_parallel_size": tp,
            # In process or in a process of its own: the two pace steps differently (step_log.py).
            "engine_core_mode": engine.core_mode,
            # The host CPU's kernel features (a CPU profile's prices depend on them).
            "cpu": cpu_features(),
            "threads": threads if threads is not None else torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "git_commit": commit,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(wall, 1),
            # Other processes' share of the CPUs it ran on (hostload.py): a noisy neighbour.
            "host_load": host_load,
            # The machine's speed while calibrating (calibrate.speed_probe): the median probe
            # (which the step times were corrected to when drift_source is "probes"), every
            # probe (seconds into the run), and the spread of the probes (slowest / fastest - 1).
            "speed_probe_s": probe_ref if probe_secs else None,
            "speed_probes": [[round(t - cal.probes[0][0], 6), round(sec, 9)] for t, sec in cal.probes],
            # The first probe on the step log's clock (start_s), so a refit can redo the correction.
            "speed_probe_t0": cal.probes[0][0] if cal.probes else None,
            "speed_probe_drift": max(probe_secs) / min(probe_secs) - 1 if probe_secs else None,
            # The median of each part, which fidelity compares its own probes' parts with.
            "speed_probe_parts": ({"decode_s": float(np.median([p.decode_s for p in cal.probe_parts])),
                                   "prefill_s": float(np.median([p.prefill_s for p in cal.probe_parts]))}
                                  if cal.probe_parts else None),
            "drift_corrected": by_samples or len(probe_secs) >= 2,
            "drift_source": "samples" if by_samples else "probes",
            # The speed samples (speedtrace.py): the median smoothed sample, which the step times
            # were corrected to and fidelity's sampled speed is measured against, and every
            # sample (seconds after the first, seconds taken), the first on the step log's clock;
            # their period is the design's sample_every_s, their kind speed_sampler.
            "speed_sample_s": sample_ref if by_samples else None,
            "speed_sampler": cal.sampler.kind if by_samples and cal.sampler is not None else None,
            "speed_samples": [[round(t - cal.samples[0][0], 6), round(sec, 9)] for t, sec in cal.samples],
            "speed_sample_t0": cal.samples[0][0] if cal.samples else None,
            "speed_sample_window_s": SMOOTH_S,
            "speed_sample_smoothing": DEFAULT_SMOOTHING,
            # The samples the steps around them contradicted (contradicted_samples), by index:
            # left out of the correction and the reference.
            "speed_samples_dropped": dropped,
            # The prefill sampler's (speedtrace.PrefillSampler), each taken right after a speed
            # sample, on the same clock: the median smoothed one, which the steps' prefill shares
            # were corrected to (correct_drift_split), and every one.
            "prefill_speed_sample_s": prefill_ref,
            "prefill_speed_sampler": cal.prefill_sampler.kind if prefill_ref is not None else None,
            "prefill_speed_samples": [[round(t - cal.samples[0][0], 6), round(sec, 9)]
                                      for t, sec in cal.prefill_samples],
            # Steps that followed an idle gap (index in the step log, seconds): priced by "wake".
            "idle_steps": [list(m) for m in cal.idle_steps],
            "engine": {"block_size": a.block_size, "max_num_seqs": sc.max_num_seqs,
                       "max_num_batched_tokens": sc.max_num_batched_tokens,
                       "small_batch_weights": a.small_batch_weights,
                       "small_batch_rows": a.resolve_small_batch_rows(), "prepack_weights": a.prepack_weights,
                       "attention_backend": a.attention_backend, "enforce_eager": a.enforce_eager,
                       "cuda_graph_max_batch": graph_max, "pad_rows": _pad_rows()},
            "design": asdict(design),
        })
    profile.meta["fit"]["comm_share"] = _comm_share(rows)
    fit_wake(profile, wake)
    return profile, log
