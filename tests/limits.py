"""Bounds for the loops that drive an engine or a scheduler: a liveness bug fails the test, never hangs it."""

from __future__ import annotations

from typing import Iterator

# More steps than any test's requests need (a few hundred at most), few enough to fail fast.
MAX_STEPS = 10_000


def bounded(limit: int = MAX_STEPS, what: str = "the loop") -> Iterator[int]:
    """range(limit) for a loop that must end by itself (break): running out is an AssertionError."""
    yield from range(limit)
    raise AssertionError(f"{what} did not finish in {limit} steps: the engine stopped making progress")

