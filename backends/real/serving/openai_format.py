"""Engine outputs as OpenAI response bodies and SSE chunks (completions and chat)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ....core.errors import EngineDeadError
from ..outputs import RequestMetrics, RequestOutput
from .async_engine import RequestStream
from .errors import to_api_error

DONE = "data: [DONE]\n\n"


@dataclass(slots=True)
class ResponseMeta:
    """What every response of one request shares."""

    request_id: str
    model: str
    chat: bool
    include_usage: bool = False
    return_metrics: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        """The object name of a full response."""
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object(self) -> str:
        """The object name of a streamed chunk."""
        return "chat.completion.chunk" if self.chat else "text_completion"


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(outs: RequestOutput | list[RequestOutput]) -> dict[str, Any]:
    """Token counts summed over a request's prompts: prompt, completion (all n sequences), total, cached."""
    outs = [outs] if isinstance(outs, RequestOutput) else outs
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.metrics.num_cached_tokens for o in outs if o.metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def engine_metrics(m: RequestMetrics | None) -> dict[str, Any] | None:
    """Engine-side timings of a finished request (seconds, from arrival at the engine)."""
    if m is None:
        return None
    return {"queue_s": m.queue_time, "ttft_s": m.ttft, "e2e_s": m.e2e_latency,
            "num_cached_tokens": m.num_cached_tokens, "num_preemptions": m.num_preemptions}


def _metrics_field(outs: list[RequestOutput]) -> Any:
    """One prompt: its engine metrics; a batch: a list of them, in prompt order."""
    if len(outs) == 1:
        return engine_metrics(outs[0].metrics)
    return [engine_metrics(o.metrics) for o in outs]


def full_response(meta: ResponseMeta, outs: RequestOutput | list[RequestOutput],
                  echo: list[str] | None = None) -> dict[str, Any]:
    """The non-streamed body for finished requests: prompt k's choice i has index k * n + i."""
    outs = [outs] if isinstance(outs, RequestOutput) else outs
    choices = []
    for k, out in enumerate(outs):
        n = len(out.outputs)
        for c in out.outputs:
            choice: dict[str, Any] = {"index": k * n + c.index, "logprobs": None,
                                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if meta.chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = (echo[k] if echo else "") + c.text
            choices.append(choice)
    body: dict[str, Any] = {"id": meta.request_id, "object": meta.object, "created": meta.created,
                            "model": meta.model, "choices": choices, "usage": usage(outs)}
    if meta.return_metrics:
        body["metrics"] = _metrics_field(outs)
    return body


def _chunk(meta: ResponseMeta, choices: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"id": meta.request_id, "object": meta.chunk_object, "created": meta.created,
                            "model": meta.model, "choices": choices}
    if meta.include_usage:
        body["usage"] = None
    return body


def _delta_choice(meta: ResponseMeta, index: int, text: str, finish: str | None,
                  stop_reason: int | str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish}
    if meta.chat:
        choice["delta"] = {"content": text} if text or finish is None else {}
    else:
        choice["text"] = text
    if finish is not None:
        choice["stop_reason"] = stop_reason
    return choice


_END = object()


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several request streams as they come; leaving early aborts them all."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(k: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                q.put_nowait((k, out))
        except Exception as e:
            q.put_nowait((k, e))
        finally:
            q.put_nowait((k, _END))

    tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            k, item = await q.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield k, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.close()


async def stream_events(meta: ResponseMeta, streams: RequestStream | list[RequestStream], n: int,
                        echo: list[str] | None = None) -> AsyncIterator[str]:
    """SSE events: role chunks (chat) or echoed prompts, deltas indexed k * n + i, finish, usage, [DONE]."""
    streams = [streams] if not isinstance(streams, list) else streams
    last: dict[int, RequestOutput] = {}
    try:
        if meta.chat:
            for i in range(n):
                yield sse(_chunk(meta, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))
        elif echo:
            for k, text in enumerate(echo):
                for i in range(n):
                    yield sse(_chunk(meta, [_delta_choice(meta, k * n + i, text, None, None)]))
        finished: set[int] = set()
        total = n * len(streams)
        async for k, out in merged(streams):
            last[k] = out
            for c in out.outputs:
                index = k * n + c.index
                if index in finished or (not c.text_delta and c.finish_reason is None):
                    continue
                if c.finish_reason is not None:
                    finished.add(index)
                chunk = _chunk(meta, [_delta_choice(meta, index, c.text_delta, c.finish_reason,
                                                    c.stop_reason)])
                if meta.return_metrics and not meta.include_usage and len(finished) == total \
                        and len(last) == len(streams) and all(o.finished for o in last.values()):
                    chunk["metrics"] = _metrics_field([last[j] for j in sorted(last)])
                yield sse(chunk)
        if meta.include_usage and last:
            outs = [last[j] for j in sorted(last)]
            final = _chunk(meta, [])
            final["usage"] = usage(outs)
            if meta.return_metrics:
                final["metrics"] = _metrics_field(outs)
            yield sse(final)
    except EngineDeadError as e:  # headers are sent: report in-band, as OpenAI streams do
        yield sse(to_api_error(e).body())
    finally:
        for s in streams:
            s.close()
    yield DONE
