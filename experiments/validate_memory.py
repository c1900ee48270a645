"""A `simulate validate` worker's resident memory over the costliest studies, with and without replacing
a worker that holds too much after a study (sim.runner._Workers, sim.validate_cli.WORKER_RSS_LIMIT).

    python experiments/validate_memory.py --first 100 --count 40 --workers 2 --limit-gb 0 1.5

Runs the unique studies ranked first..first+count-1 by cost (the order the command starts them in),
once per --limit-gb (0: workers never replaced, as before), each through sim.runner.run_jobs; prints
every study's worker, CPU seconds and the worker's VmRSS after it, then per limit: the most resident
memory a worker held, worker processes used, and the studies' worker CPU seconds (sum of sim_cpu_s).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from validate_speed import unique_rows  # this folder: a script's own is on sys.path

from twinserve.sim.runner import run_jobs
from twinserve.sim.validate import simulate_row


def _status(field: str) -> float:
    """A /proc/self/status figure in GB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6
    return 0.0


def measured(job: tuple) -> dict:
    """simulate_row and the worker's memory after it."""
    r = simulate_row(job)
    return {"id": job[0]["id"], "cpu_s": r["sim_cpu_s"], "pid": os.getpid(), "rss_gb": _status("VmRSS"),
            "hwm_gb": _status("VmHWM")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first", type=int, default=0, help="rank of the first study (0: the costliest)")
    p.add_argument("--count", type=int, default=20, help="studies run")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--limit-gb", type=float, nargs="+", default=[0.0, 1.5],
                   help="worker memory limits to compare, GB (0: never replaced)")
    args = p.parse_args()
    rows = unique_rows("roofline")[args.first:args.first + args.count]
    jobs = [(r, "roofline") for r in rows]
    for limit in args.limit_gb:
        t0 = time.perf_counter()
        out = run_jobs(measured, jobs, [{"row": r["id"]} for r in rows], args.workers, None, "memory", False,
                       max_worker_rss=int(limit * 1e9) or None)
        wall = time.perf_counter() - t0
        for d in out:
            print(json.dumps({"limit_gb": limit, **d}) if isinstance(d, dict) else f"failed: {d}")
        ok = [d for d in out if isinstance(d, dict)]
        print(json.dumps({"limit_gb": limit, "studies": len(ok), "max_rss_gb": max(d["rss_gb"] for d in ok),
                          "max_hwm_gb": max(d["hwm_gb"] for d in ok), "workers_used": len({d["pid"] for d in ok}),
                          "cpu_s": round(sum(d["cpu_s"] for d in ok), 1), "wall_s": round(wall, 1),
                          "load": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
