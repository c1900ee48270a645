"""The collector's settings while a simulation runs, and freeing a finished run without it.

A prefix-cached run holds millions of long-lived objects that full collections would walk
(10-20% of a run), so during a run existing objects are frozen and only the youngest generation
collected: what outlives it (blocks, requests, their lists) is the run's world, and walking it again
in the middle generation found no garbage (0-26 objects a run of 25,000 requests, 1-2 s of its CPU;
docs/validate-speed.md). Callers that read a finished run hold the settings until they have freed it
(sim.validate.run_to_window): the first full collection after the run would walk its world.
A finished run's cycles (its KV blocks' free queue, a cluster's suspended SimPy processes) are
broken by recycle_blocks and release_cluster, so reference counting frees the run at once.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any, Iterator

import simpy

# Young collections after this many allocations (CPython's default is 700): fewer passes
# over the step's short-lived objects.
GEN0_THRESHOLD = 20_000


_lock = threading.Lock()
_depth = 0  # simulations running now (threads may run several in one process)
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def simulation_gc() -> Iterator[None]:
    """Freeze what exists, collect only the youngest generation, and restore everything after (re-entrant)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            old = _saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(old[0], GEN0_THRESHOLD), 1 << 30, 1 << 30)
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


def recycle_blocks(cores: list[Any]) -> None:
    """Hand a finished run's KV blocks to the next run's pools (BlockPool.recycle): a run makes
    pools of 10^5-10^7 blocks, and linked in their free queue they are cyclic garbage that only a
    full collection (put off by simulation_gc's frozen generations) would free."""
    for core in cores:
        core.scheduler.kv.pool.recycle()


def release_cluster(sim: Any) -> None:
    """Let reference counting free a finished or stopped cluster run.

    Its SimPy processes are generators suspended for good (a replica waiting for work, the
    dispatcher's next arrival after a stop), and each such generator's frame holds the
    simulation, which holds the process: a cycle. Only the collector frees a cycle, and its
    young collection when simulation_gc ends walks every object the run still holds, each
    request's token lists among them: ~20 ms of a 0.15-0.25 s FP8 8x H200 cluster run (docs/search-speed.md, search56). Closing the generators and emptying the
    event queue breaks the cycles; nothing of the simulation is read after this.
    """
    # SimPy 4's private fields (its queue, a process's generator): read with defaults, so that a
    # SimPy without them only loses this shortcut (the collector frees the run as before).
    queue = getattr(sim.env, "_queue", None)
    queue = queue if isinstance(queue, list) else []
    procs = [rep.process for rep in sim.replicas if getattr(rep, "process", None) is not None]
    for item in queue:  # (time, priority, id, event): what each waiter waits on
        for cb in getattr(item[-1], "callbacks", None) or ():
            owner = getattr(cb, "__self__", None)
            if isinstance(owner, simpy.Process):
                procs.append(owner)
    for proc in procs:
        gen = getattr(proc, "_generator", None)
        if gen is not None:
            gen.close()
    queue.clear()
