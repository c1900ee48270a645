"""Draft-model speculation in the simulator: speedup over plain decoding against request rate.

Llama-2-70B on 4x H100 (roofline, tensor parallel 4) with Llama-2-7B as its draft (same
vocabulary), k = 4, at two acceptance levels; the draft's own forwards (a catch-up, then
k - 1 decodes per step) are priced on top of each verify step, and its weights and KV come
out of the pool. Speedup is plain mean TPOT over speculative mean TPOT. Prints a markdown table.

    python experiments/spec_draft_study.py [--requests N]
"""

from __future__ import annotations

import argparse
import dataclasses

from twinserve.sim.build import simulate
from twinserve.sim.config import StudyConfig
from twinserve.sim.metrics import requests_frame

LEVELS = {"acceptance [0.8, 0.7, 0.6, 0.5]": [0.8, 0.7, 0.6, 0.5],
          "acceptance [0.5, 0.3, 0.2, 0.1]": [0.5, 0.3, 0.2, 0.1]}
RATES = [0.5, 2.0, 4.0, 8.0, 16.0, 32.0]


def base(requests: int, rate: float, seed: int) -> StudyConfig:
    """The plain study at one rate."""
    cfg = StudyConfig()
    cfg.engine.model, cfg.engine.hardware, cfg.engine.tensor_parallel_size = "Llama-2-70B", "H100-SXM", 4
    s, w = cfg.scheduler, cfg.workload
    s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len = 2048, 256, 4096
    w.prompt_mean, w.prompt_std, w.output_mean, w.output_std = 500, 200, 200, 80
    w.num_requests, w.arrival, w.rate = requests, "poisson", rate
    w.prompt_dist = w.output_dist = "lognormal"
    cfg.run.seed = seed
    return cfg


def mean_tpot(cfg: StudyConfig) -> float:
    """Mean time per output token over the run's requests."""
    return float(requests_frame(simulate(cfg)[1])["tpot_s"].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| rate (req/s) | plain TPOT (ms) | " + " | ".join(f"speedup, {n}" for n in LEVELS) + " |")
    print("|---" * (2 + len(LEVELS)) + "|")
    for rate in RATES:
        cfg = base(args.requests, rate, args.seed)
        plain = mean_tpot(cfg)
        row = []
        for rates in LEVELS.values():
            spec = dataclasses.replace(cfg)
            spec.speculative = dataclasses.replace(cfg.speculative, method="draft_model", draft_model="Llama-2-7B",
                                                   num_speculative_tokens=4, acceptance_rates=list(rates))
            row.append(f"{plain / mean_tpot(spec):.2f}")
        print(f"| {rate:g} | {plain * 1e3:.1f} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
