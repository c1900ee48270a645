"""OpenAI request bodies (completions and chat) and their translation into SamplingParams.

Fields follow the OpenAI API reference; the extras vLLM accepts in the body (top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, stop_token_ids, skip_special_tokens,
include_stop_str_in_output, allowed_token_ids, prompt_logprobs, priority, cache_salt,
truncate_prompt_tokens; chat's echo, continue_final_message, add_generation_prompt) are
implemented as vLLM defines them; those this server cannot honour (bad_words, use_beam_search, ...:
see request_fields.py) are a 400 naming the field. Other unknown fields are ignored, as vLLM does, with a
warning naming them (once per name, so a client that always sends one does not flood the log).
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from twinserve.core.errors import InvalidSamplingParamsError
from twinserve.core.sampling_params import SamplingParams
from twinserve.backends.real.serving.errors import APIError, bad_request
from twinserve.backends.real.serving.request_fields import check_refused
from twinserve.backends.real.serving.structured_fields import structured_spec


logger = logging.getLogger("twinserve.serve")

# Unknown field names already warned about (bounded: past this many, new names are no longer remembered).
_WARNED_UNKNOWN: set[str] = set()
_MAX_WARNED_UNKNOWN = 1024

# Stop strings are searched in every step's new text: a bound keeps one request from slowing the others.
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 16_384


def _null_is(default: Any) -> BeforeValidator:
    """For a field vLLM types Optional while its code reads it as set: null is read as the default."""
    return BeforeValidator(lambda v: default if v is None else v)


# vLLM's request models (vllm/entrypoints/openai/protocol.py) type these `... | None` with this default,
# and read null as the default (SamplingParams.from_optional turns n=None into 1). The schema says
# null is allowed; after validation the value is never None. Fields vLLM types without None (completions'
# `n: int = 1`, chat's `echo: bool`) stay refused on null there and here.
NullFalse = Annotated[bool | None, _null_is(False)]
NullOne = Annotated[int | None, _null_is(1)]


class StreamOptions(BaseModel):
    """stream_options: include_usage adds a final chunk carrying usage."""

    model_config = ConfigDict(extra="ignore")
    # True when the object is given without it, as vLLM has it (so {"continuous_usage_stats": true} alone works).
    include_usage: bool | None = True
    # vLLM's: every chunk carries the usage so far. (null reads as false for both, as in vLLM.)
    continuous_usage_stats: bool | None = False


class _Common(BaseModel):
    """Sampling fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore", strict=False)
    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: NullFalse = False
    stream_options: StreamOptions | None = None
    # Written on the request's access-log line (OpenAI's end-user id, for abuse monitoring).
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[str, float] | None = None
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    # Queue order under --policy priority (lower first); the prefix cache's salt (vLLM's cache_salt).
    priority: int = 0
    cache_salt: str | None = None
    # Keep only the prompt's last N tokens (-1: the last max_model_len).
    truncate_prompt_tokens: int | None = None
    # twinserve's extra: engine-side timings and counts in the final chunk (the bench client asks)
    return_metrics: bool = False
    # Output constraints (see structured_fields.py): OpenAI's response_format, vLLM's guided_* and
    # structured_outputs. One per request; the grammar masks the logits before sampling.
    response_format: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_decoding_backend: str | None = None
    # vLLM's: logprob tokens as "token_id:{id}", for tokens that are not valid text on their own.
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each choice's token ids alongside the text (openai_format.ResponseMeta).
    return_token_ids: bool | None = None
    best_of: int | None = None
    # Refused unless neutral (request_fields.REFUSED): declared so they are never dropped silently.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    spaces_between_special_tokens: bool = True
    guided_whitespace_pattern: str | None = None
    logits_processors: list[Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    request_id: str | None = None

    def logprob_fields(self) -> tuple[int | None, int | None]:
        """(logprobs, prompt_logprobs) for SamplingParams: top-N counts, None when not asked."""
        return None, self.prompt_logprobs

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        """Validated SamplingParams (typed error naming the bad field)."""
        logprobs, prompt_logprobs = self.logprob_fields()
        kw: dict[str, Any] = dict(n=self.n, max_tokens=max_tokens, min_tokens=self.min_tokens,
                                  seed=self.seed, stop=self.stop or [],
                                  stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
                                  skip_special_tokens=self.skip_special_tokens, logit_bias=self.logit_bias,
                                  logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                  structured_output=structured_spec(self),
                                  include_stop_str_in_output=self.include_stop_str_in_output,
                                  allowed_token_ids=self.allowed_token_ids)
        for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("min_p", 0.0),
                              ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                              ("repetition_penalty", 1.0)):
            value = getattr(self, name)
            kw[name] = default if value is None else value
        return SamplingParams(**kw)

    @property
    def include_usage(self) -> bool:
        """True when a streamed response ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """True when every streamed chunk carries the usage so far (vLLM's continuous_usage_stats)."""
        return bool(self.include_usage and self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_Common):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    echo: NullFalse = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    prompt_embeds: Any = None

    def logprob_fields(self) -> tuple[int | None, int | None]:
        """logprobs=N: top N per generated token, and per prompt token when echoing (or prompt_logprobs)."""
        echoed = self.logprobs if self.echo else None
        asked = [v for v in (echoed, self.prompt_logprobs) if v is not None]
        return self.logprobs, max(asked) if asked else None


class ChatMessage(BaseModel):
    """One message of a conversation (text content, or a list of text parts)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: NullOne = 1  # completions' n stays `int` (vLLM: null a 400 there)
    logprobs: NullFalse = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's: the reply starts with the last message's content when that message is the assistant's.
    echo: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's: a Jinja template for this request (over the server's --chat-template), and RAG documents
    # handed to the template; special tokens added on top of the template's own.
    chat_template: str | None = None
    documents: list[dict[str, Any]] | None = None
    add_special_tokens: bool = False
    structural_tag: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    include_reasoning: bool = True

    def logprob_fields(self) -> tuple[int | None, int | None]:
        """logprobs=true with top_logprobs=N (0 when absent); prompt_logprobs as asked."""
        return (self.top_logprobs or 0) if self.logprobs else None, self.prompt_logprobs

    def message_dicts(self) -> list[dict[str, Any]]:
        """Messages as plain dicts with text content, ready for the chat template."""
        return messages_as_dicts(self.messages)


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as plain dicts with text content (text parts joined), ready for the chat template."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}].content: only text parts are supported",
                                      f"messages[{i}].content", "invalid_value")
                texts.append(part["text"])
            content = "".join(texts)
        d = {k: v for k, v in (m.model_extra or {}).items()}
        d.update(role=m.role, content=content or "")
        out.append(d)
    return out


def parse_body(model: type[_Common], body: Any) -> Any:
    """Validate a decoded JSON body; a 400 naming the first bad field otherwise."""
    req = parse_model(model, body)
    _check_unsupported(req)
    _warn_unknown(model, body)
    return req


def _warn_unknown(model: type[BaseModel], body: dict[str, Any]) -> None:
    """Log the body's fields this server does not know (ignored, as vLLM does; vLLM logs them too)."""
    new = sorted(k for k in body if k not in model.model_fields and k not in _WARNED_UNKNOWN)
    if not new:
        return
    if len(_WARNED_UNKNOWN) < _MAX_WARNED_UNKNOWN:
        _WARNED_UNKNOWN.update(new[:_MAX_WARNED_UNKNOWN - len(_WARNED_UNKNOWN)])
    shown = ", ".join(repr(k[:64]) for k in new[:8]) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
    logger.warning("request fields this server does not know were ignored: %s (said once per field name)", shown)


# The union members pydantic puts in an error's loc ("str", "list[int]", "function-before[...]"): not field names.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|function-\w+)(\[.*\])?$")


def parse_model(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body against any request model; a 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", None, "invalid_value")
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not _UNION_TAG.match(str(p)))
        code = "missing_required_parameter" if err["type"] == "missing" else "invalid_type"
        raise bad_request(f"{loc}: {err['msg']}", loc or None, code) from None
    return req


# Arguments the server itself passes to the chat template: chat_template_kwargs may not set them.
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "add_generation_prompt", "tokenize", "return_dict", "return_tensors",
    "continue_final_message", "chat_template", "tools", "documents", "padding", "truncation", "max_length",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens"})


def _check_unsupported(req: _Common) -> None:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options can only be given when stream=true (as in vLLM)", "stream_options",
                          "invalid_value")
    _check_stop(req.stop)
    check_refused(req)
    if req.bad_words:
        raise bad_request("bad_words is not supported by this server; use logit_bias to push tokens down",
                          "bad_words", "unsupported")
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request("prompt_logprobs are not available when stream=true (as in vLLM)", "prompt_logprobs",
                          "unsupported")
    t = req.truncate_prompt_tokens
    if t is not None and (t == 0 or t < -1):
        raise bad_request("truncate_prompt_tokens: -1 (the last max_model_len tokens) or an integer >= 1",
                          "truncate_prompt_tokens", "invalid_value")
    if req.best_of not in (None, 1, req.n):
        raise bad_request("best_of is not supported (use n)", "best_of", "unsupported")
    if isinstance(req, CompletionRequest):
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix", "unsupported")
    if isinstance(req, ChatCompletionRequest):
        if not req.messages:
            raise bad_request("messages must hold at least one message", "messages", "invalid_value")
        if req.add_generation_prompt and req.continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true: the "
                              "reply either starts a new assistant message or continues the last one",
                              "continue_final_message", "invalid_value")
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs", "invalid_value")
        clash = sorted(set(req.chat_template_kwargs or {}) & _RESERVED_TEMPLATE_KWARGS)
        if clash:
            raise bad_request(f"chat_template_kwargs may not set {clash}: the server sets them from the request's "
                              "own fields", "chat_template_kwargs", "invalid_value")


