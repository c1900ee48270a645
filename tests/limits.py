"""Bounds for the loops that drive an engine or a scheduler: a liveness bug fails the test, never hangs it."""

from __future__ import annotations

from typing import Any, Iterator

# More steps than any test's requests need (a few hundred at most), few enough to fail fast.
MAX_STEPS = 10_000


def bounded(limit: int = MAX_STEPS, what: str = "the loop") -> Iterator[int]:
    """range(limit) for a loop that must end by itself (break): running out is an AssertionError."""
    yield from range(limit)
    raise AssertionError(f"{what} did not finish in {limit} steps: the engine stopped making progress")


def engine_steps(engine: Any, limit: int = MAX_STEPS) -> Iterator[list]:
    """Each engine.step()'s outputs while requests remain; AssertionError after limit steps."""
    for _ in bounded(limit, "stepping the engine"):
        if not engine.has_unfinished_requests():
            return
        yield engine.step()
