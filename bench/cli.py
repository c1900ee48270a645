"""`twinserve bench`: workload from flags, the run, a `vllm bench serve`-style report, CSV + JSON out."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from twinserve.core.errors import InvalidConfigError
from twinserve.sim.clients import closed_loop_line
from twinserve.sim.config import SLOConfig
from twinserve.sim.metrics import requests_frame, steps_frame, summarize
from twinserve.sim.report import write_table
from twinserve.sim.trace_paths import UnknownBuiltinTrace, trace_path
from twinserve.sim.workload import Workload, WorkloadConfig
from twinserve.sim.world import RunResult, StepLog
from twinserve.bench.client import BenchRun, BenchTarget, run_benchmark, server_info


def workload_config(ns: argparse.Namespace, vocab_size: int) -> WorkloadConfig:
    """The simulator's WorkloadConfig for these flags."""
    rate = ns.request_rate
    if rate <= 0 or math.isnan(rate):
        raise InvalidConfigError("request_rate", rate, "a number > 0 (inf: all at once)")
    if ns.burstiness <= 0:
        raise InvalidConfigError("burstiness", ns.burstiness, "a number > 0")
    if ns.num_prompts < 1:
        raise InvalidConfigError("num_prompts", ns.num_prompts, "an integer >= 1")
    arrival = "all_at_once" if math.isinf(rate) else ("poisson" if ns.burstiness == 1.0 else "gamma")
    cfg = WorkloadConfig(num_requests=ns.num_prompts, arrival=arrival, rate=rate if not math.isinf(rate) else 1.0,
                         burstiness=ns.burstiness, vocab_size=vocab_size, output_min=1, prompt_min=1)
    closed_loop_flags(ns, cfg)
    r = ns.random_range_ratio
    if not 0.0 <= r < 1.0:
        raise InvalidConfigError("random_range_ratio", r, "a number in [0, 1)")
    for prefix, length in (("prompt", ns.random_input_len), ("output", ns.random_output_len)):
        if length < 1:
            raise InvalidConfigError(f"random_{'input' if prefix == 'prompt' else 'output'}_len", length,
                                     "an integer >= 1")
        setattr(cfg, f"{prefix}_dist", "fixed" if r == 0 else "uniform")
        setattr(cfg, f"{prefix}_mean", float(length))
        setattr(cfg, f"{prefix}_min", max(1, int(length * (1 - r))))
        setattr(cfg, f"{prefix}_max", max(1, int(math.ceil(length * (1 + r)))))
    if ns.dataset_name == "shared-prefix":
        cfg.num_system_prompts = ns.num_system_prompts
        cfg.system_prompt_len = ns.system_prompt_len
        cfg.system_prompt_zipf = ns.system_prompt_zipf
    elif ns.dataset_name == "trace":
        try:
            cfg.trace = trace_path(ns.trace)  # simulate's resolver: builtin:NAME or a path
        except UnknownBuiltinTrace as e:
            raise InvalidConfigError("trace", ns.trace, f"a CSV path or a builtin trace ({e})") from None
        cfg.prompt_dist = cfg.output_dist = "trace"
        cfg.time_scale = ns.trace_time_scale
        if getattr(ns, "trace_time_unit", None):
            cfg.trace_time_unit = ns.trace_time_unit
        if ns.trace_arrivals:
            cfg.arrival = "trace"
    return cfg


def closed_loop_flags(ns: argparse.Namespace, cfg: WorkloadConfig) -> None:
    """--max-concurrency N with --request-rate inf: N closed-loop clients, as `vllm bench serve` runs
    them (and the simulator's [workload] concurrency); --think-time-s and --warmup-requests need them."""
    think, warm, n = ns.think_time_s, ns.warmup_requests, ns.max_concurrency
    if n is not None and n < 1:
        raise InvalidConfigError("max_concurrency", n, "an integer >= 1")
    if think < 0 or not math.isfinite(think):
        raise InvalidConfigError("think_time_s", think, "seconds >= 0")
    if warm < 0:
        raise InvalidConfigError("warmup_requests", warm, "an integer >= 0")
    if n is not None and math.isinf(ns.request_rate):
        cfg.concurrency, cfg.think_time_s, cfg.warmup_requests = n, think, warm
        cfg.arrival = "poisson"  # unused: clients send when they are free
    elif think or warm:
        raise InvalidConfigError("think_time_s" if think else "warmup_requests", think or warm,
                                 "closed-loop clients: --max-concurrency N with --request-rate inf "
                                 "(the default)")


def parse_goodput(specs: list[str]) -> SLOConfig:
    """SLOs from 'ttft:MS tpot:MS' (the simulator's defaults for what is not given)."""
    slo = SLOConfig()
    for spec in specs:
        key, _, value = spec.partition(":")
        if key not in ("ttft", "tpot") or not value:
            raise InvalidConfigError("goodput", spec, "KEY:MS with KEY ttft or tpot, e.g. ttft:2000")
        setattr(slo, f"{key}_s", float(value) / 1000.0)
    return slo


