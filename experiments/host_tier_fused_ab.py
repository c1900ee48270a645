"""Tier-on simulator CPU with the pool's fused evict-and-store walk against the list then store_many.

    taskset -c 1 python experiments/host_tier_fused_ab.py [--requests N] [--pairs 5]

BlockPool._take_storing (an LRU host tier on one KV group) stores each evicted block as it walks
the free queue; without it the pool lists (block id, key) pairs and HostTier.store_many stores
them after the walk. Both give the same outputs (tests/core/test_host_tier_fused_evict.py); this
times the study with the tier on both ways, interleaved in one process (fused first in odd pairs),
and prints CPU seconds per run, each pair's list / fused ratio and the medians.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time

from twinserve.core.kv import tier_tables
from twinserve.sim.build import build
from twinserve.sim.config import load_config, set_field

_FUSED = tier_tables.TierTables._init_tier


def _unfused(self, host) -> None:
    """_init_tier, then the pool back on the (block id, key) list."""
    _FUSED(self, host)
    if self.host is not None:
        self.pool.tier = None
        self.pool.stores = []


def main(argv: list[str] | None = None) -> int:
    """Interleave fused and list runs of the tier-on study; print CPU seconds and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/host_tier_study.toml", help="study TOML (tier on)")
    ap.add_argument("--requests", type=int, default=None, help="workload.num_requests")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved fused/list pairs")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    if args.requests:
        set_field(cfg, "workload.num_requests", args.requests, "--requests")
    print(f"{args.config}: {cfg.kv_offload.describe()}, {args.pairs} pair(s), "
          f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    cpu: dict[str, list[float]] = {"fused": [], "list": []}
    for i in range(args.pairs):
        for side in ("fused", "list") if i % 2 == 0 else ("list", "fused"):
            tier_tables.TierTables._init_tier = _FUSED if side == "fused" else _unfused
            try:
                built = build(copy.deepcopy(cfg))
            finally:
                tier_tables.TierTables._init_tier = _FUSED
            gc.collect()
            c0 = time.process_time()
            built.simulation.run()
            cpu[side].append(time.process_time() - c0)
        print(f"pair {i + 1}: fused {cpu['fused'][-1]:.3f} s, list {cpu['list'][-1]:.3f} s, "
              f"list / fused {cpu['list'][-1] / cpu['fused'][-1]:.3f}", flush=True)
    ratios = [b / a for a, b in zip(cpu["fused"], cpu["list"])]
    print(f"median CPU: fused {statistics.median(cpu['fused']):.3f} s, list {statistics.median(cpu['list']):.3f} s; "
          f"median list / fused {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
