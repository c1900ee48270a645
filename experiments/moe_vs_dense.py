"""A mixture-of-experts model beside a dense one of equal active parameters.

Prints the decode step's cost per token by batch size for both (the cost model built from
the two studies), then simulates both studies and prints their latencies.

    python experiments/moe_vs_dense.py [moe.toml dense.toml]
"""

from __future__ import annotations

import sys

from twinserve.sim.build import build_cost_models
from twinserve.sim.config import load_config
from twinserve.sim.study import run_point

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
CONTEXT = 1000  # tokens in each decoding sequence's KV cache


def main() -> None:
    paths = sys.argv[1:3] or ["experiments/moe_mixtral.toml", "experiments/moe_dense_twin.toml"]
    cfgs = [load_config(p) for p in paths]
    (moe, _, roof_m, _), (dense, _, roof_d, _) = (build_cost_models(c) for c in cfgs)
    print(f"{moe.name}: {moe.num_params / 1e9:.1f}B parameters, {moe.num_active_params / 1e9:.2f}B "
          f"active; {dense.name}: {dense.num_params / 1e9:.2f}B; {cfgs[0].engine.hardware} "
          f"TP {cfgs[0].engine.tensor_parallel_size}; context {CONTEXT} tokens per sequence\n")
    print("| batch | experts touched per layer | MoE ms per token | dense ms per token | MoE / dense |")
    print("|---|---|---|---|---|")
    for b in BATCHES:
        tm = roof_m.step_time(0, 0, 0, 0.0, b, b * CONTEXT) / b
        td = roof_d.step_time(0, 0, 0, 0.0, b, b * CONTEXT) / b
        print(f"| {b} | {moe.expected_experts(b):.2f} of {moe.num_experts} | {tm * 1e3:.3f} | "
              f"{td * 1e3:.3f} | {tm / td:.2f} |")
    print("\n| study | requests | rate | p50 TPOT (ms) | p99 TPOT (ms) | p99 TTFT (s) | output tok/s |")
    print("|---|---|---|---|---|---|---|")
    for p, c in zip(paths, cfgs):
        r = run_point(c).row
        print(f"| {p} | {r['completed']} | {c.workload.rate:g} | {r['p50_tpot_s'] * 1e3:.1f} | "
              f"{r['p99_tpot_s'] * 1e3:.1f} | {r['p99_ttft_s']:.2f} | {r['output_throughput']:,.0f} |")


if __name__ == "__main__":
    main()