def summarize_run(run: BenchRun, slo: SLOConfig) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The per-request table and the summary, computed by the simulator's own functions."""
    recs = run.records
    result = RunResult(recs, StepLog(), run.duration_s, run.duration_s, 0, 0, 0,
                       sum(r.num_preemptions for r in recs), sum(r.num_prompt_tokens for r in recs),
                       sum(r.prefix_hit_tokens for r in recs), 0)
    req = requests_frame(result)
    summary = summarize(result, req, steps_frame(result), slo)
    summary["failed"] = int(summary["num_requests"] - summary["completed"])
    summary["max_concurrency"] = run.max_concurrency
    summary["peak_in_flight"] = run.peak_in_flight
    measured = req[~req["warmup"].astype(bool)] if "warmup" in req.columns else req
    done = measured[measured["finish_s"].notna()] if not measured.empty else measured
    summary["total_input_tokens"] = int(done["prompt_tokens"].sum()) if len(done) else 0
    summary["total_output_tokens"] = int(done["output_tokens"].sum()) if len(done) else 0
    for key in ("sim_wall_s", "sim_requests_per_wall_s", "littles_L", "mean_kv_usage", "max_kv_usage",
                "mean_batch_size", "mean_queue_len", "num_steps", "kv_blocks"):
        summary.pop(key, None)  # engine-side quantities a client cannot see
    return req, summary


def format_report(s: dict[str, Any], slo: SLOConfig) -> str:
    """A plain-text report with the figures `vllm bench serve` prints."""
    def ms(key: str) -> str:
        v = s.get(key)
        return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.2f}"

    lines = [f"{'=' * 18} twinserve bench {'=' * 18}"]
    rows = [("Successful requests", s["completed"]), ("Failed requests", s["failed"]),
            ("Maximum request concurrency", s["max_concurrency"]),
            ("Benchmark duration (s)", f"{s['duration_s']:.2f}"),
            ("Total input tokens", s["total_input_tokens"]), ("Total generated tokens", s["total_output_tokens"]),
            ("Request throughput (req/s)", f"{s['request_throughput']:.3f}"),
            ("Output token throughput (tok/s)", f"{s['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{s['total_token_throughput']:.2f}"),
            (f"Request goodput (req/s, TTFT<={slo.ttft_s * 1000:g}ms TPOT<={slo.tpot_s * 1000:g}ms)",
             f"{s['goodput']:.3f}")]
    lines += [f"{k + ':':<52}{v}" for k, v in rows]
    for name, label in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2e", "End-to-end Latency")):
        lines.append(f"{'-' * 10} {label} {'-' * 10}")
        for stat, key in (("Mean", "mean"), ("Median", "p50"), ("P99", "p99")):
            lines.append(f"{f'{stat} {name.upper()} (ms):':<52}{ms(f'{key}_{name}_s')}")
    lines.append("=" * 52)
    return "\n".join(lines)


class ProgressBar:
    """Requests done, failed and the time left as a tqdm bar on stderr: redrawn in place on a terminal,
    written at most every `every_s` seconds elsewhere (a log); closed when the last request is done."""

    def __init__(self, file: Any = None, every_s: float = 10.0, mininterval: float | None = None) -> None:
        self.file = file if file is not None else sys.stderr
        tty = bool(getattr(self.file, "isatty", lambda: False)())
        self.mininterval = mininterval if mininterval is not None else (0.2 if tty else every_s)
        self.bar: Any = None

    def __call__(self, done: int, total: int, errors: int, seconds: float) -> None:
        """Called as each request ends (seconds: since the first was sent; tqdm keeps its own clock)."""
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="bench", unit="req", file=self.file, mininterval=self.mininterval,
                            miniters=1, dynamic_ncols=True)
        self.bar.set_postfix_str(f"{errors} failed", refresh=False)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        """Write the bar's last state and end its line (a run cut short)."""
        if self.bar is not None:
            self.bar.close()


def bench_workload(ns: argparse.Namespace, cfg: WorkloadConfig, max_len: int) -> Workload:
    """The run's workload; a trace's arrival rate is checked unless --trace-time-unit states its unit."""
    workload = Workload(cfg, seed=ns.seed, max_model_len=max_len)
    workload.check_trace_rate = not getattr(ns, "trace_time_unit", None)
    workload.unit_setting = "--trace-time-unit"
    return workload


def run_bench(ns: argparse.Namespace) -> int:
    """Entry point of `twinserve bench`."""
    base_url = ns.base_url or f"http://{ns.host}:{ns.port}"
    workload_config(ns, ns.vocab_size or 2)  # every flag checked before the server is asked anything
    info = asyncio.run(server_info(base_url, ns.api_key))
    vocab = ns.vocab_size or info.get("vocab_size")
    if not vocab:
        raise InvalidConfigError("vocab_size", None, "an integer: the server did not report one")
    max_len = ns.max_model_len or int(info.get("max_model_len") or 4096)
    cfg = workload_config(ns, int(vocab))
    workload = bench_workload(ns, cfg, max_len)
    slo = parse_goodput(ns.goodput)
    target = BenchTarget(base_url, ns.model or info["id"], ns.endpoint, ns.api_key, ns.ignore_eos,
                         ns.request_timeout)
    print(f"bench: {ns.num_prompts} requests to {base_url} ...", file=sys.stderr, flush=True)
    progress = ProgressBar()
    try:
        run = asyncio.run(run_benchmark(target, workload, ns.max_concurrency, progress))
    finally:
        progress.close()
    req, summary = summarize_run(run, slo)
    summary.update(label=ns.label, request_rate=ns.request_rate, burstiness=ns.burstiness,
                   dataset=ns.dataset_name, num_prompts=ns.num_prompts, model=target.model)
    if cfg.concurrency:
        summary.update(concurrency=cfg.concurrency, think_time_s=cfg.think_time_s)
        print(closed_loop_line(cfg) + " (left out of the figures below)")
    print(format_report(summary, slo))
    if run.errors:
        print(f"first error: {run.errors[0]}")
    if ns.result_dir:
        out = Path(ns.result_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = write_table(req, out / "requests", fmt="csv")
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        print(f"wrote {written} and {out / 'summary.json'}")
    return 0 if summary["completed"] > 0 else 1
