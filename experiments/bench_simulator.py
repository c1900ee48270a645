"""Simulator speed: the Azure conversation trace's first 5,000 requests on Llama-2-70B, 4×A100, TP 4.

Lengths from the trace, Poisson arrivals at 1.5 req/s, FCFS, chunked prefill, block
size 16. Prints simulated requests and engine steps per wall-second. Vidur simulates
about 500 requests per wall-second on a comparable run (../shared/FACTS.md).

    python experiments/bench_simulator.py [--requests N] [--no-fast-forward]
        [--prefix-caching] [--profile] [--baseline REV [--rounds N]]

--baseline REV runs the same benchmark on the code of a git revision (core/, backends/,
sim/ and twinserve/ extracted to a temporary folder) and on the working tree, each in a
fresh process, alternating for --rounds rounds, and prints both figures and their ratio
per round: the machine's drift hits both alike. It also says whether both simulated the
same thing: the digest of every request record and step-log column must match.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import dataclasses
import hashlib
import io
import os
import pstats
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from twinserve.sim.config import StudyConfig
from twinserve.sim.build import build

# The full trace in ../shared beside the repository, when present.
TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
BUNDLED = "builtin:azure_conv"


def bench_config(num_requests: int, fast_forward: bool, prefix_caching: bool) -> StudyConfig:
    """The benchmark's study."""
    cfg = StudyConfig()
    cfg.engine.model = "Llama-2-70B"
    cfg.engine.hardware = "A100-80GB"
    cfg.engine.tensor_parallel_size = 4
    cfg.scheduler.policy = "fcfs"
    cfg.scheduler.enable_chunked_prefill = True
    cfg.scheduler.block_size = 16
    cfg.scheduler.max_model_len = 4096
    cfg.scheduler.enable_prefix_caching = prefix_caching
    w = cfg.workload
    w.trace = str(TRACE) if TRACE.exists() else BUNDLED
    # A fresh clone has only the bundled excerpt: its rows, at most.
    w.num_requests = num_requests if TRACE.exists() else min(num_requests, bundled_rows())
    w.arrival = "poisson"
    w.rate = 1.5
    w.prompt_dist = w.output_dist = "trace"
    w.on_overlong = "clip"
    cfg.run.fast_forward = fast_forward
    return cfg


def bundled_rows() -> int:
    """Rows of the bundled excerpt (the fallback trace)."""
    from twinserve.sim.build import BUILTIN_TRACES
    from twinserve.sim.traces import read_trace

    return sum(1 for _ in read_trace(BUILTIN_TRACES[BENCH_BUILTIN]))


BENCH_BUILTIN = BUNDLED.split(":", 1)[1]


