"""Small study builders shared by the simulator tests."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from typing import Any, Iterator

from twinserve.sim.build import simulate
from twinserve.sim.cluster_study import build_cluster
from twinserve.sim.config import StudyConfig, set_field
from twinserve.sim.world import RunResult


def small_config(**fields: Any) -> StudyConfig:
    """A quick study (Llama-2-7B on A100, synthetic lengths) with fields overridden by name."""
    cfg = StudyConfig()
    cfg.engine.model = "Llama-2-7B"
    cfg.engine.hardware = "A100-80GB"
    cfg.workload.num_requests = 150
    cfg.workload.rate = 6.0
    for name, value in fields.items():
        set_field(cfg, name, value)
    return cfg


def run(cfg: StudyConfig) -> RunResult:
    """Simulate and return the raw result."""
    return simulate(cfg)[1]


def run_counting_joins(cfg: StudyConfig, **flags: Any) -> tuple[Any, Any, int]:
    """A cluster study run with its simulation's flags set (join_steps, fast_forward, keep_token_times):
    (the simulation, its result, the join steps it took)."""
    sim = build_cluster(cfg, keep_steps=True).simulation
    for name, value in flags.items():
        setattr(sim, name, value)
    joins = []
    real = sim._join_step

    def spy(rep: Any, t: float) -> Any:
        out = real(rep, t)
        joins.append(out is not None)
        return out

    sim._join_step = spy
    res = sim.run()
    return sim, res, sum(joins)


def fingerprint(result: RunResult) -> tuple:
    """Everything per request and per step, as plain tuples (for exact comparisons)."""
    recs = tuple(dataclasses.astuple(r) for r in result.records)
    return recs, dataclasses.astuple(result.steps), result.num_steps, result.num_preemptions, \
        result.prefix_queries, result.prefix_hits


class Hang(Exception):
    """A simulation ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise Hang in the block after `seconds` of wall time (SIGALRM: the main thread only), so a
    simulation whose clock stalls fails the test instead of hanging the suite."""
    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"the simulation did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    # pytest-timeout's per-test limit runs on the same timer: it resumes after the block.
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def record_answers(monkeypatch: Any, owner: type, name: str) -> list[bool]:
    """Wrap owner.name (a hook that answers None to leave the caller's exact path) for the test; the list
    grows by whether each call answered (not None)."""
    answered: list[bool] = []
    real = getattr(owner, name)

    def spy(self: Any, *args: Any) -> Any:
        got = real(self, *args)
        answered.append(got is not None)
        return got

    monkeypatch.setattr(owner, name, spy)
    return answered
