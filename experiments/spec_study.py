"""Where speculative decoding stops paying: simulated speedup over plain decoding against request rate.

Two engines: SmolLM2-135M on one CPU thread (the fitted profile builtin:smollm2-135m-cpu-1t,
where a verify step costs nearly per token) and Llama-3-8B on one H100 (roofline, memory
bound up to large batches). Poisson arrivals, n-gram speculation with k = 4 at two acceptance
levels, and the high level again with disable_by_batch_size. The same scheduler schedules
the drafts; a verify step is priced as a (k + 1)-token chunk per sequence. Speedup is plain
mean TPOT over speculative mean TPOT (above 1: speculation pays). Prints a table per engine
and writes one figure with a panel each.

    python experiments/spec_study.py [--requests N] [--out docs/img/spec_study.png]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from twinserve.sim.build import simulate
from twinserve.sim.config import StudyConfig
from twinserve.sim.metrics import requests_frame

HIGH, LOW = [0.8, 0.6, 0.5, 0.4], [0.4, 0.2, 0.1, 0.05]
LEVELS = {f"acceptance {HIGH}": (HIGH, 0), f"acceptance {LOW}": (LOW, 0)}
# Per engine: rates (req/s), and the batch size from which the third line switches drafts off.
SCENARIOS = {"cpu": ([0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0], 4),
             "h100": ([1.0, 8.0, 16.0, 32.0, 48.0, 64.0, 128.0], 64)}


def base(scenario: str, requests: int, rate: float, seed: int) -> StudyConfig:
    """The plain study at one rate."""
    cfg = StudyConfig()
    s, w = cfg.scheduler, cfg.workload
    if scenario == "cpu":
        cfg.engine.model, cfg.engine.cost_model = "SmolLM2-135M", "fitted"
        cfg.engine.profile, cfg.engine.num_gpu_blocks = "builtin:smollm2-135m-cpu-1t", 1456
        s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len = 512, 32, 2048
        w.prompt_mean, w.prompt_std, w.output_mean, w.output_std = 200, 120, 64, 30
    else:
        cfg.engine.model, cfg.engine.hardware = "Llama-3-8B", "H100-SXM"
        s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len = 2048, 256, 4096
        w.prompt_mean, w.prompt_std, w.output_mean, w.output_std = 500, 200, 200, 80
    w.num_requests, w.arrival, w.rate = requests, "poisson", rate
    w.prompt_dist = w.output_dist = "lognormal"
    cfg.run.seed = seed
    return cfg


def mean_tpot(cfg: StudyConfig) -> float:
    """Mean time per output token over the run's requests."""
    _, result = simulate(cfg)
    return float(requests_frame(result)["tpot_s"].mean())


def study(scenario: str, requests: int, seed: int) -> tuple[list[float], dict[str, list[float]]]:
    """Speedups per line at each rate of one engine, printed as a markdown table."""
    rates, disable_at = SCENARIOS[scenario]
    levels = {**LEVELS, f"acceptance {HIGH}, disable_by_batch_size = {disable_at}": (HIGH, disable_at)}
    table: dict[str, list[float]] = {name: [] for name in levels}
    print(f"\n{scenario}:\n")
    print("| rate (req/s) | plain TPOT (ms) | " + " | ".join(f"speedup, {n}" for n in levels) + " |")
    print("|---" * (2 + len(levels)) + "|")
    for rate in rates:
        cfg = base(scenario, requests, rate, seed)
        plain = mean_tpot(cfg)
        row = []
        for name, (rates_, disable) in levels.items():
            spec_cfg = dataclasses.replace(cfg)
            spec_cfg.speculative = dataclasses.replace(cfg.speculative, method="ngram", num_speculative_tokens=4,
                                                       acceptance_rates=list(rates_),
                                                       disable_by_batch_size=disable)
            speedup = plain / mean_tpot(spec_cfg)
            table[name].append(speedup)
            row.append(f"{speedup:.2f}")
        print(f"| {rate:g} | {plain * 1e3:.2f} | " + " | ".join(row) + " |")
    return rates, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/img/spec_study.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    titles = {"cpu": "SmolLM2-135M, 1 CPU thread (fitted profile)", "h100": "Llama-3-8B, 1x H100 (roofline)"}
    for ax, scenario in zip(axes, SCENARIOS):
        rates, table = study(scenario, args.requests, args.seed)
        for name, ys in table.items():
            ax.plot(rates, ys, marker="o", label=name, linestyle="--" if "disable" in name else "-")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("speedup in mean TPOT (plain / speculative)")
        ax.set_title(f"{titles[scenario]}, ngram k = 4", fontsize=9)
        ax.legend(fontsize=7)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
