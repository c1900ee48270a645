"""The OpenAI-compatible HTTP server: FastAPI routes over the async engine."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from twinserve.core.errors import PromptTooLongError, TwinserveError
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.outputs import RequestOutput
from twinserve.backends.real.serving.access_log import AccessLogMiddleware
from twinserve.backends.real.serving.async_engine import AsyncLLMEngine, RequestStream
from twinserve.backends.real.serving.errors import APIError, bad_request, engine_dead, model_not_found, to_api_error, unauthorized
from twinserve.backends.real.serving.info_routes import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest, add_info_routes
from twinserve.backends.real.serving.logprobs_format import TokenTexts
from twinserve.backends.real.serving.metrics import ServingMetrics
from twinserve.backends.real.serving.openai_format import ResponseMeta, full_response, stream_events
from twinserve.backends.real.serving.prompt_checks import check_fits, check_length, split_prompts, too_long, truncation
from twinserve.backends.real.serving.openapi_doc import GENERATION_OK, OpenAPIBodies, error_responses
from twinserve.backends.real.serving.protocol import ChatCompletionRequest, CompletionRequest, parse_body, to_sampling_params
from twinserve.backends.real.serving.request_body import DEFAULT_MAX_BODY_BYTES, parse_json, read_body
from twinserve.backends.real.serving.structured_fields import as_tool_calls, tool_spec
from twinserve.backends.real.serving.tokenize_pool import TokenizerPool, text_size
from twinserve.backends.real.tokenizer import render_chat

logger = logging.getLogger("twinserve.serve")

# Token-id lists longer than this are checked on a worker thread.
_INLINE_IDS = 4096
# How often a non-streamed request checks whether its client is still there.
_DISCONNECT_POLL_S = 0.25


@dataclass(slots=True)
class ServerConfig:
    """Front-end settings: names served, auth, and the queue bound."""

    served_model_names: list[str]
    api_key: str | None = None
    max_queued_requests: int | None = None
    extra_model_names: list[str] = field(default_factory=list)
    # One access-log line per request (logger "twinserve.access"); vLLM's --disable-uvicorn-access-log.
    access_log: bool = True
    # "twinserve" or "vllm": the Prometheus prefix, so vLLM's dashboards find our series.
    metrics_prefix: str = "twinserve"
    # Bodies above this many bytes are refused with 413.
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # n above this is refused with 400 (each of the n sequences is a request of its own).
    max_n: int = 128
    # A Jinja chat template that replaces the tokenizer's (vLLM's --chat-template, already read from its file).
    chat_template: str | None = None


class ServingState:
    """Everything the routes need: engine, async engine, metrics and config."""

    def __init__(self, engine: LLMEngine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = ServingMetrics(config.served_model_names[0], config.metrics_prefix)
        self.async_engine = AsyncLLMEngine(engine, config.max_queued_requests, self.metrics)
        self.accepted_names = set(config.served_model_names) | set(config.extra_model_names)
        # Tokenizing, detokenizing and chat templates run here, never on the event loop, and a
        # small request never waits behind a large one (see tokenize_pool).
        self.tokenizers = TokenizerPool(engine.tokenizer, engine.max_model_len)
        self.token_texts = TokenTexts(engine.tokenizer)

    def template_kwargs(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Chat-template keyword arguments: the request's own, plus the server's --chat-template."""
        kw = dict(extra or {})
        if self.config.chat_template is not None:
            kw["chat_template"] = self.config.chat_template
        return kw

    async def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt",
                     truncate: int | None = None) -> list[int]:
        """Token ids of a text, off the loop; an over-long text is refused before it is tokenized whole."""
        pool = self.tokenizers
        return await pool.run(len(text), pool.encode, text, add_special_tokens, param, truncate=truncate)

    async def chat_ids(self, messages: list[dict[str, Any]], template_kw: dict[str, Any],
                       add_special_tokens: bool = False, truncate: int | None = None) -> tuple[list[int], str]:
        """(token ids, text) of a conversation rendered with the chat template, off the loop and bounded."""
        pool = self.tokenizers

        def work(tok: Any) -> tuple[list[int], str]:
            text = render_chat(tok, messages, **template_kw)
            return pool.encode(tok, text, add_special_tokens, "messages", truncate=truncate), text

        return await pool.run(text_size(messages), work)

    async def decode(self, ids: list[int]) -> str:
        """Text of token ids, off the loop."""
        return await self.tokenizers.run(len(ids), lambda tok: tok.decode(ids))

    async def prompt_ids(self, prompt: Any, param: str, truncate: int | None) -> tuple[str | None, list[int]]:
        """A token-id prompt checked (length first, in O(1); the ids themselves off the loop when many)."""
        engine = self.engine
        if isinstance(prompt, list) and truncate is None and len(prompt) > engine.max_model_len:
            raise too_long(engine.max_model_len, len(prompt), param)
        if len(prompt) <= _INLINE_IDS:
            text, ids = engine.tokenize_prompt(prompt)
        else:  # pure-Python checks of many ids: a worker thread, so the loop keeps streaming
            text, ids = await asyncio.to_thread(engine.tokenize_prompt, prompt)
        if truncate is not None and len(ids) > truncate:
            ids, text = ids[-truncate:], None
        return text, ids

    def check_n(self, n: int) -> None:
        """400 for n above the server's bound."""
        if isinstance(n, int) and n > self.config.max_n:
            raise bad_request(f"n={n} is above this server's limit of {self.config.max_n} (--max-n)", "n",
                              "invalid_value")

    async def read_json(self, request: Request, then: Callable[[Any], Any] | None = None,
                        ids_fields: tuple[str, ...] = ()) -> Any:
        """The request's JSON body: size-limited, checked, then passed through `then` (the request model's
        validation); decoding and validation both off the loop when the body is large, and long token-id
        lists in `ids_fields` never walked by the validator (see request_body.parse_json)."""
        return await parse_json(await read_body(request, self.config.max_request_body_bytes), then, ids_fields)

    @property
    def model_name(self) -> str:
        """The name responses carry."""
        return self.config.served_model_names[0]

    def check_model(self, name: str | None) -> None:
        """404 unless the request names a model this server serves (or none)."""
        if name is not None and name not in self.accepted_names:
            raise model_not_found(name, self.config.served_model_names)

    def check_auth(self, request: Request) -> None:
        """401 when an API key is set and the request does not carry it."""
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise unauthorized()


