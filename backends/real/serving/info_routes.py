"""Tokenizer and info endpoints in vLLM's shapes: /tokenize, /detokenize, /version, /ping.

/tokenize takes either a completion-style body ({"prompt", "add_special_tokens"}) or a chat-style
one ({"messages", "add_generation_prompt", ...}) and answers {"count", "max_model_len", "tokens",
"token_strs"}; /detokenize takes {"tokens"} and answers {"prompt"}, as vLLM's server does.
Both run on the server's tokenizer workers, never on the event loop; a text that cannot fit
max_model_len is a 400 before it is tokenized whole (counting it would hold a worker for seconds).
"""

from __future__ import annotations

from functools import partial
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from twinserve.backends.real.serving.errors import bad_request
from twinserve.backends.real.serving.protocol import ChatMessage, messages_as_dicts, parse_model
from twinserve.backends.real.serving.tokenize_pool import decode_ids


class TokenizeCompletionRequest(BaseModel):
    """POST /tokenize with a prompt."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(BaseModel):
    """POST /tokenize with chat messages (rendered through the chat template first)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


def _tokenize_request(body: Any) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """A /tokenize body as its request model: chat-style when it has messages."""
    if isinstance(body, dict) and "messages" in body:
        return parse_model(TokenizeChatRequest, body)
    return parse_model(TokenizeCompletionRequest, body)


def add_info_routes(app: FastAPI, state: Any, read_json: Any) -> None:
    """Register /tokenize, /detokenize, /version and /ping on `app`."""
    __version__ = metadata.version("twinserve")
    engine = state.engine

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        state.check_auth(request)
        req: Any = await read_json(request, _tokenize_request)
        if isinstance(req, TokenizeChatRequest):
            if req.add_generation_prompt and req.continue_final_message:
                raise bad_request("add_generation_prompt and continue_final_message cannot both be true",
                                  "continue_final_message", "invalid_value")
            state.check_model(req.model)
            kwargs = state.template_kwargs(req.chat_template_kwargs)
            if req.continue_final_message:
                kwargs["continue_final_message"] = True
            kwargs["add_generation_prompt"] = req.add_generation_prompt
            ids, _ = await state.chat_ids(messages_as_dicts(req.messages), kwargs, req.add_special_tokens)
        else:
            state.check_model(req.model)
            ids = await state.encode(req.prompt, req.add_special_tokens)
        strs = None
        if req.return_token_strs:
            strs = await state.tokenizers.run(len(ids), lambda tok: tok.convert_ids_to_tokens(ids))
        return JSONResponse({"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                             "token_strs": strs})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        state.check_auth(request)
        # Validated off the loop when large, as the ids are checked, decoded and the answer serialized:
        # 2M ids are ~0.1 s of validation and megabytes of text, and no stream waits for them.
        req = await read_json(request, partial(parse_model, DetokenizeRequest), ("tokens",))
        state.check_model(req.model)
        ids, vocab = req.tokens, engine.vocab_size

        def checked_decode(tok: Any) -> JSONResponse:  # on a tokenizer worker
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"token id {bad} is outside the vocabulary [0, {vocab})", "tokens",
                                  "invalid_value")
            return JSONResponse({"prompt": decode_ids(tok, ids)})  # the body is rendered here, not on the loop

        return await state.tokenizers.run(len(ids), checked_decode)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": __version__})

    async def ping() -> Response:
        # Same answer as /health (SageMaker-style liveness probes call /ping with GET or POST).
        if not state.async_engine.is_running:
            from twinserve.backends.real.serving.errors import engine_dead

            reason = state.async_engine.dead_reason or "the engine is not running"
            return JSONResponse(engine_dead(reason).body(), status_code=503)
        return Response(status_code=200)

    # One route per method: a shared route would give both the same OpenAPI operation id.
    app.add_api_route("/ping", ping, methods=["GET"], operation_id="ping_get")
    app.add_api_route("/ping", ping, methods=["POST"], operation_id="ping_post")
