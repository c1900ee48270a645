"""Where a host KV tier pays: TTFT and goodput against host tier size, LRU against LRFU, at two rates,
and TTFT against the host link's bandwidth.

    python experiments/host_tier_study.py [--config experiments/host_tier_study.toml] [--rates 2,6]
        [--sizes 0,1,2,4,8,16] [--bandwidths 2e9,4e9,8e9,16e9,32e9,64e9,450e9]
        [--requests N] [--workers N] [--out docs/img/host_tier_sim.png]

The study TOML gives the engine and the multi-turn workload; each point sets kv_offload.host_blocks
to a multiple of the device pool (engine.num_gpu_blocks), eviction lru or lrfu, and workload.rate.
The link sweep runs the largest tier with LRU at the higher rate. Prints one markdown table per
sweep (TTFT p50/p99, goodput, device and host hit rates, the link's busy share) and writes one
figure: TTFT and goodput against tier size, TTFT against bandwidth.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from twinserve.sim.config import StudyConfig, load_config, set_field
from twinserve.sim.runner import PointFailure, run_jobs
from twinserve.sim.study import run_point

COLUMNS = ("p50_ttft_s", "p99_ttft_s", "goodput", "request_throughput", "prefix_hit_rate", "host_hit_rate",
           "link_load_busy", "host_blocks_loaded")


def point(base: StudyConfig, rate: float, size: float, eviction: str, bandwidth: float = -1.0) -> StudyConfig:
    """The study at one rate, tier size (x the device pool), eviction and link bandwidth."""
    cfg = copy.deepcopy(base)
    set_field(cfg, "workload.rate", rate)
    cfg.kv_offload.host_size_gib = 0.0
    set_field(cfg, "kv_offload.host_blocks", int(round(size * cfg.engine.num_gpu_blocks)))
    set_field(cfg, "kv_offload.eviction", eviction)
    set_field(cfg, "kv_offload.bandwidth", bandwidth)
    return cfg


def _row(cfg: StudyConfig) -> dict[str, Any]:
    row = run_point(cfg).row
    return {k: row.get(k, 0.0) for k in COLUMNS}


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table."""
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run both sweeps, print their tables, write the figure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/host_tier_study.toml", help="the study TOML")
    ap.add_argument("--rates", default="2,6", help="workload.rate values (conversations/s)")
    ap.add_argument("--sizes", default="0,1,2,4,8,16", help="host tier sizes, x the device pool")
    ap.add_argument("--bandwidths", default="2e9,4e9,8e9,16e9,32e9,64e9,450e9",
                    help="host link bandwidths (bytes/s per direction) for the link sweep")
    ap.add_argument("--requests", type=int, default=None, help="workload.num_requests (conversations)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the CPUs)")
    ap.add_argument("--out", default="docs/img/host_tier_sim.png", help="the figure")
    args = ap.parse_args(argv)
    base = load_config(args.config)
    if not base.engine.num_gpu_blocks:
        print("the study must fix engine.num_gpu_blocks (tier sizes are multiples of it)", file=sys.stderr)
        return 2
    if args.requests:
        set_field(base, "workload.num_requests", args.requests)
    rates = [float(x) for x in args.rates.split(",")]
    sizes = [float(x) for x in args.sizes.split(",")]
    bandwidths = [float(x) for x in args.bandwidths.split(",")]
    keys: list[tuple] = []
    for rate in rates:
        for size in sizes:
            for ev in (("lru",) if size == 0 else ("lru", "lrfu")):
                keys.append(("size", rate, size, ev, -1.0))
    top = max(sizes)
    keys += [("link", max(rates), top, "lru", bw) for bw in bandwidths]
    jobs = [point(base, r, s, ev, bw) for _, r, s, ev, bw in keys]
    out = run_jobs(_row, jobs, [{"rate": k[1], "size": k[2], "eviction": k[3], "bandwidth": k[4]} for k in keys],
                   args.workers, desc="host tier")
    failed = [o for o in out if isinstance(o, PointFailure)]
    if failed:
        print("\n".join(f.describe() for f in failed), file=sys.stderr)
        return 1
    res = dict(zip(keys, out))
    pool_gib = base.engine.num_gpu_blocks * block_gib(base)
    print(f"{args.config}: device pool {base.engine.num_gpu_blocks} blocks ({pool_gib:.3g} GiB); "
          f"{base.workload.num_requests} conversations x {base.workload.turns} turns per rate\n")
    head = ["rate", "tier (x pool)", "tier GiB", "eviction", "TTFT p50 s", "TTFT p99 s", "goodput req/s",
            "device hit", "host hit", "link busy"]
    rows = [[k[1], k[2], k[2] * pool_gib, k[3], v["p50_ttft_s"], v["p99_ttft_s"], v["goodput"],
             v["prefix_hit_rate"], v["host_hit_rate"], v["link_load_busy"]]
            for k, v in res.items() if k[0] == "size"]
    print(table(head, rows) + "\n")
    head = ["bandwidth GB/s", "TTFT p50 s", "TTFT p99 s", "goodput req/s", "host hit", "link busy"]
    link_rows = [[k[4] / 1e9, v["p50_ttft_s"], v["p99_ttft_s"], v["goodput"], v["host_hit_rate"],
                  v["link_load_busy"]] for k, v in res.items() if k[0] == "link"]
    off = res[("size", max(rates), 0.0, "lru", -1.0)]
    print(f"link sweep: rate {max(rates):g}, tier {top:g} x pool, LRU; no tier: TTFT p50 "
          f"{off['p50_ttft_s']:.3g} s, p99 {off['p99_ttft_s']:.3g} s\n")
    print(table(head, link_rows))
    plot(res, rates, sizes, bandwidths, off, Path(args.out))
    print(f"\nwrote {args.out}")
    return 0


