"""CPU fp32 products of few rows three ways: x @ W_t, F.linear (MKL), oneDNN-prepacked weights.

SmolLM2-135M's four projection shapes and its LM head, one product each, summed, on one thread;
the three ways side by side for each row count, so the ratios hold on a noisy machine. Which is
fastest decides llama.default_small_batch_rows and llama.fp32_prepack_preferred.

    taskset -c 1 python experiments/bench_fp32_products.py [--rows 1 2 5 8 16] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time

import torch

import twinserve.backends.real.models.llama as llama

# (in, out) of SmolLM2-135M's qkv, o, gate_up and down projections, and its LM head.
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]


def _ms(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 16])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = [torch.randn(o, i) for i, o in SHAPES]
    transposed = [w.t().contiguous() for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    print(f"CPU vendor {llama.cpu_vendor() or '?'}, capability {torch.backends.cpu.get_cpu_capability()}; "
          f"default small_batch_rows {llama.default_small_batch_rows()}, "
          f"fp32 prepack {llama.fp32_prepack_preferred()}")
    print("rows | x @ W_t ms | F.linear ms | prepacked ms")
    for rows in args.rows:
        xs = [torch.randn(rows, i) for i, _ in SHAPES]
        wt = sum(_ms(lambda x=x, w=w: x @ w, args.repeats) for x, w in zip(xs, transposed))
        dense = sum(_ms(lambda x=x, w=w: torch.nn.functional.linear(x, w), args.repeats)
                    for x, w in zip(xs, weights))
        pk = sum(_ms(lambda x=x, w=w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                     args.repeats) for x, w in zip(xs, packed))
        print(f"{rows:4d} | {wt:10.2f} | {dense:11.2f} | {pk:12.2f}")


if __name__ == "__main__":
    main()
