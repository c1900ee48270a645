"""Simulator speed with the measured backend: the same study priced by the roofline and by aic.

Llama-3.1-70B on 4x H200 (TP 4), the bundled Azure conversation excerpt cycled to N requests,
Poisson at 3 req/s, FCFS, chunked prefill. Runs the roofline and cost_model = "aic" (vLLM's
database) alternately in one process and prints simulated requests per wall-second for each and
their ratio per round; aic's one-off database load is timed apart.

    python experiments/bench_aic.py [--requests 5000] [--rounds 2] [--backend vllm]
"""

from __future__ import annotations

import argparse
import time

from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig


def study(n: int, cost_model: str, backend: str) -> StudyConfig:
    """The benchmark's study under one cost model."""
    cfg = StudyConfig()
    e = cfg.engine
    e.model, e.hardware, e.tensor_parallel_size = "Llama-3.1-70B", "H200", 4
    e.cost_model, e.aic_backend = cost_model, backend
    cfg.scheduler.policy = "fcfs"
    cfg.scheduler.enable_chunked_prefill = True
    cfg.scheduler.max_model_len = 8192
    w = cfg.workload
    w.trace, w.trace_cycle, w.num_requests = "builtin:azure_conv", True, n
    w.arrival, w.rate = "poisson", 3.0
    w.prompt_dist = w.output_dist = "trace"
    w.on_overlong = "clip"
    return cfg


def run(n: int, cost_model: str, backend: str) -> tuple[float, float, int, float]:
    """(build seconds, simulated req per wall-second, steps, simulated seconds) of one run."""
    t0 = time.perf_counter()
    built = build(study(n, cost_model, backend))
    t1 = time.perf_counter()
    res = built.simulation.run()
    t2 = time.perf_counter()
    return t1 - t0, len(res.records) / (t2 - t1), res.num_steps, res.end_time


def main() -> None:
    """Alternate roofline and aic; print req/s of each and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests simulated per study")
    ap.add_argument("--rounds", type=int, default=2, help="roofline/aic pairs, alternated")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "sglang", "trtllm"],
                    help="aiconfigurator database the aic cost model prices from")
    a = ap.parse_args()
    print(f"{a.requests} requests, Llama-3.1-70B, 4x H200 TP 4; aic backend {a.backend}")
    print(f"{'round':>5} {'roofline req/s':>15} {'aic req/s':>10} {'aic/roof':>9} {'aic build s':>12} "
          f"{'steps roof/aic':>16} {'sim s roof/aic':>16}")
    for i in range(a.rounds):
        _, roof, rsteps, rend = run(a.requests, "roofline", a.backend)
        setup, aic, asteps, aend = run(a.requests, "aic", a.backend)
        print(f"{i + 1:>5} {roof:>15,.0f} {aic:>10,.0f} {aic / roof:>9.2f} {setup:>12.1f} "
              f"{rsteps:>7}/{asteps:<8} {rend:>7.0f}/{aend:<8.0f}")


if __name__ == "__main__":
    main()
