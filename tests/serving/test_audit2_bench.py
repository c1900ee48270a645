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
