"""`twinserve bench` against the tiny server: the simulator's workloads and per-request schema."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from twinserve.bench.cli import summarize_run, workload_config
from twinserve.core.errors import InvalidConfigError
from twinserve.bench.client import BenchTarget, run_benchmark
from twinserve.backends.real.serving.flags import add_bench_args
from twinserve.sim.config import SLOConfig
from twinserve.sim.metrics import requests_frame
from twinserve.sim.workload import Workload, WorkloadConfig
from twinserve.sim.world import RequestRecord, RunResult, StepLog

from .conftest import RunningServer


def _ns(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bench_args(p)
    return p.parse_args(list(argv))


def test_flags_map_onto_the_simulator_workload() -> None:
    cfg = workload_config(_ns("--request-rate", "4", "--burstiness", "0.5", "--random-input-len", "100",
                              "--random-range-ratio", "0.5"), 1000)
    assert (cfg.arrival, cfg.rate, cfg.burstiness) == ("gamma", 4.0, 0.5)
    assert (cfg.prompt_dist, cfg.prompt_min, cfg.prompt_max) == ("uniform", 50, 150)
    assert workload_config(_ns(), 1000).arrival == "all_at_once"
    assert workload_config(_ns("--request-rate", "2"), 1000).arrival == "poisson"
    shared = workload_config(_ns("--dataset-name", "shared-prefix", "--num-system-prompts", "3"), 1000)
    assert shared.num_system_prompts == 3 and shared.system_prompt_len == 64
    trace = workload_config(_ns("--dataset-name", "trace", "--trace-arrivals"), 1000)
    assert trace.arrival == "trace" and Path(trace.trace).exists()


def test_max_concurrency_at_rate_inf_is_the_simulators_closed_loop() -> None:
    cfg = workload_config(_ns("--max-concurrency", "8", "--think-time-s", "0.5", "--warmup-requests", "3"), 1000)
    assert (cfg.concurrency, cfg.think_time_s, cfg.warmup_requests) == (8, 0.5, 3)
    # aiperf's name for the warm-up count is accepted too.
    assert workload_config(_ns("--max-concurrency", "2", "--warmup-request-count", "4"), 1000).warmup_requests == 4
    # A finite rate with a cap stays an open-loop schedule (vLLM's semaphore), no clients.
    assert workload_config(_ns("--max-concurrency", "8", "--request-rate", "4"), 1000).concurrency == 0
    for argv, name in ((["--think-time-s", "1"], "think_time_s"), (["--warmup-requests", "2"], "warmup_requests"),
                       (["--max-concurrency", "4", "--request-rate", "2", "--warmup-requests", "2"],
                        "warmup_requests"),
                       (["--max-concurrency", "0"], "max_concurrency"),
                       (["--max-concurrency", "2", "--think-time-s", "-1"], "think_time_s")):
        with pytest.raises(InvalidConfigError, match=name):
            workload_config(_ns(*argv), 1000)


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("argv, field", [(["--max-concurrency", "0"], "max_concurrency"),
                                         (["--max-concurrency", "-2"], "max_concurrency"),
                                         (["--request-rate", "0"], "request_rate"),
                                         (["--num-prompts", "0"], "num_prompts")])
def test_bad_flags_exit_2_before_the_server_is_asked(capsys, argv: list[str], field: str) -> None:
    from twinserve.cli import main

    rc = main(["bench", "--base-url", f"http://127.0.0.1:{_closed_port()}", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and f"config {field}=" in err and "no OpenAI-compatible server" not in err, err


def test_an_unreachable_server_exits_2_naming_its_url_without_a_traceback(capsys) -> None:
    from twinserve.cli import main

    url = f"http://127.0.0.1:{_closed_port()}"
    rc = main(["bench", "--base-url", url, "--max-concurrency", "2", "--num-prompts", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and f"no OpenAI-compatible server at {url} (GET /v1/models: ConnectError" in err, err


def test_bench_closed_loop_clients_are_sequential_and_warm_up_is_left_out(server: RunningServer) -> None:
    cfg = WorkloadConfig(num_requests=10, prompt_dist="uniform", prompt_min=4, prompt_max=30,
                         output_dist="uniform", output_min=2, output_max=10, vocab_size=250,
                         concurrency=3, think_time_s=0.02, warmup_requests=4)
    run = asyncio.run(run_benchmark(BenchTarget(server.url, "tiny"), Workload(cfg, seed=1, max_model_len=256)))
    assert run.errors == [] and len(run.records) == 14 and run.peak_in_flight <= 3
    by_client: dict[int, list[RequestRecord]] = {}
    for r in run.records:
        by_client.setdefault(r.client, []).append(r)
    assert set(by_client) <= {0, 1, 2}
    for rs in by_client.values():
        rs.sort(key=lambda r: r.arrival_time)
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt.arrival_time >= prev.finish_time + 0.02
    # The same client model as the simulator: in flight never above 3 at any send.
    for r in run.records:
        assert sum(1 for o in run.records if o.arrival_time <= r.arrival_time < o.finish_time) <= 3
    req, summary = summarize_run(run, SLOConfig(ttft_s=60, tpot_s=60))
    assert req["warmup"].sum() == 4 and summary["num_requests"] == 10 and summary["completed"] == 10
    measured = req[~req["warmup"]]
    window = measured["finish_s"].max() - measured["arrival_s"].min()
    assert summary["duration_s"] == pytest.approx(window)
    assert summary["total_output_tokens"] == measured["output_tokens"].sum()


def test_bench_run_lengths_and_schema_match_the_simulator(server: RunningServer) -> None:
    cfg = WorkloadConfig(num_requests=12, arrival="poisson", rate=40.0, prompt_dist="uniform", prompt_min=4,
                         prompt_max=40, output_dist="uniform", output_min=2, output_max=16,
                         num_system_prompts=2, system_prompt_len=16, vocab_size=250)
    expected = {it.request_id: it.num_output_tokens for it in Workload(cfg, seed=3, max_model_len=256).items()}
    target = BenchTarget(server.url, "tiny")
    run = asyncio.run(run_benchmark(target, Workload(cfg, seed=3, max_model_len=256), max_concurrency=4))
    assert run.errors == [] and run.peak_in_flight <= 4
    req, summary = summarize_run(run, SLOConfig(ttft_s=60, tpot_s=60))
    # Column for column the simulator's per-request table.
    sim = requests_frame(RunResult([RequestRecord("x", 0, 1, 1, 0, 0, 1, 0, 0, [0.0])], StepLog(),
                                   1, 1, 0, 0, 0, 0, 0, 0, 0))
    assert list(req.columns) == list(sim.columns)
    assert dict(zip(req["request_id"], req["output_tokens"])) == expected
    assert (req["finish_reason"] == "length").all()
    assert (req["ttft_s"] > 0).all() and (req["e2e_s"] >= req["ttft_s"]).all()
    assert req["queue_s"].notna().all()
    # A shared system prompt seen twice is served from the prefix cache.
    assert req["prefix_hit_tokens"].sum() > 0
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["goodput"] == pytest.approx(summary["request_throughput"])
    assert summary["output_throughput"] == pytest.approx(sum(expected.values()) / summary["duration_s"])
    for key in ("mean_ttft_s", "p50_tpot_s", "p99_itl_s", "p99_e2e_s"):
        assert math.isfinite(summary[key]), key


@pytest.mark.slow
def test_bench_cli_prints_the_report_and_writes_the_csv(server: RunningServer, tmp_path: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "twinserve.cli", "bench", "--port", port, "--num-prompts", "6",
                          "--random-input-len", "12", "--random-output-len", "5", "--max-concurrency", "3",
                          "--goodput", "ttft:60000", "tpot:60000", "--result-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    for line in ("Successful requests:", "Failed requests:", "Request goodput", "Median TTFT (ms):",
                 "P99 TPOT (ms):", "Mean ITL (ms):", "P99 E2E (ms):", "Output token throughput (tok/s):"):
        assert line in out.stdout, line
    assert re.search(r"Successful requests:\s+6\n", out.stdout)
    df = pd.read_csv(tmp_path / "requests.csv")
    assert len(df) == 6 and (df["output_tokens"] == 5).all()
    # A request whose text arrived in one chunk has no gaps to list (its tokens were held back as an
    # incomplete character); every listed gap is finite, and some request streamed several chunks.
    itl = df["itl_s"].dropna().astype(str).str.split(";")
    assert len(itl) >= 1 and all(np.isfinite([float(v) for v in x]).all() for x in itl)
    assert (tmp_path / "summary.json").exists()
    # Progress on stderr (issue 53 item 26: the README's size ran silently for 15 minutes on a CPU).
    assert "bench: 6 requests to" in out.stderr and re.search(r"bench: 100%.*6/6.*0 failed", out.stderr)


def test_the_progress_bar_redraws_on_a_terminal_and_logs_every_interval_elsewhere() -> None:
    """Issue 53 item 26, a progress bar (tqdm) on stderr: on a terminal each finished request redraws it
    in place with the failures counted (the hand-made line printed only the first and last request and
    every 10 s, also on a terminal); in a log it is written at most every 10 s, and closed at the end."""
    import io

    from twinserve.bench.cli import ProgressBar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = ProgressBar(file=tty, mininterval=0)
    for done, t in ((1, 1.0), (2, 5.0), (3, 6.0), (4, 7.0), (5, 8.0)):
        bar(done, 5, done // 4, t)
    frames = [f for f in tty.getvalue().split("\r") if f.strip()]
    shown = [m.group(1) for m in (re.search(r"\b(\d)/5\b", f) for f in frames) if m]
    assert list(dict.fromkeys(shown)) == ["0", "1", "2", "3", "4", "5"]
    assert frames[-1].startswith("bench: 100%") and "1 failed" in frames[-1]  # errors: done // 4
    assert bar.bar is None or bar.bar.disable  # closed once all are done
    log = io.StringIO()
    bar = ProgressBar(file=log)
    assert bar.mininterval == 10.0
    for done in range(1, 6):
        bar(done, 5, 0, float(done))
    assert "5/5" in log.getvalue().split("\r")[-1] and "3/5" not in log.getvalue()
