"""Cluster scale: a million requests on 16 simulated replicas in bounded memory.

Lengths from the Azure conversation trace (cycled), Poisson arrivals, Llama-2-7B on
A100-80GB per replica, prefix caching off unless --prefix-caching. Per-request records stream to a CSV file and
aggregate online (sim.stream.RecordStream); no step log is kept. Prints wall time,
simulated requests per wall-second, peak RSS and the cluster's latency percentiles.
Measure peak RSS from outside as well: /usr/bin/time -v python experiments/bench_cluster_scale.py

    python experiments/bench_cluster_scale.py [--requests N] [--replicas R] [--rate Q]
        [--router NAME] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from tqdm import tqdm

from twinserve.sim.cluster_study import build_cluster, imbalance
from twinserve.sim.config import StudyConfig, validate
from twinserve.sim.stream import RecordStream

# The full trace in ../shared beside the repository, when present.
TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def scale_config(requests: int, replicas: int, rate: float, router: str,
                 prefix_caching: bool = False) -> StudyConfig:
    """The benchmark's study."""
    cfg = StudyConfig()
    cfg.engine.model = "Llama-2-7B"
    cfg.engine.hardware = "A100-80GB"
    cfg.scheduler.max_model_len = 4096
    # The trace's prompts share no tokens (its token ids are not published): a prefix cache
    # would only hash blocks that never hit, so it is off, as in bench_simulator.py.
    cfg.scheduler.enable_prefix_caching = prefix_caching
    w = cfg.workload
    w.trace = str(TRACE) if TRACE.exists() else "builtin:azure_conv"
    w.trace_cycle = True
    w.prompt_dist = w.output_dist = "trace"
    w.arrival = "poisson"
    w.rate = rate
    w.num_requests = requests
    cfg.cluster.num_replicas = replicas
    cfg.cluster.router = router
    validate(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate", type=float, default=48.0, help="requests per second (cluster)")
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--out", default="cluster-scale-requests.csv", help="per-request CSV ('' = none)")
    ap.add_argument("--prefix-caching", action="store_true")
    args = ap.parse_args(argv)
    cfg = scale_config(args.requests, args.replicas, args.rate, args.router, args.prefix_caching)
    bar = tqdm(total=args.requests, unit="req", mininterval=2.0, desc="simulated")
    sink = RecordStream(args.out or None, progress=bar.update, progress_every=1000)
    built = build_cluster(cfg, keep_steps=False, keep_records=False, on_record=sink)
    t0 = time.perf_counter()
    res = built.simulation.run()
    wall = time.perf_counter() - t0
    sink.close()
    bar.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = sink.summary()
    print(f"{args.requests:,} requests on {args.replicas}x Llama-2-7B / A100-80GB, router "
          f"{args.router}, Poisson {args.rate} req/s, lengths from {cfg.workload.trace} "
          f"(cycled); python {sys.version.split()[0]}, 1 process")
    print(f"clipped over max_model_len: {built.workload.length_stats.clipped:,}; "
          f"refused: {s['refused']:,}")
    print(f"simulated {s['completed']:,} completed requests over {res.total.end_time:,.0f} s of "
          f"simulated time; {res.total.num_steps:,} engine steps, "
          f"{res.total.num_ff_windows:,} fast-forward windows")
    print(f"wall {wall:.1f} s; simulated requests per wall-second: {s['completed'] / wall:,.0f}")
    print(f"peak RSS (getrusage): {rss:,.0f} MiB")
    print(f"cluster: {s['request_throughput']:.2f} req/s, p50/p99 TTFT {s['p50_ttft_s']:.3f}/"
          f"{s['p99_ttft_s']:.3f} s, mean TPOT {s['mean_tpot_s'] * 1e3:.1f} ms, p50 E2E "
          f"{s['p50_e2e_s']:.2f} s, load imbalance {imbalance([float(x) for x in res.routed]):.3f}, "
          f"prefix hit rate {res.total.prefix_hits / max(res.total.prefix_queries, 1):.3f}")


if __name__ == "__main__":
    main()