# Run in a child process: import twinserve from the folder given first (dropping the
# editable install's finder, which would map twinserve.* back to the working tree), then
# run this script with the remaining arguments.
_CHILD = """
import runpy, sys
pkg, script = sys.argv[1], sys.argv[2]
if pkg:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, pkg)
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""
PACKAGES = ("core", "backends", "sim", "kernels")


def baseline_tree(ref: str) -> str:
    """A folder holding the twinserve package as of git revision ref (removed at exit)."""
    here = Path(__file__).resolve().parent
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True, cwd=here).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "twinserve", *PACKAGES],
                             capture_output=True, check=True, cwd=root).stdout
    tmp = tempfile.mkdtemp(prefix="bench-sim-baseline-")
    atexit.register(shutil.rmtree, tmp, True)
    src = os.path.join(tmp, "src")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src)  # our own repository's files
    # The installed layout: twinserve/ with core/, backends/, sim/, kernels/ inside it.
    pkg = os.path.join(tmp, "pkg", "twinserve")
    shutil.copytree(os.path.join(src, "twinserve"), pkg)
    for name in PACKAGES:
        shutil.move(os.path.join(src, name), os.path.join(pkg, name))
    return os.path.join(tmp, "pkg")


def results_digest(res) -> str:
    """SHA-256 (first 16 hex digits) of every request record and step-log column, as repr."""
    h = hashlib.sha256()
    for rec in res.records:
        h.update(repr(dataclasses.astuple(rec)).encode())
    h.update(repr(dataclasses.astuple(res.steps)).encode())
    h.update(repr((res.end_time, res.num_steps, res.num_preemptions, res.prefix_queries,
                   res.prefix_hits)).encode())
    return h.hexdigest()[:16]


def run_child(pkg: str, args: list[str]) -> tuple[float, str]:
    """Simulated requests per wall-second and results digest of one child run (pkg '' = the
    working tree)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, pkg, str(Path(__file__).resolve()), *args],
                         capture_output=True, text=True)
    m = re.search(r"simulated requests per wall-second: ([0-9,]+)", out.stdout)
    d = re.search(r"results digest: ([0-9a-f]+)", out.stdout)
    if out.returncode != 0 or m is None or d is None:
        raise RuntimeError(f"benchmark child failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return float(m.group(1).replace(",", "")), d.group(1)


def compare(ref: str, rounds: int, child_args: list[str]) -> None:
    """Alternate the working tree and revision ref; print each round and the ratios."""
    pkg = baseline_tree(ref)
    print(f"working tree vs {ref}, alternating, {rounds} round(s); each figure is the best of "
          f"the child's --repeat runs")
    print(f"{'round':>5} {'current':>10} {ref[:12]:>12} {'ratio':>7}  same results")
    ratios = []
    for i in range(rounds):
        cur, cur_digest = run_child("", child_args)
        base, base_digest = run_child(pkg, child_args)
        ratios.append(cur / base)
        same = "yes" if cur_digest == base_digest else f"NO ({cur_digest} vs {base_digest})"
        print(f"{i + 1:>5} {cur:>10,.0f} {base:>12,.0f} {cur / base:>7.2f}  {same}")
    print(f"ratio min / median / max: {min(ratios):.2f} / {sorted(ratios)[len(ratios) // 2]:.2f} "
          f"/ {max(ratios):.2f} (simulated requests per wall-second, current / {ref})")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--no-fast-forward", action="store_true")
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print the top cProfile entries")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs")
    ap.add_argument("--baseline", metavar="REV",
                    help="also run the code of this git revision, alternating (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the --baseline comparison")
    args = ap.parse_args(argv)
    if args.baseline:
        child = ["--requests", str(args.requests), "--repeat", str(args.repeat)]
        child += ["--no-fast-forward"] * args.no_fast_forward
        child += ["--prefix-caching"] * args.prefix_caching
        compare(args.baseline, args.rounds, child)
        return
    best = None
    for _ in range(args.repeat):
        cfg = bench_config(args.requests, not args.no_fast_forward, args.prefix_caching)
        built = build(cfg)
        t0 = time.perf_counter()
        if args.profile:
            prof = cProfile.Profile()
            res = prof.runcall(built.simulation.run)
        else:
            res = built.simulation.run()
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, res, built)
        if args.profile:
            break
    assert best is not None
    wall, res, built = best
    done = sum(1 for r in res.records if r.finish_time is not None)
    note = "" if cfg.workload.num_requests == args.requests else (
        f"; ../shared is absent: the bundled excerpt has {cfg.workload.num_requests} rows, not {args.requests}")
    print(f"trace: {cfg.workload.trace} (first {cfg.workload.num_requests} rows{note}; "
          f"clipped {built.workload.length_stats.clipped} over max_model_len 4096)")
    print(f"Llama-2-70B on 4x A100-80GB TP4, {built.capacity.num_blocks} KV blocks of 16; "
          f"fast_forward={not args.no_fast_forward}, prefix_caching={args.prefix_caching}; "
          f"python {sys.version.split()[0]}, 1 process")
    print(f"simulated {done} requests over {res.end_time:.1f} s of simulated time; "
          f"{res.num_steps} engine steps, {res.num_events} SimPy events, "
          f"{res.num_ff_windows} fast-forward windows")
    print(f"wall {wall:.3f} s (best of {args.repeat if not args.profile else 1})")
    print(f"simulated requests per wall-second: {done / wall:,.0f}")
    print(f"engine steps per wall-second:       {res.num_steps / wall:,.0f}")
    print(f"results digest: {results_digest(res)}")
    if args.profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
