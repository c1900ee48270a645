"""AIConfigurator's CLI and `simulate search` on the same question, started together.

    python experiments/aic_side_by_side.py [--workers 2] [--backend vllm] [--one-at-a-time ROUNDS]

Started together, each tool's wall includes the other's load on the same cores. With
`--one-at-a-time`, each tool has the machine to itself in turn (as a user runs one of them),
ROUNDS rounds with the order alternated, and the medians and their ratio are printed.

The question (FACTS 2026-12-04): Llama-3.1-70B FP8 on 8x H200, ISL 4000 / OSL 500,
TTFT <= 2 s, TPOT <= 30 ms, aggregated and disaggregated. AIConfigurator needs
`pip install aiconfigurator==0.12.0`; `simulate search` reads
experiments/llama3_70b_fp8_h200.toml. Prints wall and CPU seconds of each and their best
output tokens/s/GPU, aggregated and disaggregated.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import statistics
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "experiments" / "llama3_70b_fp8_h200.toml"


def aic_command(out: Path, backend: str, exe: str = "") -> list[str]:
    """AIConfigurator's default agg-vs-disagg run on the question."""
    exe = exe or shutil.which("aiconfigurator") or str(Path(sys.executable).with_name("aiconfigurator"))
    return [exe, "cli", "default", "--model-path", "nvidia/Llama-3.1-70B-Instruct-FP8",
            "--total-gpus", "8", "--system", "h200_sxm", "--isl", "4000", "--osl", "500",
            "--ttft", "2000", "--tpot", "30", "--backend", backend, "--save-dir", str(out)]


def search_command(out: Path, workers: int) -> list[str]:
    """`simulate search` on the same question."""
    return [sys.executable, "-m", "twinserve.sim.cli", "search", "--config", str(STUDY),
            "--workers", str(workers), "--out", str(out)]


def start(argv: list[str], log: Path) -> tuple[subprocess.Popen, float, Path]:
    """Start a command with its output to log; (process, start time, log)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT), time.perf_counter(), log


def aic_best(log: Path) -> str:
    """AIConfigurator's chosen experiment and its best agg and disagg rows (tokens/s/gpu)."""
    text = log.read_text(errors="replace")
    parts = [m.group(1) for m in re.finditer(r"Best Experiment Chosen: (.*)", text)]
    for kind in ("agg", "disagg"):
        m = re.search(rf"^{kind} Top Configurations.*?\n\|\s+1\s+\|([^\n]*)", text,
                      re.MULTILINE | re.DOTALL)
        if m:
            cells = [c.strip() for c in m.group(1).split("|")]
            parts.append(f"{kind}: {cells[1]} tokens/s/gpu at {cells[3]} req/s")
    return "; ".join(parts) or f"(see {log})"


def search_best(out: Path) -> str:
    """simulate search's best output tokens/s/GPU, aggregated and disaggregated."""
    rows = [r for r in csv.DictReader(open(out / "search.csv")) if float(r["max_rate"]) > 0]
    parts = []
    for kind in ("agg", "disagg"):
        mine = [r for r in rows if r["mode"].startswith(kind)]
        if mine:
            b = max(mine, key=lambda r: float(r["output_tokens_per_s_per_gpu"]))
            parts.append(f"{kind}: TP {b['tp']} {b['mode']} "
                         f"{float(b['output_tokens_per_s_per_gpu']):.0f} output tok/s/GPU "
                         f"at {float(b['max_rate']):.3g} req/s")
    return "; ".join(parts)


def one_at_a_time(args: argparse.Namespace, tmp: Path) -> int:
    """Each tool alone on the machine, in alternating order; medians of wall and CPU."""
    runs: dict[str, list[tuple[float, float]]] = {"aic": [], "search": []}
    print("| round | tool | wall s | CPU s | 1-min load before | best |")
    print("|---|---|---|---|---|---|")
    for r in range(args.one_at_a_time):
        order = ["aic", "search"] if r % 2 == 0 else ["search", "aic"]
        for tool in order:
            out = tmp / f"{tool}{r}"
            argv = (aic_command(out, args.backend, args.aic) if tool == "aic"
                    else search_command(out, args.workers))
            load = os.getloadavg()[0]
            proc, t0, log = start(argv, tmp / f"{tool}{r}.log")
            _, status, usage = os.wait4(proc.pid, 0)
            wall, cpu = time.perf_counter() - t0, usage.ru_utime + usage.ru_stime
            if status != 0:
                print(f"{tool} exited with status {status}: see {log}", file=sys.stderr)
                return 1
            runs[tool].append((wall, cpu))
            best = aic_best(log) if tool == "aic" else search_best(out)
            print(f"| {r} | {tool} | {wall:.1f} | {cpu:.1f} | {load:.1f} | {best} |", flush=True)
    med = {t: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for t, v in runs.items()}
    print(f"medians: AIConfigurator wall {med['aic'][0]:.1f} s, CPU {med['aic'][1]:.1f} s; "
          f"simulate search wall {med['search'][0]:.1f} s, CPU {med['search'][1]:.1f} s; "
          f"search / AIConfigurator wall {med['search'][0] / med['aic'][0]:.2f}x")
    print(f"logs and outputs: {tmp}")
    return 0


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="simulate search --workers")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "sglang", "trtllm"],
                    help="AIConfigurator's performance database")
    ap.add_argument("--aic", default="", help="the aiconfigurator executable (default: on PATH, "
                    "else beside this Python)")
    ap.add_argument("--one-at-a-time", type=int, default=0, metavar="ROUNDS",
                    help="run the tools one after the other, each alone, ROUNDS rounds in "
                    "alternating order (default 0: both started together)")
    args = ap.parse_args()
    if args.one_at_a_time < 0:
        ap.error("--one-at-a-time must be >= 0")
    print(f"load (1, 5, 15 min) at the start: {os.getloadavg()}")
    if args.one_at_a_time:
        return one_at_a_time(args, Path(tempfile.mkdtemp(prefix="aic-side-")))
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:  # the 1-min load every 5 s while both run
        while not stop.wait(5.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    tmp = Path(tempfile.mkdtemp(prefix="aic-side-"))
    jobs = {"AIConfigurator 0.12.0 cli default": start(aic_command(tmp / "aic", args.backend, args.aic),
                                                        tmp / "aic.log"),
            "simulate search": start(search_command(tmp / "search", args.workers),
                                     tmp / "search.log")}
    by_pid = {proc.pid: (name, t0, log) for name, (proc, t0, log) in jobs.items()}
    print("| tool | wall s | CPU s | best |")
    print("|---|---|---|---|")
    while by_pid:  # whichever ends first, timed when it ends
        pid, _, usage = os.wait4(-1, 0)
        if pid not in by_pid:
            continue
        name, t0, log = by_pid.pop(pid)
        wall, cpu = time.perf_counter() - t0, usage.ru_utime + usage.ru_stime
        best = aic_best(log) if name.startswith("AIC") else search_best(tmp / "search")
        print(f"| {name} | {wall:.0f} | {cpu:.0f} | {best} |", flush=True)
    stop.set()
    print(f"load (1, 5, 15 min) at the end: {os.getloadavg()}")
    if loads:
        print(f"1-min load during: min {min(loads):.1f}, median {statistics.median(loads):.1f}, "
              f"max {max(loads):.1f} ({len(loads)} samples)")
    print(f"logs and outputs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
