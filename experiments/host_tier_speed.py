"""Simulator speed with the host KV tier on, as a share of its speed with it off, on the same study.

    taskset -c 1 python experiments/host_tier_speed.py [--config experiments/host_tier_study.toml]
        [--requests N] [--rounds 3] [--set FIELD=VALUE ...]

The study runs with [kv_offload] as its TOML sets it ("on") and with the tier off (host_size_gib =
host_blocks = 0), alternating in one process for --rounds rounds so the machine's drift hits both
alike; each figure is simulated requests per wall-second of Simulation.run() (the build left out),
and per CPU-second of this process (steadier than wall time on a shared core). Prints each round,
the best of each side and their ratios (the target: on >= 0.70 x off).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig, load_config, set_field


def speed(cfg: StudyConfig) -> tuple[float, float, int]:
    """Simulated requests per wall-second and per CPU-second of one run, and the requests simulated."""
    built = build(copy.deepcopy(cfg))
    c0, t0 = time.process_time(), time.perf_counter()
    res = built.simulation.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(res.records) / wall, len(res.records) / cpu, len(res.records)


def main(argv: list[str] | None = None) -> int:
    """Alternate tier on and off; print the speeds and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/host_tier_study.toml", help="study TOML (tier on)")
    ap.add_argument("--requests", type=int, default=None, help="workload.num_requests")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="set on both sides")
    args = ap.parse_args(argv)
    on = load_config(args.config)
    for item in args.set:
        name, value = item.split("=", 1)
        set_field(on, name, value, "--set")
    if args.requests:
        set_field(on, "workload.num_requests", args.requests, "--requests")
    if not on.kv_offload.enabled:
        print("the study has no host tier: set kv_offload.host_size_gib", file=sys.stderr)
        return 2
    off = copy.deepcopy(on)
    off.kv_offload.host_size_gib, off.kv_offload.host_blocks = 0.0, 0
    print(f"{args.config}: {on.kv_offload.describe()} vs off, {args.rounds} round(s), requests per wall-second")
    best = {"on": 0.0, "off": 0.0}
    best_cpu = {"on": 0.0, "off": 0.0}
    for i in range(args.rounds):
        row = []
        for name, cfg in (("off", off), ("on", on)) if i % 2 == 0 else (("on", on), ("off", off)):
            s, c, n = speed(cfg)
            best[name] = max(best[name], s)
            best_cpu[name] = max(best_cpu[name], c)
            row.append(f"{name} {s:,.0f} wall / {c:,.0f} CPU ({n} requests)")
        print(f"round {i + 1}: " + ", ".join(row), flush=True)
    ratio = best["on"] / best["off"]
    ratio_cpu = best_cpu["on"] / best_cpu["off"]
    print(f"best: on {best['on']:,.0f}, off {best['off']:,.0f} requests/wall-s; on / off = {ratio:.2f} "
          f"(target >= 0.70: {'met' if ratio >= 0.70 else 'NOT met'})")
    print(f"best: on {best_cpu['on']:,.0f}, off {best_cpu['off']:,.0f} requests/CPU-s; on / off = {ratio_cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
