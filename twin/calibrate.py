"""`twinserve calibrate`, the measuring phase: designed step shapes run on the real engine.

Points run in shuffled order, with a fixed speed probe between them so calfit.py can remove drift.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

from twinserve.core.errors import InvalidConfigError
from twinserve.core.provenance import git_commit as _git_commit  # noqa: F401 - calfit, calibrations read it here
from twinserve.core.sampling_params import SamplingParams

from twinserve.backends.real.step_log import StepLog


PROBE_EVERY = 12


@dataclass(slots=True)
class CalibrationDesign:
    """The step shapes to measure."""

    prefill_sizes: list[int] = field(default_factory=lambda: [8, 32, 96, 192, 384])
    prefill_contexts: list[int] = field(default_factory=lambda: [0, 192, 448])
    multi_prefill: list[tuple[int, int]] = field(
        default_factory=lambda: [(2, 32), (4, 32), (8, 32), (2, 128), (4, 128)])
    decode_batches: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 24, 32])
    decode_contexts: list[int] = field(default_factory=lambda: [48, 256])
    decode_steps: int = 4
    # (decode batch, prompt tokens[, decode context, default 32])
    mixed: list[tuple[int, ...]] = field(default_factory=lambda: [(4, 64), (8, 192), (16, 64), (16, 256),
                                                                  (8, 448, 256), (24, 448, 256)])
    repeats: int = 1
    # 0: probe only before and after
    probe_every: int = PROBE_EVERY
    # Steps after an idle cost more (docs/twin-log.md).
    idle_gaps: list[float] = field(default_factory=lambda: [0.25, 1.0, 3.0])
    idle_repeats: int = 3
    # Verify steps (only when the engine speculates): batches of sequences at a context, each
    # verifying k drafts a step; priced by the profile's verify term (twin/verifyfit.py).
    verify_batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    verify_contexts: list[int] = field(default_factory=lambda: [96, 320])
    verify_steps: int = 6

    @classmethod
    def quick(cls) -> "CalibrationDesign":
        """A small design for tests and tiny models."""
        return cls([4, 12, 24], [0, 16], [(2, 8), (3, 4)], [1, 2, 4, 6], [8, 24], 3,
                   [(2, 8), (4, 12)], 1, 0, [0.05], 2, [1, 2, 4], [24, 48], 4)

    def for_limits(self, max_num_seqs: int, max_num_batched_tokens: int,
                   max_model_len: int) -> "CalibrationDesign":
        """Drop shapes the engine could not run in one step."""
        fits = lambda q, c: q <= max_num_batched_tokens and q + c + 1 < max_model_len  # noqa: E731
        sizes = [q for q in self.prefill_sizes if fits(q, 0)]
        # A full-budget chunk too: the commonest prefill step under load.
        if sizes and max_num_batched_tokens > max(sizes) and fits(max_num_batched_tokens, 0):
            sizes.append(max_num_batched_tokens)
        longest = max(sizes, default=0)
        return CalibrationDesign(
            sizes,
            # Every size runs after every cached context: the pair must fit.
            [c for c in self.prefill_contexts if c + longest + 1 < max_model_len],
            [(k, q) for k, q in self.multi_prefill
             if k * q <= max_num_batched_tokens and k <= max_num_seqs and fits(q, 0)],
            [b for b in self.decode_batches if b <= max_num_seqs],
            [c for c in self.decode_contexts if 1.5 * c + self.decode_steps + 2 < max_model_len],
            self.decode_steps,
            [m for m in self.mixed if m[0] + 1 <= max_num_seqs and m[0] + m[1] <= max_num_batched_tokens
             and _mixed_context(m) + 8 < max_model_len and fits(m[1], 2)],
            self.repeats, self.probe_every, list(self.idle_gaps), self.idle_repeats,
            [b for b in self.verify_batches if b <= max_num_seqs],
            [c for c in self.verify_contexts if 1.5 * c + 2 * self.verify_steps + 8 < max_model_len
             and c * 1.5 <= max_num_batched_tokens],
            self.verify_steps)

    def reaching(self, max_context: int) -> "CalibrationDesign":
        """This design plus decode and cached contexts that reach max_context tokens."""
        if max_context < 1:
            raise InvalidConfigError("max_context", max_context, ">= 1")
        decode, chunks = list(self.decode_contexts), list(self.prefill_contexts)
        if decode and max_context > 1.5 * max(decode) + self.decode_steps:
            decode.append(-(-2 * (max_context - self.decode_steps) // 3))
        if chunks and self.prefill_sizes and max_context - max(self.prefill_sizes) > max(chunks):
            chunks.append(max_context - max(self.prefill_sizes))
        return replace(self, decode_contexts=decode, prefill_contexts=chunks)

    def covering(self, max_context: int, max_model_len: int | None = None) -> "CalibrationDesign":
        """This design plus decode and cached contexts, each about twice the last, up to max_context
        tokens (and below max_model_len): the fit then has steps along the way, not one far point."""
        if max_context < 1:
            raise InvalidConfigError("max_context", max_context, ">= 1")
        # for_limits keeps decode contexts whose spread plus the steps stays 2 below max_model_len: the
        # ladder starts from those and stops where they would be dropped.
        design, top = self, max_context
        if max_model_len is not None:
            top = min(max_context, max_model_len - 4)
            design = replace(self, decode_contexts=[c for c in self.decode_contexts
                                                    if 1.5 * c + self.decode_steps + 2 < max_model_len])
        while design.decode_contexts:
            reach = int(1.5 * max(design.decode_contexts)) + design.decode_steps
            nxt = design.reaching(min(top, 2 * reach)) if top > reach else design
            if nxt == design:
                break
            design = nxt
        return design

    def reach(self) -> int:
        """The longest context a decode step of this design runs at (its spread's top plus the steps)."""
        return int(1.5 * max(self.decode_contexts)) + self.decode_steps if self.decode_contexts else 0

    def num_points(self, speculative: bool = False) -> int:
        """Design points per repeat (verify points only for an engine that speculates)."""
        return (len(self.prefill_sizes) * len(self.prefill_contexts) + len(self.multi_prefill)
                + (len(self.decode_contexts) if self.decode_batches else 0) + len(self.mixed)
                + len(self.idle_gaps) * self.idle_repeats
                + (len(self.verify_batches) * len(self.verify_contexts) if speculative else 0))


# Steps after an idle gap that cost extra (docs/twin-log.md).
WAKE_STEPS = 2
# Tokens in the block a verify point's prompts repeat.
VERIFY_PERIOD = 16
WAKE_PROMPT = 192


def _spread(batch: int, context: int) -> list[int]:
    """A batch's prompt lengths, evenly over [context/2, 3 context/2]."""
    return [max(1, round(context * (0.5 + (i / (batch - 1) if batch > 1 else 0.5)))) for i in range(batch)]


def _evenly(n: int, k: int, keep: int | None = None) -> list[int]:
    """k of the indices 0..n-1, evenly spaced (one: the middle); `keep` replaces the nearest pick."""
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
    return point[2] if len(point) > 2 else 32


# Steps a core process may run ahead (MAX_UNCONSUMED_BATCHES plus one in flight).
_CORE_RUN_AHEAD = 3


class Calibrator:
    """Drives an LLMEngine through a design, logging every step in memory."""

    def __init__(self, engine: Any, seed: int = 0) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.vocab = engine.vocab_size
        self._n = 0
        self.log = StepLog(keep=True)
        self.probes: list[tuple[float, float]] = []
        self.probe_parts: list[ProbeParts] = []
        # (log index of the first step after an idle gap, gap seconds)
        self.idle_steps: list[tuple[int, float]] = []
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

    def _drain(self, max_steps: int | None = None) -> None:
        # Count core steps: over a core process one step() may run several, or none.
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
        """The speed probe now (fresh prompts, so cached bases stay cached)."""
        t = time.monotonic()
        parts = speed_probe_parts(self.engine, seed=self.rng.randrange(1 << 30), reset_prefix_cache=False)
        if parts is not None:
            self.probes.append(((t + time.monotonic()) / 2, parts.total))
            self.probe_parts.append(parts)

    def prefill_single(self, q: int, context: int, base: list[int]) -> None:
        """One chunk of q new tokens after `context` cached ones of base."""
        self._add(base[:context] + self._tokens(q), 1)
        self._drain()

    def multi_prefill(self, k: int, q: int) -> None:
        """k prompts of q tokens admitted together."""
        for _ in range(k):
            self._add(self._tokens(q), 1)
        self._drain()

    def decode(self, batch: int, context: int, steps: int) -> None:
        """`batch` spread prompts, then `steps` decodes of the whole batch."""
        lens = _spread(batch, context)
        # Early prompts decode while the rest prefill, so each must outlive the whole prefill.
        room = max(self.engine.scheduler_config.max_num_batched_tokens - batch, 1)
        prefill_steps = -(-sum(lens) // room)
        for n in lens:
            self._add(self._tokens(n), steps + prefill_steps + 1)
        self._drain()

    def _fits(self, batch: int, context: int, steps: int) -> bool:
        """Whether `batch` sequences spread around `context` fit the engine's KV cache (with slack)."""
        sc = self.engine.scheduler_config
        blocks = sum(-(-(n + steps + 8) // sc.block_size) for n in _spread(batch, context))
        return blocks <= 0.9 * sc.num_blocks

    def decode_sweep(self, batches: Sequence[int], context: int, steps: int) -> None:
        """Every batch size decoding `steps` times at one context, largest first.

        One prefill of the largest batch serves every size: each smaller one aborts the rest.
        """
        order = sorted({b for b in batches if b > 0}, reverse=True)
        if not order:
            return
        lens = _spread(order[0], context)
        room = max(self.engine.scheduler_config.max_num_batched_tokens - order[0], 1)
        prefill_steps = -(-sum(lens) // room)
        # Outlive the prefill, every size's decodes and a core's run-ahead.
        ahead = 0 if getattr(self.engine, "core_mode", "inproc") == "inproc" else _CORE_RUN_AHEAD
        budget = prefill_steps + (steps + ahead + 1) * len(order) + 1
        live = [self._add(self._tokens(n), budget) for n in lens]
        # The middle prompt stays in every batch, so the single decode runs at the design's context.
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
                # A core process may log several steps per step(), or none.
                done += sum(1 for r in self.log.records[seen:]
                            if r.num_prefill_tokens == 0 and r.num_decode_seqs == b)
                seen = len(self.log.records)
        self.engine.abort_request(live)
        self._drain()

    def mixed(self, batch: int, q: int, context: int = 32) -> None:
        """A decode batch running when a q-token prompt arrives: one mixed step, then decodes."""
        # A core process runs ahead: the batch lives longer so the prompt still meets it.
        ahead = 0 if getattr(self.engine, "core_mode", "inproc") == "inproc" else _CORE_RUN_AHEAD
        # As in decode(): outlive the batch's multi-step prefill.
        room = max(self.engine.scheduler_config.max_num_batched_tokens - batch, 1)
        prefill_steps = -(-batch * context // room)
        for _ in range(batch):
            self._add(self._tokens(context), 4 + ahead + prefill_steps)
        self._drain(max_steps=prefill_steps + 1)
        self._add(self._tokens(q), 2)
        self._drain()

    def _repeating(self, n: int) -> list[int]:
        """n tokens that repeat a short random block, so prompt lookup always finds a match."""
        block = self._tokens(min(VERIFY_PERIOD, max(2, n // 4)))
        return (block * (n // len(block) + 1))[:n]

    def verify(self, batch: int, context: int, steps: int, k: int, disable: int = 0) -> None:
        """`batch` repeating prompts around `context`, then `steps` steps that verify drafts for all."""
        if disable and batch >= disable:
            return  # the engine drafts nothing at this batch size
        lens = _spread(batch, context)
        room = max(self.engine.scheduler_config.max_num_batched_tokens - batch, 1)
        prefill_steps = -(-sum(lens) // room)
        ahead = 0 if getattr(self.engine, "core_mode", "inproc") == "inproc" else _CORE_RUN_AHEAD
        # Every step may accept all k drafts: the budget outlives that, the prefill and a core's run-ahead.
        budget = (steps + ahead + 2) * (k + 1) + prefill_steps
        with drafting(self.engine, True):
            live = [self._add(self._repeating(n), budget) for n in lens]
            seen, done, tries = len(self.log.records), 0, prefill_steps + 4 * (steps + ahead) + 4
            while done < steps and tries and self.engine.has_unfinished_requests():
                self._step()
                tries -= 1
                done += sum(1 for r in self.log.records[seen:] if r.num_spec_reqs == batch)
                seen = len(self.log.records)
            self.engine.abort_request(live)
            self._drain()

    def after_idle(self, seconds: float) -> None:
        """Idle this long, then a fresh prompt's prefill and decodes."""
        self._drain()  # a core process may still owe an answer
        time.sleep(seconds)
        self.idle_steps.append((len(self.log.records), seconds))
        n = min(WAKE_PROMPT, self.engine.scheduler_config.max_model_len - WAKE_STEPS - 4)
        self._add(self._tokens(n), WAKE_STEPS + 2)
        self._drain()

    def run(self, design: CalibrationDesign, progress: bool = True) -> StepLog:
        """Warm up, then every design point `repeats` times."""
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
            # At long contexts only the batches whose sequences fit the KV cache together.
            batches = [b for b in design.decode_batches if self._fits(b, c, design.decode_steps)] or [1]
            points.append((f"decodes c={c}",
                           lambda c=c, batches=batches: self.decode_sweep(batches, c, design.decode_steps)))
        for m in design.mixed:
            b, q, c = m[0], m[1], _mixed_context(m)
            points.append((f"mixed b={b} q={q} c={c}", lambda b=b, q=q, c=c: self.mixed(b, q, c)))
        for g in design.idle_gaps:
            points += [(f"idle {g:g} s", lambda g=g: self.after_idle(g))] * design.idle_repeats
        args = getattr(self.engine, "args", None)
        spec = args.speculative_config if args is not None else None
        # Verify points for ngram only: a draft model's own forwards would land in the verify term.
        for b in design.verify_batches if spec is not None and spec.method == "ngram" else []:
            for c in design.verify_contexts:
                points.append((f"verify b={b} c={c}", lambda b=b, c=c: self.verify(
                    b, c, design.verify_steps, spec.num_speculative_tokens, spec.disable_by_batch_size)))
        with drafting(self.engine, False):
            return self._run(points, len(bases), design, progress)

    def _run(self, points: list[tuple[str, Callable[[], None]]], num_bases: int, design: CalibrationDesign,
             progress: bool) -> StepLog:
        self.warm_up()
        todo = list(points[:num_bases])
        for _ in range(max(design.repeats, 1)):
            rest = points[num_bases:]
            self._order_rng.shuffle(rest)
            todo += rest
        from tqdm import tqdm

        self._probe()
        with tqdm(total=len(todo), desc="calibrate", unit="pt", disable=not progress) as bar:
            for i, (name, fn) in enumerate(todo, 1):
                bar.set_postfix_str(name)
                fn()
                if design.probe_every and i % design.probe_every == 0:
                    self._probe()
                bar.update()
        self._probe()
        return self.log


@dataclass(slots=True)
class ProbeParts:
    """The speed probe: bandwidth-bound decode and compute-bound prefill."""

    decode_s: float   # median 4-sequence decode step, times ten
    prefill_s: float  # median 128-token prefill

    @property
    def total(self) -> float:
        """The probe's seconds (what `speed_probe` returns)."""
        return self.decode_s + self.prefill_s


def speed_probe_parts(engine: Any, seed: int = 1234, reset_prefix_cache: bool = True,
                      rounds: int = 3) -> ProbeParts | None:
    """Per round six 4-sequence decodes and a 128-token prefill; medians (None: does not fit)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sc = engine.scheduler_config
    if sc.max_num_batched_tokens < 128 or sc.max_num_seqs < 4 or sc.max_model_len < 256:
        return None
    # The probe must compute every token: a cold cache or a fresh seed.
    if reset_prefix_cache:
        cold_prefix_cache(engine)
    cal = Calibrator(engine, seed)
    probe_log = StepLog(keep=True)
    previous = engine.step_log
    engine.set_step_log(probe_log)
    try:
        with drafting(engine, False):  # the probe times plain steps, as calibration's did
            for _ in range(rounds):
                cal.decode(4, 128, 6)
                cal.prefill_single(128, 0, [])
    finally:
        engine.set_step_log(previous)
    decodes = sorted(r.step_time_s for r in probe_log.records if r.num_prefill_seqs == 0)
    prefills = sorted(r.step_time_s for r in probe_log.records
                      if r.num_prefill_tokens == 128 and r.num_decode_seqs == 0)
    return ProbeParts(decodes[len(decodes) // 2] * 10, prefills[len(prefills) // 2])


# Probe spread (slowest / fastest - 1) past which drift correction is doubtful.
PROBE_DRIFT_WARN = 0.15


def drift_warning(provenance: dict[str, Any]) -> str | None:
    """A one-line warning when calibration's speed probes disagree by more than PROBE_DRIFT_WARN."""
    drift = provenance.get("speed_probe_drift")
    if drift is None or drift <= PROBE_DRIFT_WARN:
        return None
    secs = [s for _, s in provenance.get("speed_probes") or []]
    return (f"warning: the machine's speed moved {drift:.0%} during calibration (speed probes "
            f"{min(secs):.3f}-{max(secs):.3f} s), so the profile is only as good as the drift "
            "correction between probes: calibrate again on a quieter machine or core")


@contextlib.contextmanager
def drafting(engine: Any, on: bool) -> Iterator[None]:
    """A speculating engine drafts (on) or runs plain steps (off) inside; others are left alone.

    SmolLM2 copies even random prompts, so n-gram drafts would turn calibration's plain points into
    verify steps."""
    args = getattr(engine, "args", None)
    if args is None or args.speculative_config is None:
        yield
        return
    before = engine.set_drafting(on)
    try:
        yield
    finally:
        engine.set_drafting(before)


def cold_prefix_cache(engine: Any) -> None:
    """Drain what the engine still owes, then forget every cached prefix."""
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_prefix_cache()