def build_app(engine: LLMEngine, config: ServerConfig) -> FastAPI:
    """A FastAPI app serving `engine`; the engine thread starts and stops with the app's lifespan."""
    state = ServingState(engine, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.async_engine.start()
        try:
            yield
        finally:
            await state.async_engine.shutdown()
            state.tokenizers.shutdown()

    app = FastAPI(title="twinserve", lifespan=lifespan)
    app.state.serving = state
    bodies = OpenAPIBodies()
    generation_responses = {**GENERATION_OK, **error_responses(400, 401, 404, 413, 429, 499, 500, 503)}
    app.add_middleware(AccessLogMiddleware, enabled=config.access_log, on_response=state.metrics.on_http)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(TwinserveError)
    async def _engine_error(request: Request, exc: TwinserveError) -> JSONResponse:
        err = to_api_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected error serving %s", request.url.path, exc_info=exc)
        err = to_api_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.get("/health", response_class=Response,
             responses={200: {"description": "The engine is serving (empty body)"}, **error_responses(503)})
    async def health() -> Response:
        if not state.async_engine.is_running:
            reason = state.async_engine.dead_reason or "the engine is not running"
            return JSONResponse(engine_dead(reason).body(), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics", response_class=Response, responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", responses=error_responses(401))
    async def models(request: Request) -> JSONResponse:
        state.check_auth(request)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "twinserve",
                 "root": state.engine.model_name, "max_model_len": state.engine.max_model_len,
                 "vocab_size": state.engine.vocab_size}
                for name in config.served_model_names]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/v1/completions", responses=generation_responses, openapi_extra=bodies.body(CompletionRequest))
    async def completions(request: Request) -> Response:
        state.check_auth(request)
        # The prompt's ids are checked by prompt_ids below (the length first, in O(1)).
        req: CompletionRequest = await state.read_json(request, partial(parse_body, CompletionRequest), ("prompt",))
        state.check_model(req.model)
        state.check_n(req.n)
        truncate = truncation(state, req.truncate_prompt_tokens)
        prompts = []
        split = split_prompts(req.prompt)
        for k, p in enumerate(split):
            where = "prompt" if len(split) == 1 else f"prompt[{k}]"
            if isinstance(p, str):
                ids = await state.encode(p, req.add_special_tokens, where, truncate)
                # A prompt that cannot fit ends a batch here, before the rest of it is tokenized.
                check_fits(state, ids, where)
                prompts.append((ids, p))
                continue
            text, ids = await state.prompt_ids(p, where, truncate)  # token ids: checked, nothing to tokenize
            prompts.append((ids, text))
        echo = None
        if req.echo:
            echo = []
            for ids, text in prompts:
                if text is None:
                    state.engine.validate_prompt_ids(ids)  # before decoding them
                    text = await state.decode(ids)
                echo.append(text)
        return await _serve(state, request, req, prompts, req.max_tokens, chat=False, prefix="cmpl", echo=echo)

    @app.post("/v1/chat/completions", responses=generation_responses,
              openapi_extra=bodies.body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        state.check_auth(request)
        req: ChatCompletionRequest = await state.read_json(request, partial(parse_body, ChatCompletionRequest))
        state.check_model(req.model)
        state.check_n(req.n)
        messages = req.message_dicts()
        kw = state.template_kwargs(req.chat_template_kwargs)
        if req.chat_template is not None:  # the request's own template over the server's (as vLLM)
            kw["chat_template"] = req.chat_template
        if req.documents is not None:
            kw["documents"] = req.documents
        if req.tools:  # the template sees the tools whatever tool_choice is, as in vLLM
            kw["tools"] = req.tools
        if req.continue_final_message:
            kw["continue_final_message"] = True
        kw["add_generation_prompt"] = req.add_generation_prompt
        ids, text = await state.chat_ids(messages, kw, req.add_special_tokens,
                                         truncate=truncation(state, req.truncate_prompt_tokens))
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        echo = None
        if req.echo:  # vLLM's: the reply repeats the last message when it is the assistant's own
            last = messages[-1]
            said = last.get("content") or "" if last.get("role") == "assistant" else ""
            echo = [said] if said else None
        return await _serve(state, request, req, [(ids, text)], max_tokens, chat=True, prefix="chatcmpl",
                            echo=echo)

    add_info_routes(app, state, state.read_json)
    info_errors = error_responses(400, 401, 404, 413, 500)
    bodies.document_route(app, "/tokenize", (TokenizeCompletionRequest, TokenizeChatRequest), info_errors)
    bodies.document_route(app, "/detokenize", (DetokenizeRequest,), info_errors)
    bodies.document_empty_ok(app, "/ping", error_responses(503))
    bodies.install(app)
    return app


def _request_id(request: Request) -> str:
    """The id the access log gave this request (a fresh one if the middleware is not in front)."""
    return getattr(request.state, "request_id", None) or uuid.uuid4().hex


async def _serve(state: ServingState, request: Request, req: CompletionRequest | ChatCompletionRequest,
                 prompts: list[tuple[list[int], str | None]], max_tokens: int | None, chat: bool, prefix: str,
                 echo: list[str] | None = None) -> Response:
    """Queue one engine request per prompt; answer with all their choices (prompt k's i-th at k * n + i)."""
    arrival = time.monotonic()
    if req.user is not None:  # the access log names the end user (OpenAI's `user`)
        request.state.user = req.user
    param = "messages" if chat else "prompt"
    # lm-eval's loglikelihood asks echo + logprobs with max_tokens=0: one token is computed (the
    # prompt's logprobs come with it) and none is returned.
    drop_output = not chat and echo is not None and max_tokens == 0
    if drop_output:
        max_tokens = 1
    params = []
    for k, (ids, _) in enumerate(prompts):
        where = param if len(prompts) == 1 else f"{param}[{k}]"
        try:
            params.append(to_sampling_params(req, check_length(state, ids, max_tokens, where),
                                             state.engine.args.max_logprobs))
        except PromptTooLongError as e:
            e.param = param
            raise
    specs = [sp.structured_output for sp in params if sp.structured_output is not None]
    if specs:  # compiling a grammar can take seconds: never on the event loop, never on the engine thread
        await asyncio.to_thread(_compile_all, state.engine, specs)
    token_text = _token_id_text if req.return_tokens_as_token_ids else state.token_texts
    meta = ResponseMeta(f"{prefix}-{_request_id(request)}", state.model_name, chat, req.include_usage,
                        req.return_metrics, logprobs=params[0].logprobs, token_text=token_text,
                        drop_output=drop_output, prompt_logprobs=req.prompt_logprobs,
                        continuous_usage=req.continuous_usage,
                        prompt_token_ids=[ids for ids, _ in prompts] if req.return_token_ids else None)
    streams: list[RequestStream] = []
    try:
        for k, ((ids, text), sp) in enumerate(zip(prompts, params)):
            engine_id = meta.request_id if len(prompts) == 1 else f"{meta.request_id}-{k}"
            streams.append(await state.async_engine.add_request(engine_id, ids, sp, text, arrival,
                                                                priority=req.priority, cache_salt=req.cache_salt))
    except BaseException:
        for st in streams:
            st.close()
        raise
    for sp in params:
        state.metrics.on_admitted(sp.n, sp.max_tokens)
    n = params[0].n
    if req.stream:
        return _EngineStreamingResponse(streams, stream_events(meta, streams, n, echo),
                                        media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    outs = await _collect(streams, request)
    body = full_response(meta, outs, echo)
    tool = tool_spec(req) if chat else None
    if tool is not None:
        body = as_tool_calls(body, tool[1])
    return JSONResponse(body)


def _token_id_text(token_id: int) -> str:
    """vLLM's return_tokens_as_token_ids spelling of a token in logprobs."""
    return f"token_id:{token_id}"


def _compile_all(engine: LLMEngine, specs: list[Any]) -> None:
    compiler = engine.grammar_compiler
    for spec in specs:
        compiler.compile(spec)


class _EngineStreamingResponse(StreamingResponse):
    """A streamed response that aborts its request however it ends, even before the body starts."""

    def __init__(self, streams: list[RequestStream], content: AsyncIterator[str], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._streams = streams

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._streams:
                stream.close()


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _collect(streams: list[RequestStream], request: Request) -> list[RequestOutput]:
    """The final outputs of non-streamed requests; aborts them all if the client goes away first."""

    async def last(stream: RequestStream) -> RequestOutput:
        final: RequestOutput | None = None
        async for out in stream:
            final = out
        assert final is not None
        return final

    task = asyncio.ensure_future(asyncio.gather(*(last(st) for st in streams)))
    # A gather cancelled under a client that left can end holding CancelledError as its exception;
    # read it, or asyncio logs "exception was never retrieved" with a traceback for a routine hang-up.
    task.add_done_callback(_retrieve)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return list(task.result())
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client closed the request", "client_closed_request")
    finally:
        if not task.done():
            task.cancel()
        for st in streams:
            st.close()
