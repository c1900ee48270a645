"""Simulator speed with the host KV tier on, as a share of its speed with it off, on the same study.

    taskset -c 1 python experiments/host_tier_speed.py [--config experiments/host_tier_study.toml]
        [--requests N] [--pairs 5] [--cpu N] [--set FIELD=VALUE ...]

The study runs with [kv_offload] as its TOML sets it ("on") and with the tier off (host_size_gib =
host_blocks = 0), in --pairs interleaved pairs in one process (off first in odd pairs, on first in
even ones), so the machine's drift hits both sides alike. Each run's figures are simulated requests
per wall-second and per CPU-second (time.process_time) of Simulation.run(), the build left out.
Prints each pair and its ratios, then the median ratio over the pairs (the target: on >= 0.70 x
off), the best-of ratios, and the load average before and after (a shared machine's noise).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time

from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig, load_config, set_field

TARGET = 0.70


def speed(cfg: StudyConfig) -> tuple[float, float, int]:
    """Simulated requests per wall-second and per CPU-second of one run, and the requests simulated."""
    built = build(copy.deepcopy(cfg))
    gc.collect()  # the previous run's garbage is not this run's cost
    c0, t0 = time.process_time(), time.perf_counter()
    res = built.simulation.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(res.records) / wall, len(res.records) / cpu, len(res.records)


def _load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Interleave tier on and off; print the speeds, each pair's ratios and their medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/host_tier_study.toml", help="study TOML (tier on)")
    ap.add_argument("--requests", type=int, default=None, help="workload.num_requests")
    ap.add_argument("--pairs", "--rounds", type=int, default=5, dest="pairs",
                    help="interleaved on/off pairs (--rounds: the former name)")
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU (else as started)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="set on both sides")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
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
    cpus = sorted(os.sched_getaffinity(0))
    load_before = _load()
    print(f"{args.config}: {on.kv_offload.describe()} vs off, {args.pairs} pair(s), CPUs {cpus}, "
          f"load {load_before}")
    runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    ratios_wall, ratios_cpu = [], []
    for i in range(args.pairs):
        row = {}
        for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
            s, c, n = speed(on if name == "on" else off)
            runs[name].append((s, c))
            row[name] = (s, c, n)
        rw, rc = row["on"][0] / row["off"][0], row["on"][1] / row["off"][1]
        ratios_wall.append(rw)
        ratios_cpu.append(rc)
        print(f"pair {i + 1}: off {row['off'][0]:,.0f} wall / {row['off'][1]:,.0f} CPU, "
              f"on {row['on'][0]:,.0f} wall / {row['on'][1]:,.0f} CPU requests/s ({row['on'][2]} requests); "
              f"on / off {rw:.2f} wall, {rc:.2f} CPU", flush=True)
    med_wall, med_cpu = statistics.median(ratios_wall), statistics.median(ratios_cpu)
    best = {k: (max(s for s, _ in v), max(c for _, c in v)) for k, v in runs.items()}
    print(f"median on / off: {med_wall:.2f} wall, {med_cpu:.2f} CPU (pairs: wall "
          f"{', '.join(f'{r:.2f}' for r in ratios_wall)}; CPU {', '.join(f'{r:.2f}' for r in ratios_cpu)})")
    print(f"best-of on / off: {best['on'][0] / best['off'][0]:.2f} wall, {best['on'][1] / best['off'][1]:.2f} CPU")
    print(f"target on >= {TARGET:.2f} x off by median CPU ratio: {'met' if med_cpu >= TARGET else 'NOT met'}; "
          f"load {load_before} before, {_load()} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