def block_gib(cfg: StudyConfig) -> float:
    """GiB one KV block takes over the replica's GPUs."""
    from twinserve.sim.build import build_cost_models, engine_capacity

    model, hw, _, _ = build_cost_models(cfg)
    cap = engine_capacity(cfg, model, hw)
    return cap.block_bytes * cfg.engine.tensor_parallel_size * cfg.engine.pipeline_parallel_size / 2 ** 30


def plot(res: dict, rates: list[float], sizes: list[float], bandwidths: list[float], off: dict,
         out: Path) -> None:
    """Three panels: TTFT p50/p99 and goodput against tier size; TTFT against link bandwidth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.3))
    colors = {rates[0]: "tab:blue", rates[-1]: "tab:red"}
    x = [s if s > 0 else min(s for s in sizes if s > 0) / 2 for s in sizes]  # 0 drawn left of the rest
    for rate in rates:
        for ev, style in (("lru", "-"), ("lrfu", ":")):
            pts = [res[("size", rate, s, "lru" if s == 0 else ev, -1.0)] for s in sizes]
            c = colors.get(rate, "tab:gray")
            ax[0].plot(x, [p["p50_ttft_s"] for p in pts], style, marker="o", color=c, label=f"{rate:g}/s {ev} p50")
            ax[0].plot(x, [p["p99_ttft_s"] for p in pts], style, marker="^", color=c, alpha=0.5,
                       label=f"{rate:g}/s {ev} p99")
            ax[1].plot(x, [p["goodput"] for p in pts], style, marker="o", color=c, label=f"{rate:g}/s {ev}")
    for a in ax[:2]:
        a.set_xscale("log", base=2)
        a.set_xticks(x, ["0"] + [f"{s:g}" for s in sizes if s > 0])
        a.set_xlabel("host tier size (x the device pool)")
        a.grid(alpha=0.3)
    ax[0].set_yscale("log")
    ax[0].set_ylabel("TTFT (s)")
    ax[0].set_title("TTFT p50 (o) and p99 (^)")
    ax[0].legend(fontsize=6, ncol=2)
    ax[1].set_ylabel("goodput (requests/s within the SLOs)")
    ax[1].set_title("goodput")
    ax[1].legend(fontsize=7)
    pts = [res[("link", max(rates), max(sizes), "lru", bw)] for bw in bandwidths]
    gb = [bw / 1e9 for bw in bandwidths]
    ax[2].plot(gb, [p["p50_ttft_s"] for p in pts], "-o", color="tab:red", label="p50, tier")
    ax[2].plot(gb, [p["p99_ttft_s"] for p in pts], "-^", color="tab:red", alpha=0.5, label="p99, tier")
    ax[2].axhline(off["p50_ttft_s"], color="k", ls="--", lw=1, label="p50, no tier")
    ax[2].axhline(off["p99_ttft_s"], color="k", ls=":", lw=1, label="p99, no tier")
    ax[2].set_xscale("log")
    ax[2].set_yscale("log")
    ax[2].set_xlabel("host link bandwidth per direction (GB/s)")
    ax[2].set_ylabel("TTFT (s)")
    ax[2].set_title(f"link sweep: {max(rates):g}/s, tier {max(sizes):g} x pool, LRU")
    ax[2].grid(alpha=0.3)
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
