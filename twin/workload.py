"""The workload both sides serve: the options that make it, fresh identical copies, and its hash.

Both sides get the same arrivals, lengths (outputs forced, EOS ignored), token ids and scheduler config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from twinserve.sim.config import load_config
from twinserve.sim.errors import TraceError
from twinserve.sim.workload import Workload, WorkloadConfig

from twinserve.twin.preflight import FidelityError


@dataclass(slots=True)
class FidelityOptions:
    """What to serve and how often."""
    profile: str
    trace: str | None = None
    config: str | None = None          # a study TOML whose [workload] table is served
    num_requests: int = 40
    rate: float | None = None          # Poisson arrivals; None = the trace's own timestamps
    time_scale: float = 1.0            # trace timestamps are multiplied by this
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    seed: int = 0
    trace_offset: int = 0              # trace rows skipped first (timestamps shifted to start at 0)
    allow_profile_mismatch: bool = False
    repeats: int = 3
    # Scale the forecast by a speed probe taken before the first run; off: the profile's own speed.
    probe: bool = True
    # Also report the runs priced at their own measured speed (never judged).
    nowcast: bool = False
    # Speculating engines: the step log of an earlier, separate run whose acceptance the forecast uses.
    acceptance_from: str | None = None
    # Closed loop (sim/clients.py), on both sides: N clients, think time, warm-up left out.
    max_concurrency: int | None = None
    think_time_s: float = 0.0
    warmup_requests: int = 0


class CappedWorkload(Workload):
    """A workload whose trace lengths are clipped to what the engine can serve in minutes."""

    def __init__(self, cfg: WorkloadConfig, seed: int, max_model_len: int, trace_path: str | None,
                 max_prompt: int | None, max_output: int | None, skip: int = 0) -> None:
        super().__init__(cfg, seed, max_model_len, trace_path)
        self.max_prompt = max_prompt
        self.max_output = max_output
        self.skip = skip

    def _rows(self) -> Iterator[tuple]:
        mp, mo = self.max_prompt, self.max_output
        t0: float | None = None
        for k, (arrival, p, o, *rest) in enumerate(super()._rows()):  # rest: where the row came from, its id
            if k < self.skip:
                continue
            if arrival is not None and self.skip:
                t0 = arrival if t0 is None else t0
                arrival -= t0
            if p is not None and mp:
                p = min(p, mp)
            if o is not None and mo:
                o = min(o, mo)
            yield (arrival, p, o, *rest)


def workload_factory(opts: FidelityOptions, max_model_len: int, vocab_size: int) -> Callable[[], Workload]:
    """A function making fresh, identical copies of the workload (one per side and run)."""
    unit_stated = False  # a study that states its trace's unit runs any arrival rate it gives
    if opts.config:
        study = load_config(opts.config)
        cfg = dataclasses.replace(study.workload)
        unit_stated = "workload.trace_time_unit" in study.explicit
        if opts.trace:
            cfg.trace = opts.trace
        if opts.rate is not None:
            cfg.rate = opts.rate
        cfg.num_requests = opts.num_requests
    elif opts.trace:
        cfg = WorkloadConfig(num_requests=opts.num_requests,
                             arrival="trace" if opts.rate is None else "poisson",
                             rate=opts.rate or 1.0, time_scale=opts.time_scale, trace=opts.trace,
                             prompt_dist="trace", output_dist="trace")
    else:
        raise FidelityError("give a workload: --trace FILE (and --rate R for Poisson arrivals) "
                            "or --config STUDY.toml")
    closed_loop(opts, cfg)
    cfg.on_overlong = "fail"
    cfg.vocab_size = min(cfg.vocab_size, vocab_size) if opts.config else vocab_size
    trace = trace_path(cfg.trace) if cfg.trace else None

    def make() -> Workload:
        w = CappedWorkload(cfg, opts.seed, max_model_len, trace, opts.max_prompt_tokens,
                           opts.max_output_tokens, opts.trace_offset)
        w.check_trace_rate = not unit_stated
        return w
    return make


def closed_loop(opts: FidelityOptions, cfg: WorkloadConfig) -> None:
    """Set the options' closed-loop clients on cfg (a --config's [workload] may have its own)."""
    n = opts.max_concurrency
    if n is not None and n < 1:
        raise FidelityError(f"--max-concurrency {n}: give 1 or more clients")
    if not (0 <= opts.think_time_s < math.inf) or opts.warmup_requests < 0:  # nan fails both
        raise FidelityError(f"--think-time-s {opts.think_time_s:g} and --warmup-requests "
                            f"{opts.warmup_requests}: give finite values >= 0")
    if n is not None:
        cfg.concurrency = n
        cfg.think_time_s = opts.think_time_s
        cfg.warmup_requests = opts.warmup_requests
    elif opts.think_time_s or opts.warmup_requests:
        raise FidelityError("--think-time-s and --warmup-requests need closed-loop clients: "
                            "add --max-concurrency N")
    if cfg.concurrency > 0:
        if opts.rate is not None:
            raise FidelityError(f"--rate {opts.rate:g} and {cfg.concurrency} closed-loop clients: "
                                "give one, --rate R (open loop) or --max-concurrency N")
        cfg.arrival = "poisson"  # unused: clients send when they are free (trace times too)


def trace_path(trace: str) -> str:
    """A trace file's path: 'builtin:NAME' is a trace shipped with twinserve (simulate's and bench's resolver)."""
    from twinserve.sim.trace_paths import UnknownBuiltinTrace, trace_path as resolve

    try:
        return resolve(trace)
    except UnknownBuiltinTrace as e:
        raise FidelityError(f"--trace {trace}: {e}") from None


def longest_request(make: Callable[[], Workload]) -> int:
    """The most tokens one first-turn request holds: prompt plus output (what a calibration must cover)."""
    return max((w.num_prompt_tokens + w.num_output_tokens for w in make().items()), default=1)


def check_workload(make: Callable[[], Workload], max_model_len: int) -> int:
    """Walk the first turns once (lengths only) so a bad trace fails before anything loads."""
    n = 0
    try:
        for _ in make().items():
            n += 1
    except TraceError as e:
        if "max_model_len" in str(e):
            raise FidelityError(f"{e.file}:{e.line}: a request is longer than the engine's "
                                f"max_model_len ({max_model_len}); clip the trace with "
                                "--max-prompt-tokens and --max-output-tokens (for example 512 "
                                "and 96)") from None
        raise
    if n == 0:
        raise FidelityError("the workload has no requests")
    return n


def workload_hash(make: Callable[[], Workload]) -> str:
    """sha256 of the first turns: arrival, lengths and prompt token ids of every request."""
    h = hashlib.sha256()
    wl = make()
    for item in wl.items():
        h.update(json.dumps([item.request_id, round(item.arrival_time, 9), item.num_prompt_tokens,
                             item.num_output_tokens, list(wl.prompt_tokens(item))]).encode())
    return h.hexdigest()


def options_record(opts: FidelityOptions, runs: bool = True) -> dict[str, Any]:
    """The options as fidelity.json records them; runs=False: only those the forecast depends on."""
    # The acceptance source goes in forecast.json's "speculative" record.
    drop = {"profile", "acceptance_from"} | (set() if runs else {"repeats", "nowcast"})
    return {k: v for k, v in dataclasses.asdict(opts).items() if k not in drop}
