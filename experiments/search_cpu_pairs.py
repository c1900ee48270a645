"""`simulate search` of two trees in interleaved pairs: CPU seconds, and whether the outputs match.

    python experiments/search_cpu_pairs.py --old /tmp/old_tree --new . [--pairs 3] [--workers 1]
        [--core 1] [--config experiments/llama3_70b_fp8_h200.toml]

Each tree runs its own venv (TREE/.venv/bin/python -m twinserve.sim.cli search), old then new, PAIRS
times, pinned to --core when --workers is 1; prints each run's CPU seconds (the search and its
workers: the children's user + system time), the new/old ratio per pair, `uptime`, and whether
search.csv is byte-identical between the trees (every run of a tree too), and search_runs.csv
too but for its wall-clock columns (sim_wall_s, sim_requests_per_wall_s: never the same twice).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = ("search.csv", "search_runs.csv")


def _content(path: Path) -> list[list[str]]:
    """The file's rows, less any column whose name says it holds wall-clock time."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, name in enumerate(rows[0]) if "wall" not in name] if rows else []
    return [[row[i] if i < len(row) else None for i in keep] for row in rows]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(tree: Path, config: str, workers: int, core: int | None, out: Path) -> tuple[float, float]:
    """One search; (CPU s, wall s)."""
    cmd = [str(tree / ".venv/bin/python"), "-m", "twinserve.sim.cli", "search", "--config",
           str(tree / config), "--workers", str(workers), "--out", str(out)]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    cpu, wall = _cpu(), time.perf_counter()
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _cpu() - cpu, time.perf_counter() - wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, type=Path,
                    help="the baseline tree (a worktree with its own .venv), run first in each pair")
    ap.add_argument("--new", default=Path("."), type=Path,
                    help="the tree under test, with its own .venv (default: this one)")
    ap.add_argument("--pairs", type=int, default=3, help="old-then-new pairs to run (default 3)")
    ap.add_argument("--workers", type=int, default=1, help="the search's --workers (default 1)")
    ap.add_argument("--core", type=int, default=1, help="the core a one-worker search is pinned to (default 1)")
    ap.add_argument("--config", default="experiments/llama3_70b_fp8_h200.toml",
                    help="the study TOML, relative to each tree (default: the FP8 H200 question)")
    args = ap.parse_args()
    core = args.core if args.workers == 1 else None
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    work = Path(tempfile.mkdtemp(prefix="search_cpu_pairs_"))
    print(f"uptime before: {os.popen('uptime').read().strip()}")
    print(f"workers {args.workers}, core {core}, config {args.config}")
    print("| pair | old CPU s | new CPU s | new/old | old wall s | new wall s |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for i in range(args.pairs):
        got = {}
        for name, tree in trees.items():
            got[name] = _run(tree, args.config, args.workers, core, work / f"{name}{i}")
        ratio = got["new"][0] / got["old"][0]
        ratios.append(ratio)
        print(f"| {i + 1} | {got['old'][0]:.1f} | {got['new'][0]:.1f} | {ratio:.3f} | "
              f"{got['old'][1]:.1f} | {got['new'][1]:.1f} |", flush=True)
    print(f"uptime after: {os.popen('uptime').read().strip()}")
    print(f"new/old CPU: median {sorted(ratios)[len(ratios) // 2]:.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}")
    ref = (work / "old0" / FILES[0]).read_bytes()
    same_csv = all((work / f"{name}{i}" / FILES[0]).read_bytes() == ref
                   for name in trees for i in range(args.pairs))
    runs = _content(work / "old0" / FILES[1])
    same_runs = all(_content(work / f"{name}{i}" / FILES[1]) == runs
                    for name in trees for i in range(args.pairs))
    print(f"{FILES[0]} byte-identical across every run of both trees: {same_csv}")
    print(f"{FILES[1]} identical but for its wall-clock columns: {same_runs}")
    same = same_csv and same_runs
    print(f"outputs kept in {work}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
