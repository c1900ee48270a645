"""Colocated against disaggregated prefill/decode: the table in docs/cluster.md, regenerated.

Runs experiments/disagg_study.toml (four Llama-2-7B / A100-80GB replicas, Azure conversation
lengths) for each pool split and rate over several seeds, and prints a Markdown table: goodput
as the mean and range over seeds, the seeds where the split beats colocated, and latency means.
Near the cluster's knee one seed's bursts can decide the goodput ranking, hence the seeds.

    python experiments/disagg_table.py [--seeds 5] [--rates 6,10,12,14,16] [--workers 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from twinserve.sim.config import load_config
from twinserve.sim.study import run_grid

STUDY = Path(__file__).with_name("disagg_study.toml")
SPLITS = {0: "colocated 4", 1: "1:3", 2: "2:2"}


def machine() -> str:
    """CPU model and Python, for the table's caption."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, Python {platform.python_version()}"


def commit() -> str:
    """The source tree's commit (the simulator's code the figures come from)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=STUDY.parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(rows: list[dict]) -> str:
    """Markdown: one line per (split, rate), goodput over seeds and latency means."""
    by = {}
    for r in rows:
        by.setdefault((r["num_prefill_replicas"], r["rate"]), {})[r["seed"]] = r
    out = ["| prefill:decode | rate | goodput mean (min-max) | seeds beating colocated | "
           "p50_ttft_s | p99_ttft_s | mean_tpot_s | p99_itl_s |", "|---|---|---|---|---|---|---|---|"]
    for (p, rate), runs in sorted(by.items()):
        g = np.array([runs[s]["goodput"] for s in sorted(runs)])
        base = by[(0, rate)]
        wins = "–" if p == 0 else f"{sum(runs[s]['goodput'] > base[s]['goodput'] for s in runs)} of {len(runs)}"

        def mean(col: str) -> str:
            return f"{np.mean([runs[s][col] for s in runs]):.3g}"

        out.append(f"| {SPLITS.get(p, p)} | {rate:g} | {g.mean():.2f} ({g.min():.2f}-{g.max():.2f}) | {wins} | "
                   f"{mean('p50_ttft_s')} | {mean('p99_ttft_s')} | {mean('mean_tpot_s')} | {mean('p99_itl_s')} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the grid and print the caption and the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rates", default="6,10,12,14,16")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    base = load_config(STUDY)
    grid = {"cluster.num_prefill_replicas": ["0", "1", "2"], "workload.rate": args.rates.split(","),
            "run.seed": [str(s) for s in range(args.seeds)]}
    res = run_grid(base, grid, workers=args.workers, progress=False, keep_tables=False)
    rows = [r.row for r in res]
    print(f"`python experiments/disagg_table.py --seeds {args.seeds} --rates {args.rates}` "
          f"({base.workload.num_requests} requests a run; seeds 0-{args.seeds - 1}), "
          f"commit {commit()}, {dt.date.today().isoformat()}, {machine()}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
