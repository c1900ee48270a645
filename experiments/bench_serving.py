"""Sweep `twinserve bench --max-concurrency` against `twinserve serve` (SmolLM2) and find saturation.

Starts the server as a subprocess on a free loopback port, runs the bench CLI once per
concurrency level (the same seeded random workload each time), and prints one table row per
level. With --offline it also runs the same workload through the engine alone (LLM.generate,
max_num_seqs = concurrency, same thread count): the ratio of the two throughputs is what the
HTTP front end, the SSE encoding and the GIL cost the engine thread (the engine runs on a
thread of the server process, not in a process of its own).

    python experiments/bench_serving.py --concurrency 1 2 4 8 16 32 --offline
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(a: argparse.Namespace, port: int, mode: str = "auto") -> subprocess.Popen:
    """`twinserve serve` in a subprocess, ready when /health answers."""
    cmd = [sys.executable, "-m", "twinserve.cli", "serve", a.model, "--port", str(port),
           "--threads", str(a.server_threads), "--max-model-len", str(a.max_model_len),
           "--max-num-seqs", str(max(a.concurrency)), "--kv-cache-memory-gb", str(a.kv_cache_gb),
           "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--engine-core-mode", mode,
           "--tensor-parallel-size", str(a.tensor_parallel_size)]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.server_threads), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("server did not come up in 300 s")


def bench_args(a: argparse.Namespace, c: int) -> list[str]:
    """The workload flags shared by the HTTP and offline runs.

    Each level gets its own seed: the server's prefix cache outlives a level, and reusing the
    prompts of the level before would turn prefills into cache hits.
    """
    return ["--num-prompts", str(max(a.min_prompts, a.prompts_per_slot * c)), "--random-input-len",
            str(a.input_len), "--random-output-len", str(a.output_len), "--seed", str(a.seed + c)]


def run_bench(a: argparse.Namespace, port: int, c: int, out: Path) -> dict[str, Any]:
    """One `twinserve bench` run; its summary.json."""
    cmd = [sys.executable, "-m", "twinserve.cli", "bench", "--port", str(port), "--max-concurrency", str(c),
           "--result-dir", str(out), "--label", f"c{c}", *bench_args(a, c)]
    subprocess.run(cmd, check=True, timeout=1800, stdout=subprocess.DEVNULL if a.quiet else None)
    return json.loads((out / "summary.json").read_text())


def run_offline(a: argparse.Namespace, c: int) -> float:
    """Output tok/s of the same workload through LLM.generate with max_num_seqs = c (no HTTP)."""
    import torch

    from twinserve.backends.real.llm import LLM
    from twinserve.core.sampling_params import SamplingParams
    from twinserve.sim.workload import Workload, WorkloadConfig

    torch.set_num_threads(a.server_threads)
    llm = LLM(a.model, max_model_len=a.max_model_len, max_num_seqs=c, kv_cache_memory_gb=a.kv_cache_gb,
              max_num_batched_tokens=a.max_num_batched_tokens)
    n = max(a.min_prompts, a.prompts_per_slot * c)
    cfg = WorkloadConfig(num_requests=n, arrival="all_at_once", prompt_dist="fixed", prompt_mean=a.input_len,
                         output_dist="fixed", output_mean=a.output_len, vocab_size=llm.llm_engine.vocab_size,
                         prompt_min=1, output_min=1)
    wl = Workload(cfg, seed=a.seed + c, max_model_len=a.max_model_len)
    items = list(wl.items())
    prompts = [{"prompt_token_ids": wl.prompt_tokens(it)} for it in items]
    sp = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t
    llm.llm_engine.shutdown()
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def main() -> int:
    """Run the sweep and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts-per-slot", type=int, default=2, help="num prompts = this x concurrency")
    ap.add_argument("--min-prompts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-threads", type=int, default=1, help="torch threads of the server (2 cores here)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--kv-cache-gb", type=float, default=0.5)
    ap.add_argument("--offline", action="store_true", help="also run the engine alone for the overhead ratio")
    ap.add_argument("--out", default=None, help="folder for per-level requests.csv/summary.json")
    ap.add_argument("--quiet", action="store_true", help="do not echo each bench report")
    ap.add_argument("--engine-core-modes", nargs="+", default=["auto"],
                    help="sweep each (inproc, process, auto) in turn, side by side")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    a = ap.parse_args()
    out_root = Path(a.out or tempfile.mkdtemp(prefix="bench_serving-"))
    by_mode = {}
    for mode in a.engine_core_modes:
        port = free_port()
        server = start_server(a, port, mode)
        by_mode[mode] = []
        try:
            for c in a.concurrency:
                s = run_bench(a, port, c, out_root / mode / f"c{c}")
                by_mode[mode].append({"c": c, **s})
        finally:
            server.terminate()
            server.wait(60)
    if len(by_mode) > 1:
        compare_modes(by_mode)
    rows = by_mode[a.engine_core_modes[0]]
    offline = {c: run_offline(a, c) for c in a.concurrency} if a.offline else {}
    print(f"\nSmolLM2-135M fp32, server torch threads {a.server_threads} (bench client in its own process), "
          f"input {a.input_len} / output {a.output_len} tokens, request rate inf; results in {out_root}")
    head = (f"{'conc':>4} {'n':>4} {'ok':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT ms':>9} {'TTFT p99':>9} "
            f"{'TPOT ms':>8} {'ITL p99':>8} {'E2E ms':>8}" + (f" {'offline tok/s':>13} {'http/offline':>12}"
                                                             if offline else ""))
    print(head)
    print("-" * len(head))
    best = max(r["output_throughput"] for r in rows)
    for r in rows:
        line = (f"{r['c']:>4} {r['num_requests']:>4} {r['completed']:>4} {r['request_throughput']:>7.3f} "
                f"{r['output_throughput']:>9.1f} {r['mean_ttft_s'] * 1e3:>9.0f} {r['p99_ttft_s'] * 1e3:>9.0f} "
                f"{r['mean_tpot_s'] * 1e3:>8.1f} {r['p99_itl_s'] * 1e3:>8.1f} {r['mean_e2e_s'] * 1e3:>8.0f}")
        if offline:
            line += f" {offline[r['c']]:>13.1f} {r['output_throughput'] / offline[r['c']]:>12.2f}"
        print(line)
    sat = next(r["c"] for r in rows if r["output_throughput"] >= 0.9 * best)
    print(f"throughput reaches 90% of its peak ({best:.1f} tok/s) at concurrency {sat}")
    return 0


def compare_modes(by_mode: dict[str, list[dict[str, Any]]]) -> None:
    """Output throughput and mean TTFT per engine-core mode, and the ratio to the first mode."""
    modes = list(by_mode)
    base = by_mode[modes[0]]
    print(f"\nengine core modes side by side (ratios against {modes[0]})")
    print(f"{'conc':>4} " + " ".join(f"{m + ' tok/s':>15} {m + ' TTFT ms':>16}" for m in modes)
          + " " + " ".join(f"{m + ' tok/s x':>16} {m + ' TTFT x':>15}" for m in modes[1:]))
    for i, r0 in enumerate(base):
        cells = " ".join(f"{by_mode[m][i]['output_throughput']:>15.1f} {by_mode[m][i]['mean_ttft_s'] * 1e3:>16.0f}"
                         for m in modes)
        ratios = " ".join(f"{by_mode[m][i]['output_throughput'] / r0['output_throughput']:>16.2f} "
                          f"{by_mode[m][i]['mean_ttft_s'] / r0['mean_ttft_s']:>15.2f}" for m in modes[1:])
        print(f"{r0['c']:>4} {cells} {ratios}")


if __name__ == "__main__":
    sys.exit(main())
