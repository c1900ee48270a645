"""How much work on the machine's other CPUs slows a measurement pinned to one CPU.

Calibrate and fidelity pin the engine to a core and record the other CPUs' busy share
(backends/real/hostload.py), because those CPUs share the memory bus and the last-level cache.
This measures the effect: on CPU `--cpu`, a decode-like matrix-vector loop (weights far larger
than any cache, so DRAM bound) and a prefill-like GEMM are timed while a second process on
CPU `--neighbour` alternately sleeps and runs the same loop. Phases alternate so that the
machine's own drift falls on both sides alike; the figures are same-run ratios.

    python experiments/neighbour_interference.py --cpu 1 --neighbour 0 --phase-s 20 --phases 6
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch


def _tensors() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    # 576 x 49152 fp32 is 113 MB, SmolLM2-135M's hidden size times a width that no cache holds.
    return torch.randn(1, 576), torch.randn(576, 49152), torch.randn(256, 576), torch.randn(576, 1536)


def _round(t: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    """(seconds of 4 matrix-vector products, seconds of 20 GEMMs)."""
    x, w, a, b = t
    t0 = time.perf_counter()
    for _ in range(4):
        x @ w
    t1 = time.perf_counter()
    for _ in range(20):
        a @ b
    return t1 - t0, time.perf_counter() - t1


def _neighbour(cpu: int, busy: "mp.synchronize.Event", stop: "mp.synchronize.Event") -> None:
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    t = _tensors()
    while not stop.is_set():
        if busy.wait(0.05):
            _round(t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", type=int, default=1, help="the CPU measured")
    p.add_argument("--neighbour", type=int, default=0, help="the CPU that is alternately busy")
    p.add_argument("--phase-s", type=float, default=20.0, help="seconds of each phase")
    p.add_argument("--phases", type=int, default=6, help="phases of each kind (idle, busy)")
    args = p.parse_args()
    if args.cpu == args.neighbour:
        p.error("--cpu and --neighbour must differ")
    if min(args.cpu, args.neighbour) < 0 or max(args.cpu, args.neighbour) >= (os.cpu_count() or 1):
        p.error(f"this machine has {os.cpu_count()} CPUs")
    ctx = mp.get_context("spawn")
    busy, stop = ctx.Event(), ctx.Event()
    nb = ctx.Process(target=_neighbour, args=(args.neighbour, busy, stop), daemon=True)
    nb.start()
    os.sched_setaffinity(0, {args.cpu})
    torch.set_num_threads(1)
    t = _tensors()
    for _ in range(3):
        _round(t)  # warm-up
    means: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    try:
        for i in range(2 * args.phases):
            on = i % 2 == 1
            (busy.set if on else busy.clear)()
            time.sleep(0.5)  # let the neighbour start or finish its round
            rounds = []
            end = time.monotonic() + args.phase_s
            while time.monotonic() < end:
                rounds.append(_round(t))
            mv = statistics.fmean(r[0] for r in rounds)
            gm = statistics.fmean(r[1] for r in rounds)
            means[on].append((mv, gm))
            print(f"phase {i + 1:2d} neighbour {'busy' if on else 'idle'}: matvec {mv * 1e3:7.2f} ms  "
                  f"gemm {gm * 1e3:7.2f} ms  ({len(rounds)} rounds)", flush=True)
    finally:
        stop.set()
        nb.join(5)
    for j, name in ((0, "decode-like matvec (DRAM bound)"), (1, "prefill-like GEMM")):
        ratios = [b[j] / a[j] for a, b in zip(means[False], means[True])]
        print(f"{name}: busy neighbour / idle neighbour = {statistics.fmean(ratios):.3f} "
              f"(per phase pair {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
