"""Engine outputs as OpenAI response bodies and SSE chunks (completions and chat)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from twinserve.core.errors import EngineDeadError
from twinserve.backends.real.outputs import CompletionOutput, RequestMetrics, RequestOutput
from twinserve.backends.real.serving.async_engine import RequestStream
from twinserve.backends.real.serving.errors import APIError, bad_request, to_api_error
from twinserve.backends.real.serving.logprobs_format import (CompletionLogprobs, TokenText, chat_logprobs,
                                                             merge_completion_logprobs, vllm_prompt_logprobs)

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
    # Top-N logprobs asked for (None: no logprobs); token_text names tokens in them.
    logprobs: int | None = None
    token_text: TokenText | None = None
    # max_tokens=0 with echo: one token is computed (for the prompt logprobs) but none returned.
    drop_output: bool = False
    # vLLM's prompt_logprobs=N: the top N per prompt token, in vLLM's shape (None: not asked).
    prompt_logprobs: int | None = None
    # vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far.
    continuous_usage: bool = False
    # vLLM's return_token_ids: each prompt's ids (chat: the response's prompt_token_ids; completions: each
    # choice's, in a stream its first chunk) and each choice's generated ids (token_ids, per chunk when streamed).
    prompt_token_ids: list[list[int]] | None = None

    @property
    def return_token_ids(self) -> bool:
        """True when responses carry token ids."""
        return self.prompt_token_ids is not None

    @property
    def wants_logprobs(self) -> bool:
        """True when choices carry logprobs."""
        return self.logprobs is not None and self.token_text is not None

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


# The sampler's error for a row with every token masked: the request's own constraints contradict.
_NO_TOKEN_ALLOWED = "NoTokenAllowedError: "


def request_failed(c: CompletionOutput) -> APIError:
    """A sequence that ended with finish reason "error" (its own inputs; the engine is fine)."""
    error = c.error or "unknown error"
    if _NO_TOKEN_ALLOWED in error:
        return bad_request(f"the request cannot go on: {error.split(_NO_TOKEN_ALLOWED, 1)[1]}", "min_tokens",
                           "no_token_allowed")
    return APIError(500, f"the request failed: {error}", "internal_error", None, "request_failed")


def usage(outs: RequestOutput | list[RequestOutput], drop_output: bool = False) -> dict[str, Any]:
    """Token counts summed over a request's prompts: prompt, completion (all n sequences), total, cached."""
    outs = [outs] if isinstance(outs, RequestOutput) else outs
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = 0 if drop_output else sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.metrics.num_cached_tokens for o in outs if o.metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _running_usage(outs: list[RequestOutput], drop_output: bool) -> dict[str, Any]:
    """Usage so far from the engine's counts (delta outputs carry no whole token lists until the end)."""
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = 0 if drop_output else sum(o.metrics.num_generation_tokens for o in outs if o.metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


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
            if c.finish_reason == "error":
                raise request_failed(c)
            drop = meta.drop_output
            choice: dict[str, Any] = {"index": k * n + c.index, "logprobs": None,
                                      "finish_reason": "length" if drop else c.finish_reason,
                                      "stop_reason": None if drop else c.stop_reason}
            text = "" if drop else c.text
            if meta.chat:
                choice["message"] = {"role": "assistant", "content": (echo[k] if echo else "") + text}
                if meta.wants_logprobs:
                    choice["logprobs"] = chat_logprobs(c.logprobs or [], meta.logprobs or 0, meta.token_text)
            else:
                choice["text"] = (echo[k] if echo else "") + text
                if meta.wants_logprobs:
                    builder = CompletionLogprobs(meta.logprobs or 0, meta.token_text)
                    lp = _echo_logprobs(builder, out) if echo else None
                    if not drop:
                        lp = merge_completion_logprobs(lp, builder.build(c.logprobs or [], c.token_ids))
                    choice["logprobs"] = lp
            if meta.prompt_logprobs is not None and not meta.chat:
                choice["prompt_logprobs"] = _prompt_logprobs(meta, out)
            if meta.return_token_ids:
                choice["token_ids"] = [] if drop else list(c.token_ids)
                if not meta.chat:
                    choice["prompt_token_ids"] = list(out.prompt_token_ids)
            choices.append(choice)
    body: dict[str, Any] = {"id": meta.request_id, "object": meta.object, "created": meta.created,
                            "model": meta.model, "choices": choices, "usage": usage(outs, meta.drop_output)}
    if meta.prompt_logprobs is not None and meta.chat:
        body["prompt_logprobs"] = _prompt_logprobs(meta, outs[0])
    if meta.return_token_ids and meta.chat:
        body["prompt_token_ids"] = list(outs[0].prompt_token_ids)
    if meta.return_metrics:
        body["metrics"] = _metrics_field(outs)
    return body


def _prompt_logprobs(meta: ResponseMeta, out: RequestOutput) -> list[Any]:
    assert meta.token_text is not None and meta.prompt_logprobs is not None
    return vllm_prompt_logprobs(out.prompt_logprobs, out.prompt_token_ids, meta.prompt_logprobs, meta.token_text)


def _echo_logprobs(builder: CompletionLogprobs, out: RequestOutput) -> dict[str, Any]:
    """The echoed prompt's part of completions logprobs (the first token has none)."""
    records = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
    return builder.build(records, out.prompt_token_ids)


def _echo_ready(out: RequestOutput) -> bool:
    """True once an echoed prompt can be sent: its logprobs (if asked) are all computed."""
    plp = out.prompt_logprobs
    return (plp is None or len(plp) <= 1 or plp[-1] is not None or out.finished
            or any(c.token_ids or c.token_ids_delta for c in out.outputs))


def _chunk(meta: ResponseMeta, choices: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"id": meta.request_id, "object": meta.chunk_object, "created": meta.created,
                            "model": meta.model, "choices": choices}
    if meta.include_usage:
        body["usage"] = None
    return body


def _delta_choice(meta: ResponseMeta, index: int, text: str, finish: str | None,
                  stop_reason: int | str | None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
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
        prompt_ids_sent: set[int] = set()  # completions choices whose first chunk carried prompt_token_ids

        def with_ids(chunk: dict[str, Any], token_ids: list[int] | None = None) -> dict[str, Any]:
            if meta.prompt_token_ids is None:
                return chunk
            for ch in chunk["choices"]:
                ch["token_ids"] = list(token_ids or [])
                if not meta.chat and ch["index"] not in prompt_ids_sent:
                    prompt_ids_sent.add(ch["index"])
                    ch["prompt_token_ids"] = list(meta.prompt_token_ids[ch["index"] // n])
            return chunk

        if meta.chat:
            for i in range(n):
                role = _chunk(meta, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}])
                if meta.prompt_token_ids is not None and i == 0:
                    role["prompt_token_ids"] = list(meta.prompt_token_ids[0])
                yield sse(with_ids(role))
        want_lp = meta.wants_logprobs
        builders: dict[int, CompletionLogprobs] = {}
        echoed: set[int] = set()
        if echo and (meta.chat or not want_lp):  # nothing to wait for: the prompts go out first
            for k, text in enumerate(echo):
                for i in range(n):
                    yield sse(with_ids(_chunk(meta, [_delta_choice(meta, k * n + i, text, None, None)])))
            echoed = set(range(len(echo)))
        finished: set[int] = set()
        total = n * len(streams)
        async for k, out in merged(streams):
            last[k] = out
            if echo and k not in echoed and _echo_ready(out):  # with its prompt logprobs
                echoed.add(k)
                for i in range(n):
                    b = builders[k * n + i] = CompletionLogprobs(meta.logprobs or 0, meta.token_text)
                    yield sse(with_ids(_chunk(meta, [_delta_choice(meta, k * n + i, echo[k], None, None,
                                                                   _echo_logprobs(b, out))])))
            for c in out.outputs:
                index = k * n + c.index
                if index in finished:
                    continue
                if c.finish_reason == "error":
                    raise request_failed(c)
                if meta.drop_output:
                    if c.finish_reason is None:
                        continue
                    text, records, new_ids = "", [], []
                else:
                    text, records = c.text_delta, (c.logprobs_delta or []) if want_lp else []
                    new_ids = c.token_ids_delta if meta.return_token_ids else []
                # (Tokens whose text is held back still go out when their ids are asked for.)
                if not text and not records and not new_ids and c.finish_reason is None:
                    continue
                if c.finish_reason is not None:
                    finished.add(index)
                lp = None
                if want_lp and not meta.drop_output:
                    if meta.chat:
                        lp = chat_logprobs(records, meta.logprobs or 0, meta.token_text)
                    else:
                        b = builders.setdefault(index, CompletionLogprobs(meta.logprobs or 0, meta.token_text))
                        lp = b.build(records, [r.token_id for r in records])
                finish = "length" if meta.drop_output and c.finish_reason is not None else c.finish_reason
                chunk = with_ids(_chunk(meta, [_delta_choice(meta, index, text, finish,
                                                             None if meta.drop_output else c.stop_reason, lp)]),
                                 new_ids)
                if meta.continuous_usage:
                    chunk["usage"] = _running_usage(list(last.values()), meta.drop_output)
                if meta.return_metrics and not meta.include_usage and len(finished) == total \
                        and len(last) == len(streams) and all(o.finished for o in last.values()):
                    chunk["metrics"] = _metrics_field([last[j] for j in sorted(last)])
                yield sse(chunk)
        if meta.include_usage and last:
            outs = [last[j] for j in sorted(last)]
            final = _chunk(meta, [])
            final["usage"] = usage(outs, meta.drop_output)
            if meta.return_metrics:
                final["metrics"] = _metrics_field(outs)
            yield sse(final)
    except (EngineDeadError, APIError) as e:  # headers are sent: report in-band, as OpenAI streams do
        yield sse(to_api_error(e).body())
    finally:
        for s in streams:
            s.close()
    yield DONE
