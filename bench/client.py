"""Drive a running server over HTTP with a simulator workload; record each request as the simulator does.

Requests leave at the workload's arrival times, streamed from /v1/completions; each becomes a
sim.world.RequestRecord, so sim.metrics summarises a real run as it does a simulated one.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from twinserve.core.errors import TwinserveError
from twinserve.sim.workload import WorkItem, Workload
from twinserve.sim.world import RequestRecord


@dataclass(slots=True)
class BenchTarget:
    """Where and how to send requests."""

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    api_key: str | None = None
    ignore_eos: bool = True
    timeout_s: float = 600.0


@dataclass(slots=True)
class BenchRun:
    """Everything one benchmark run produced."""

    records: list[RequestRecord]
    duration_s: float
    max_concurrency: int | None
    peak_in_flight: int = 0
    errors: list[str] = field(default_factory=list)


class ServerUnreachableError(TwinserveError, ConnectionError):
    """The server did not answer GET /v1/models as an OpenAI-compatible server does."""

    def __init__(self, base_url: str, problem: str) -> None:
        self.base_url = base_url
        self._keep_args(f"no OpenAI-compatible server at {base_url} (GET /v1/models: {problem}); start one "
                        "(`twinserve serve MODEL`) or give --base-url / --host and --port", base_url, problem)


async def server_info(base_url: str, api_key: str | None = None) -> dict[str, Any]:
    """The first model entry of GET /v1/models (id, max_model_len, vocab_size when given)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
            r = await client.get("/v1/models", headers=headers)
            r.raise_for_status()
            return r.json()["data"][0]
    except httpx.HTTPStatusError as e:
        raise ServerUnreachableError(base_url, f"HTTP {e.response.status_code}") from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ServerUnreachableError(base_url, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None


async def _one(client: httpx.AsyncClient, target: BenchTarget, item: WorkItem, prompt: list[int],
               t0: float) -> RequestRecord:
    """Send one streamed request and time every chunk that carries text."""
    payload = {"model": target.model, "prompt": prompt, "max_tokens": item.num_output_tokens,
               "temperature": 0.0, "ignore_eos": target.ignore_eos, "stream": True,
               "stream_options": {"include_usage": True}, "return_metrics": True}
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    sent = time.perf_counter() - t0
    rec = RequestRecord(item.request_id, sent, len(prompt), 0, None, None, None, 0, 0, [],
                        item.conversation, item.turn)
    finish_reason = ""
    try:
        async with client.stream("POST", target.endpoint, json=payload, headers=headers,
                                 timeout=target.timeout_s) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {resp.status_code}: {body[:300]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message", "error event"))
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        rec.token_times.append(now)
                        if rec.first_token_time is None:
                            rec.first_token_time = now
                    if choice.get("finish_reason") is not None:
                        finish_reason = choice["finish_reason"]
                        rec.finish_time = now
                usage = chunk.get("usage")
                if usage:
                    rec.num_output_tokens = int(usage["completion_tokens"])
                    rec.prefix_hit_tokens = int((usage.get("prompt_tokens_details") or {})
                                                .get("cached_tokens") or 0)
                metrics = chunk.get("metrics")
                if metrics:
                    rec.num_preemptions = int(metrics.get("num_preemptions") or 0)
                    if metrics.get("queue_s") is not None:
                        rec.first_scheduled_time = sent + float(metrics["queue_s"])
        rec.finish_reason = finish_reason
        if rec.finish_time is None:
            raise RuntimeError("the stream ended without a finish_reason")
        if rec.first_token_time is None:
            # Every token was held back (an output cut inside a UTF-8 character sends no text): the
            # client saw its first output with the last chunk, as vllm bench serve counts a first chunk.
            rec.first_token_time = rec.finish_time
            rec.token_times.append(rec.finish_time)
    except Exception as e:  # one failed request is a row with an error, never a crashed run
        rec.error = f"{type(e).__name__}: {e}"
        rec.finish_reason = "error"
        rec.finish_time = None
    return rec


async def run_closed_loop(target: BenchTarget, workload: Workload,
                          progress: Callable[[int, int, int, float], None] | None = None) -> BenchRun:
    """The workload's closed-loop clients (sim/clients.py's model) against the server.

    concurrency clients take requests in the workload's order; each sends its next one
    think_time_s after its last one's last token; the first warmup_requests are marked warm-up.
    """
    cfg = workload.cfg
    queue = list(workload.items())
    items = iter(queue)
    n = cfg.concurrency
    taken = 0
    done = errors = 0
    total = len(queue)
    in_flight = 0
    peak = 0
    records: list[RequestRecord] = []
    conn = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=target.base_url, limits=conn, timeout=target.timeout_s) as client:
        t0 = time.perf_counter()

        async def one_client(cid: int) -> None:
            nonlocal taken, in_flight, peak, done, errors
            while True:
                item = next(items, None)
                if item is None:
                    return
                item.client, item.warmup = cid, taken < cfg.warmup_requests
                taken += 1
                in_flight += 1
                peak = max(peak, in_flight)
                try:
                    rec = await _one(client, target, item, workload.prompt_tokens(item), t0)
                finally:
                    in_flight -= 1
                rec.client, rec.warmup = cid, item.warmup
                records.append(rec)
                done += 1
                errors += bool(rec.error)
                if progress is not None:
                    progress(done, total, errors, time.perf_counter() - t0)
                if cfg.think_time_s > 0:
                    await asyncio.sleep(cfg.think_time_s)

        await asyncio.gather(*(one_client(c) for c in range(n)))
        duration = time.perf_counter() - t0
    return BenchRun(records, duration, n, peak, [r.error for r in records if r.error])


async def run_benchmark(target: BenchTarget, workload: Workload, max_concurrency: int | None = None,
                        progress: Callable[[int, int, int, float], None] | None = None) -> BenchRun:
    """Send the whole workload on its arrival schedule (or by its closed-loop clients).

    progress(done, total, errors, seconds) is called as each request ends."""
    if workload.cfg.concurrency > 0:
        return await run_closed_loop(target, workload, progress)
    items = list(workload.items())
    done = errors = 0
    limit = max_concurrency or len(items) or 1
    sem = asyncio.Semaphore(limit)
    in_flight = 0
    peak = 0
    conn = httpx.Limits(max_connections=limit + 4, max_keepalive_connections=limit + 4)
    async with httpx.AsyncClient(base_url=target.base_url, limits=conn, timeout=target.timeout_s) as client:
        t0 = time.perf_counter()

        async def send(item: WorkItem, prompt: list[int]) -> RequestRecord:
            nonlocal in_flight, peak, done, errors
            async with sem:
                in_flight += 1
                peak = max(peak, in_flight)
                try:
                    rec = await _one(client, target, item, prompt, t0)
                finally:
                    in_flight -= 1
                done += 1
                errors += bool(rec.error)
                if progress is not None:
                    progress(done, len(items), errors, time.perf_counter() - t0)
                return rec

        tasks = []
        for item in items:
            delay = item.arrival_time - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(item, workload.prompt_tokens(item))))
        records = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
    return BenchRun(records, duration, max_concurrency, peak, [r.error for r in records if r.error])
