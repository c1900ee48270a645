"""How long must a search's runs be? The max rate under the SLOs against the run length.

Prints, for each configuration, the max rate found with runs of N requests for N doubling
from 250, and the change from the previous length: the shortest length whose doubling
moves the answer by less than 5% for every configuration is search.requests_per_run's
default (docs/capacity.md).

    python experiments/search_run_length.py [study.toml] [--grid FIELD=A,B ...]
"""

from __future__ import annotations

import argparse
import time

from twinserve.sim.config import load_config
from twinserve.sim.convergence import with_requests
from twinserve.sim.search import search_rates
from twinserve.sim.study import parse_grid

LENGTHS = (250, 500, 1000, 2000, 4000, 8000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="experiments/llama3_70b_capacity.toml")
    ap.add_argument("--grid", action="append", default=[])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    base = load_config(args.config)
    grid = parse_grid(args.grid) if args.grid else {"engine.hardware": ["H100-SXM", "H200"],
                                                    "engine.tensor_parallel_size": ["4"]}
    slos = {"p99_ttft_s": base.slo.ttft_s, "p99_tpot_s": base.slo.tpot_s}
    prev: dict[str, float] = {}
    print("| requests per run | configuration | max rate (req/s) | change from half the length | wall s |")
    print("|---|---|---|---|---|")
    for n in LENGTHS:
        t0 = time.perf_counter()
        found = search_rates(with_requests(base, n), grid, slos, workers=args.workers, progress=False)
        wall = time.perf_counter() - t0
        for s in found:
            key = ", ".join(f"{k}={v}" for k, v in s.point.items())
            change = f"{(s.lo - prev[key]) / prev[key]:+.1%}" if prev.get(key) else ""
            print(f"| {n} | {key} | {s.lo:.3g} | {change} | {wall:.0f} |", flush=True)
            prev[key] = s.lo


if __name__ == "__main__":
    main()
