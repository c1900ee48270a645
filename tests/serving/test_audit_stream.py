"""A client that leaves while its request is still being queued leaves nothing running (docs/test-audit.md)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
import pytest

from twinserve.backends.real import LLM, SamplingParams
from twinserve.backends.real.serving.async_engine import AsyncLLMEngine

from .conftest import start_server

LONG = 120


class _Recorder:
    """An engine observer that keeps every output the engine thread publishes."""

    def __init__(self) -> None:
        self.outputs = []

    def on_iteration(self, snapshot, outputs, now) -> None:
        self.outputs += outputs


@pytest.mark.parametrize("where", ["before_the_engine_takes_it", "while_the_engine_adds_it"])
def test_a_request_cancelled_while_its_add_is_queued_is_aborted_not_run(tiny_model_dir: Path, where: str) -> None:
    # The engine thread is held at one of two points of the add when the client goes away. It must keep
    # serving (a late add used to find its future cancelled and take the engine down: every request 503).
    engine = LLM(str(tiny_model_dir), dtype="float64", max_model_len=256, num_gpu_blocks_override=128,
                 block_size=4).llm_engine
    kv = engine.core.scheduler.kv
    entered, gate = threading.Event(), threading.Event()
    recorder = _Recorder()
    aeng = AsyncLLMEngine(engine, observer=recorder)

    def held(inner):
        def call(*a, **kw):
            entered.set()
            assert gate.wait(30)
            return inner(*a, **kw)
        return call

    if where == "while_the_engine_adds_it":
        engine.add_request = held(engine.add_request)
    else:
        real_handle = aeng._handle
        aeng._handle = lambda cmd: (held(real_handle) if getattr(cmd, "request_id", None) == "gone"
                                    else real_handle)(cmd)

    async def scenario() -> None:
        aeng.start()
        try:
            task = asyncio.ensure_future(aeng.add_request(
                "gone", [5, 6, 7], SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True)))
            assert await asyncio.to_thread(entered.wait, 30)
            task.cancel()  # the client hung up
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()
            for _ in range(3000):
                if any(o.request_id == "gone" and o.finished for o in recorder.outputs) or (
                        where == "before_the_engine_takes_it" and aeng._cmds.empty()):
                    break
                await asyncio.sleep(0.01)
            # The engine still serves.
            stream = await aeng.add_request("next", [5, 6], SamplingParams(temperature=0, max_tokens=3))
            outs = [o async for o in stream]
            assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
            assert aeng.is_running
        finally:
            gate.set()
            await aeng.shutdown()

    asyncio.run(scenario())
    gone = [o for o in recorder.outputs if o.request_id == "gone"]
    if where == "while_the_engine_adds_it":  # it is in the engine: it ends as aborted, early
        assert gone and gone[-1].finished and gone[-1].outputs[0].finish_reason == "abort"
        assert len(gone[-1].outputs[0].token_ids) < LONG
    else:  # never added at all
        assert gone == []
    assert kv.num_free_blocks == kv.num_blocks


def test_the_streamed_usage_chunk_equals_the_non_streamed_usage(tiny_model_dir: Path) -> None:
    # Cached prompt tokens included (OpenAI's prompt_tokens_details): the last chunk is the whole account.
    server = start_server(tiny_model_dir, engine_core_mode="inproc")
    try:
        body = {"model": "tiny", "prompt": "the quick brown fox jumps over the lazy dog " * 3, "max_tokens": 6,
                "temperature": 0, "ignore_eos": True}
        httpx.post(server.url + "/v1/completions", json=body, timeout=30).raise_for_status()  # warms the cache
        plain = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()["usage"]
        assert plain["prompt_tokens_details"]["cached_tokens"] > 0
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", server.url + "/v1/completions", json=stream_body, timeout=30) as r:
            events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"] == [] and last["usage"] == plain
    finally:
        server.stop()