def _check_stop(stop: str | list[str] | None) -> None:
    """400 for a stop list over MAX_STOP_STRINGS strings or MAX_STOP_CHARS characters in all."""
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop holds {len(stops)} strings; this server takes at most {MAX_STOP_STRINGS}",
                          "stop", "invalid_value")
    total = sum(len(s) for s in stops)
    if total > MAX_STOP_CHARS:
        raise bad_request(f"stop strings hold {total} characters in all; this server takes at most "
                          f"{MAX_STOP_CHARS}", "stop", "invalid_value")


def to_sampling_params(req: _Common, max_tokens: int | None, max_logprobs: int | None = None) -> SamplingParams:
    """SamplingParams from a request, bad values (or logprobs above max_logprobs) a 400 naming the field."""
    try:
        sp = req.sampling_params(max_tokens)
        if max_logprobs is not None:
            for name in ("logprobs", "prompt_logprobs"):
                value = getattr(sp, name)
                if value is not None and value > max_logprobs:
                    raise InvalidSamplingParamsError(name, value, f"an integer in [0, {max_logprobs}] (the "
                                                     "server's --max-logprobs)")
        return sp
    except InvalidSamplingParamsError as e:
        field = e.field
        if field == "logprobs" or (field == "prompt_logprobs" and req.prompt_logprobs is None):
            field = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
        raise bad_request(str(e), field, "invalid_value") from None


__all__ = ["APIError", "ChatCompletionRequest", "CompletionRequest", "parse_body", "to_sampling_params"]
