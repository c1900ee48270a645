"""The collector's settings while a simulation runs.

A prefix-cached simulation holds millions of long-lived objects (one key and one token
tuple per cached block). CPython's full collections walk all of them and cost 10-20% of
a run. Inside a run the oldest generation is left alone: objects alive when the run
starts are frozen (never scanned), and full collections wait until the run ends. Young
generations are still collected, so short-lived cycles are freed as they would be.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

# Young collections after this many allocations (CPython's default is 700): fewer passes
# over the step's short-lived objects.
GEN0_THRESHOLD = 20_000


@contextlib.contextmanager
def simulation_gc() -> Iterator[None]:
    """Freeze what exists, collect only young generations, and restore everything after."""
    was_enabled = gc.isenabled()
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], GEN0_THRESHOLD), old[1], 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
        if not was_enabled:
            gc.disable()
