"""CPU fp32 products of few rows four ways: x @ W_t, F.linear (MKL), oneDNN-prepacked weights, and the
few-row kernel (backends/real/csrc/few_rows.cpp: weight tiles read once for all rows).

SmolLM2-135M's four projection shapes and its LM head, one product each, summed, on one thread; the
ways interleaved round by round and the best round kept, so the ratios hold on a noisy machine.
The engine chooses among them per row count by timing them at start (product_paths.py).

    taskset -c 1 python experiments/bench_fp32_products.py [--rows 1 2 3 4 5 8 12 16] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from twinserve.backends.real import few_rows
from twinserve.backends.real import product_paths as pp

# (in, out) of SmolLM2-135M's qkv, o, gate_up and down projections, and its LM head.
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 12, 16],
                   help="row counts (tokens per product) to time")
    p.add_argument("--rounds", type=int, default=9, help="timing rounds per row count; the best is kept")
    p.add_argument("--no-head", action="store_true", help="the four projections only (one layer, in L3)")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = SHAPES[:4] if a.no_head else SHAPES
    paths = ["transposed", "linear", "prepacked"] + (["blocked"] if few_rows.load()[0] is not None else [])
    weights = [torch.randn(o, i) for i, o in shapes]
    copies = {q: [pp.prepare(q, w) for w in weights] for q in paths}
    print(f"threads=1, cpu {pp.describe_cpu()}, torch {torch.__version__}, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores; few-row kernel: {few_rows.load()[1] or 'built'}")
    print("rows | " + " | ".join(f"{q} ms" for q in paths) + " | best / best 1-row")
    one = None
    for rows in a.rows:
        xs = [torch.randn(rows, i) for i, _ in shapes]
        best = dict.fromkeys(paths, float("inf"))
        for q in paths:  # warm
            for x, c, (_, o) in zip(xs, copies[q], shapes):
                pp.product(q, x, c, o)
        for _ in range(a.rounds):
            for q in paths:
                t0 = time.perf_counter()
                for x, c, (_, o) in zip(xs, copies[q], shapes):
                    pp.product(q, x, c, o)
                best[q] = min(best[q], time.perf_counter() - t0)
        top = min(best.values())
        one = top if one is None else one
        print(f"{rows:4d} | " + " | ".join(f"{best[q] * 1e3:8.2f}" for q in paths) + f" | {top / one:5.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
