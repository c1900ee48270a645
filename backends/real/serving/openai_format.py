"""Engine outputs as OpenAI response bodies and SSE chunks (completions and chat)."""

from __future__ import annotations

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


def usage(out: RequestOutput) -> dict[str, Any]:
    """Token counts: prompt, completion (all n sequences), total, and prefix-cache hits."""
    prompt = len(out.prompt_token_ids)
    completion = sum(len(c.token_ids) for c in out.outputs)
    cached = out.metrics.num_cached_tokens if out.metrics else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def engine_metrics(m: RequestMetrics | None) -> dict[str, Any] | None:
    """Engine-side timings of a finished request (seconds, from arrival at the engine)."""
    if m is None:
        return None
    return {"queue_s": m.queue_time, "ttft_s": m.ttft, "e2e_s": m.e2e_latency,
            "num_cached_tokens": m.num_cached_tokens, "num_preemptions": m.num_preemptions}


def full_response(meta: ResponseMeta, out: RequestOutput) -> dict[str, Any]:
    """The non-streamed body for a finished request."""
    choices = []
    for c in out.outputs:
        choice: dict[str, Any] = {"index": c.index, "logprobs": None, "finish_reason": c.finish_reason,
                                  "stop_reason": c.stop_reason}
        if meta.chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choices.append(choice)
    body: dict[str, Any] = {"id": meta.request_id, "object": meta.object, "created": meta.created,
                            "model": meta.model, "choices": choices, "usage": usage(out)}
    if meta.return_metrics:
        body["metrics"] = engine_metrics(out.metrics)
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


async def stream_events(meta: ResponseMeta, stream: RequestStream, n: int) -> AsyncIterator[str]:
    """SSE events for one request: role chunks (chat), deltas, finish, usage, then [DONE]."""
    last: RequestOutput | None = None
    try:
        if meta.chat:
            for i in range(n):
                yield sse(_chunk(meta, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))
        finished: set[int] = set()
        async for out in stream:
            last = out
            for c in out.outputs:
                if c.index in finished or (not c.text_delta and c.finish_reason is None):
                    continue
                if c.finish_reason is not None:
                    finished.add(c.index)
                chunk = _chunk(meta, [_delta_choice(meta, c.index, c.text_delta, c.finish_reason,
                                                    c.stop_reason)])
                if out.finished and meta.return_metrics and not meta.include_usage \
                        and len(finished) == len(out.outputs):
                    chunk["metrics"] = engine_metrics(out.metrics)
                yield sse(chunk)
        if meta.include_usage and last is not None:
            final = _chunk(meta, [])
            final["usage"] = usage(last)
            if meta.return_metrics:
                final["metrics"] = engine_metrics(last.metrics)
            yield sse(final)
    except EngineDeadError as e:  # headers are sent: report in-band, as OpenAI streams do
        yield sse(to_api_error(e).body())
    finally:
        stream.close()
    yield DONE
