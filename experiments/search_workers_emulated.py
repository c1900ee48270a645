"""`simulate search --workers N` with its runs made one at a time in this process, returned in
the order N workers would finish them: what the search decides with N workers, reproducibly.

    python experiments/search_workers_emulated.py N LOG.jsonl search --config STUDY.toml \
        --workers N --out DIR

With real workers, which run lands first depends on the machine's load, and with it where the
next searches start, so two runs of the same `--workers 2` search differ by several runs
(docs/search-speed.md, search54: 171-185 runs). Here each run's duration is its own thread CPU
time and a job goes to the worker free soonest, so the order (and the work) moves only when two
finish times nearly tie. LOG gets one line per run (virtual start, CPU s, requests, point,
run length, seed) and a last line with the virtual wall; it prints runs, requests simulated,
run CPU s and that wall. Compare drivers by running it on each tree.
"""

from __future__ import annotations

import heapq
import json
import resource
import sys
import time
from typing import Any, Callable


def main() -> int:
    """Entry point: N and LOG, then `simulate`'s own arguments."""
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    n, log_path = int(sys.argv[1]), sys.argv[2]
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    from twinserve.sim import search_driver
    from twinserve.sim.cli import main as cli_main
    from twinserve.sim.runner import _guarded

    log = open(log_path, "w")
    clock = {"now": 0.0, "free": [0.0] * n}
    totals = {"runs": 0, "requests": 0, "cpu": 0.0}

    class Emulated:
        """search_driver._Local's interface: inline runs, finished in N workers' order."""

        def __init__(self, workers: int) -> None:
            self.pending: list[tuple[float, int, object, Any]] = []
            self.seq = 0

        def submit(self, fn: Callable[[Any], Any], job: Any) -> object:
            c0 = time.thread_time()
            res = _guarded(fn, job)
            dur = time.thread_time() - c0
            free = clock["free"]
            i = min(range(n), key=free.__getitem__)
            start = max(clock["now"], free[i])
            free[i] = start + dur
            handle = object()
            self.seq += 1
            heapq.heappush(self.pending, (start + dur, self.seq, handle, res))
            done = res.get("completed") if isinstance(res, dict) else None
            totals["runs"] += 1
            totals["requests"] += int(done or 0)
            totals["cpu"] += dur
            log.write(json.dumps({"start": start, "cpu_s": dur, "completed": done,
                                  "point": str(job[0]), "requests": job[1].workload.num_requests,
                                  "seed": job[1].run.seed}) + "\n")
            return handle

        def wait(self, handles: list[Any]) -> list[tuple[Any, Any]]:
            finish, _, handle, res = heapq.heappop(self.pending)
            clock["now"] = max(clock["now"], finish)
            return [(handle, res)]

        def close(self) -> None:
            pass

    search_driver._Local = Emulated  # type: ignore[misc, assignment]
    search_driver.search_pool = lambda *a, **k: _null()  # type: ignore[assignment]
    try:
        rc = cli_main()
    finally:
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        log.write(json.dumps({"virtual_wall_s": clock["now"], "process_cpu_s": cpu}) + "\n")
        log.close()
    print(f"emulated {n} workers: {totals['runs']} runs, {totals['requests']:,} requests "
          f"simulated, {totals['cpu']:.1f} CPU s in runs, virtual wall {clock['now']:.1f} s",
          file=sys.stderr)
    return rc


def _null() -> Any:
    import contextlib
    return contextlib.nullcontext()


if __name__ == "__main__":
    sys.exit(main())
