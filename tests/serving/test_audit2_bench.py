"""`twinserve bench`: --goodput in milliseconds, and a stream's token times from the chunks that carry
text only (docs/test-audit.md, round 2)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from twinserve.bench.cli import parse_goodput
from twinserve.bench.client import BenchTarget, _one
from twinserve.sim.workload import WorkItem


def test_goodput_targets_are_read_in_milliseconds_as_vllm_bench_serve_reads_them() -> None:
    slo = parse_goodput(["ttft:250", "tpot:50"])
    assert slo.ttft_s == pytest.approx(0.25) and slo.tpot_s == pytest.approx(0.05)


def _sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def test_a_closing_chunk_without_text_is_not_counted_as_a_token() -> None:
    # vLLM ends a completions stream with a finish_reason chunk whose text is "" and a usage chunk.
    body = _sse(*({"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b", "c")),
                {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://bench") as client:
            return await _one(client, BenchTarget("http://bench", "m"), WorkItem("r0", 0.0, 4, 3, 0),
                              [5, 6, 7, 8], time.perf_counter())

    rec = asyncio.run(go())
    assert rec.error == "" and rec.finish_reason == "length"
    assert rec.num_output_tokens == 3
    assert len(rec.token_times) == 3  # one time per text chunk: 2 ITL gaps, not 3
    assert rec.finish_time is not None and rec.first_token_time == rec.token_times[0]


def test_queue_time_is_measured_from_the_requests_own_send_time() -> None:
    # The server reports queue_s = 0.5; the request left 100 s into the run.
    body = _sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
                {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
                 "metrics": {"queue_s": 0.5, "num_preemptions": 1}})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://bench") as client:
            return await _one(client, BenchTarget("http://bench", "m"), WorkItem("r0", 100.0, 2, 2, 0),
                              [5, 6], time.perf_counter() - 100.0)

    rec = asyncio.run(go())
    assert rec.error == "" and rec.arrival_time >= 100.0 and rec.num_preemptions == 1
    assert rec.first_scheduled_time - rec.arrival_time == pytest.approx(0.5)


def test_a_trace_in_milliseconds_is_refused_unless_its_unit_is_given(tmp_path) -> None:
    import argparse

    from twinserve.backends.real.serving.flags import add_bench_args
    from twinserve.bench.cli import bench_workload, workload_config
    from twinserve.sim.errors import TraceError

    trace = tmp_path / "ms.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{200 * i},{10 + i},5\n" for i in range(20)))

    def workload(*flags: str):
        p = argparse.ArgumentParser()
        add_bench_args(p)
        ns = p.parse_args(["--dataset-name", "trace", "--trace", str(trace), "--trace-arrivals",
                           "--num-prompts", "20", *flags])
        return bench_workload(ns, workload_config(ns, 1000), 4096)

    with pytest.raises(TraceError, match="--trace-time-unit"):
        next(workload().items())
    times = [i.arrival_time for i in workload("--trace-time-unit", "ms").items()]
    assert times[:3] == pytest.approx([0.0, 0.2, 0.4])
    # Stated as seconds, a sparse trace runs as read.
    assert [i.arrival_time for i in workload("--trace-time-unit", "s").items()][1] == pytest.approx(200.0)
