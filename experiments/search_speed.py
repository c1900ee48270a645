"""`simulate search` before and after its shortcuts, in one sitting, on the same core.

    python experiments/search_speed.py [--before abcead1] [--after HEAD] [--core 1]
        [--variants before,band,noband] [CONFIG ...]

Runs each study with the search of git revision --before and of --after (each checked out to
a temporary worktree and imported in place of this tree's packages, so edits made meanwhile
do not leak in), the new one with and without its seed band, all with --workers 1 pinned to
one core; prints wall seconds, runs, requests simulated and each configuration's answer.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["experiments/llama3_70b_capacity.toml"]

# Imports twinserve from BEFORE's tree and counts its runs (the old search kept no total).
LAUNCHER = r"""
import json, sys
tree = sys.argv.pop(1)
import importlib.machinery, importlib.util
class Finder:
    names = {"twinserve": "twinserve", "twinserve.sim": "sim", "twinserve.core": "core",
             "twinserve.backends": "backends", "twinserve.kernels": "kernels",
             "twinserve.bench": "bench", "twinserve.twin": "twin"}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in cls.names:
            return importlib.util.spec_from_file_location(
                name, f"{tree}/{cls.names[name]}/__init__.py",
                submodule_search_locations=[f"{tree}/{cls.names[name]}"])
        return None
sys.meta_path.insert(0, Finder)
import twinserve.sim.search as search
assert search.__file__.startswith(tree), search.__file__
count = {"runs": 0, "requests": 0}
if hasattr(search, "_run"):  # the old search ran study._run; the new one counts its own work
    inner = search._run
    def counted(job):
        res = inner(job)
        count["runs"] += 1
        count["requests"] += int(res.row.get("completed") or 0)
        return res
    search._run = counted
from twinserve.sim.cli import main
rc = main(sys.argv[1:])
print("WORK " + json.dumps(count))
sys.exit(rc)
"""


def run(argv: list[str], core: str | None) -> tuple[float, float, str, int]:
    """(wall s, CPU s, stdout, exit status) of one command, pinned when a core is given.

    CPU seconds (user + system of the child) hardly move with other jobs on a shared machine;
    wall seconds do.
    """
    pin = ["taskset", "-c", core] if core and shutil.which("taskset") else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(pin + argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stdout, p.returncode


def answers(out: Path) -> str:
    """'config: max_rate' for every answered configuration of a search's table."""
    rows = list(csv.DictReader(open(out / "search.csv")))
    keys = [k for k in rows[0] if k in ("hardware", "tensor_parallel_size", "mode", "quantization",
                                        "kv_cache_dtype")]
    return "; ".join(f"{'/'.join(r[k] for k in keys)} {float(r['max_rate']):.3g}"
                     for r in rows if float(r["max_rate"]) > 0)


def pick(stdout: str) -> str:
    """The summary's cheapest line, shortened."""
    for line in stdout.splitlines():
        if line.startswith("- cheapest:"):
            return line[len("- cheapest: "):].split(" (")[0]
    return "none"


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=DEFAULT)
    ap.add_argument("--before", default="abcead1", help="git revision of the old search")
    ap.add_argument("--after", default="HEAD", help="git revision of the new search")
    ap.add_argument("--core", default="1", help="CPU to pin every run to ('' = none)")
    ap.add_argument("--save", default="", help="folder to keep each search's outputs in")
    ap.add_argument("--variants", default="before,band,noband",
                    help="which to run, comma-separated: before, band (after, with its seed band), "
                         "noband (after, band_seeds = 0)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="search-speed-"))
    tree, new = tmp / "before", tmp / "after"
    for path, rev in ((tree, args.before), (new, args.after)):
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT,
                       check=True, capture_output=True)
    py = sys.executable
    print("| study | search | wall s | CPU s | load (1-min, start-end) | runs | requests simulated "
          "| pick | answers (req/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for config in args.configs:
            cfg = str(ROOT / config)
            common = ["search", "--config", cfg, "--workers", "1"]
            variants = [
                ("before", f"before ({args.before})", [py, "-c", LAUNCHER, str(tree), *common]),
                ("band", f"after ({args.after}), as the study asks", [py, "-c", LAUNCHER, str(new),
                                                                       *common]),
                ("noband", "after, no band", [py, "-c", LAUNCHER, str(new), *common,
                                              "--set", "search.band_seeds=0"]),
            ]
            wanted = set(args.variants.split(","))
            for key, name, argv in variants:
                if key not in wanted:
                    continue
                out = tmp / f"{Path(config).stem}-{key}"
                load0 = os.getloadavg()[0]
                wall, cpu, stdout, rc = run(argv + ["--out", str(out)], args.core)
                load = f"{load0:.1f}-{os.getloadavg()[0]:.1f}"
                rows = list(csv.DictReader(open(out / "search.csv")))
                if "runs_total" not in rows[0]:  # a search older than its own counts
                    work = json.loads(stdout.rsplit("WORK ", 1)[1])
                else:
                    work = {"runs": sum(int(r["runs_total"]) for r in rows),
                            "requests": sum(int(r["requests_simulated"]) for r in rows)}
                if args.save:  # each search's outputs, kept
                    shutil.copytree(out, Path(args.save) / out.name, dirs_exist_ok=True)
                print(f"| {config} | {name} (exit {rc}) | {wall:.0f} | {cpu:.0f} | {load} | {work['runs']} | "
                      f"{work['requests']:,} | {pick(stdout)} | {answers(out)} |", flush=True)
    finally:
        for path in (tree, new):
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
