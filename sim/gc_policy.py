"""The collector's settings while a simulation runs.

A prefix-cached run holds millions of long-lived objects that full collections would walk
(10-20% of a run), so during a run existing objects are frozen and only young generations collected.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

# Young collections after this many allocations (CPython's default is 700): fewer passes
# over the step's short-lived objects.
GEN0_THRESHOLD = 20_000


_lock = threading.Lock()
_depth = 0  # simulations running now (threads may run several in one process)
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def simulation_gc() -> Iterator[None]:
    """Freeze what exists, collect only young generations, and restore everything after (re-entrant)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            old = _saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(old[0], GEN0_THRESHOLD), old[1], 1 << 30)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
                gc.unfreeze()
