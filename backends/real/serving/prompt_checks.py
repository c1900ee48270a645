"""Prompt checks of the completions and chat routes: truncation, batches, and what fits max_model_len."""

from __future__ import annotations

from typing import Any

from twinserve.core.errors import PromptTooLongError
from twinserve.backends.real.serving.errors import bad_request


def truncation(state: Any, value: int | None) -> int | None:
    """truncate_prompt_tokens as a token count (-1: max_model_len), or None; 400 above max_model_len."""
    if value is None:
        return None
    limit = state.engine.max_model_len
    if value > limit:
        raise bad_request(f"truncate_prompt_tokens={value} is above max_model_len ({limit})",
                          "truncate_prompt_tokens", "invalid_value")
    return limit if value == -1 else value


def too_long(limit: int, n: int, where: str) -> PromptTooLongError:
    """The 400 for a prompt of n tokens over max_model_len, naming the prompt (prompt[k] in a batch)."""
    err = PromptTooLongError(f"this model's maximum context length is {limit} tokens, but the {where} has "
                             f"{n} tokens; shorten the {where}", n, limit)
    err.param = where.split("[", 1)[0]
    return err


def check_fits(state: Any, ids: list[int], where: str) -> None:
    """PromptTooLongError for a prompt over max_model_len (max_tokens is checked with the whole batch)."""
    if len(ids) > state.engine.max_model_len:
        raise too_long(state.engine.max_model_len, len(ids), where)


def check_length(state: Any, ids: list[int], max_tokens: int | None, param: str) -> int | None:
    """max_tokens for a prompt (the room left when None); 400 when the prompt, or it plus max_tokens, overflows."""
    limit = state.engine.max_model_len
    if len(ids) > limit:
        raise PromptTooLongError(f"this model's maximum context length is {limit} tokens, but the prompt has "
                                 f"{len(ids)} tokens; shorten the {param}", len(ids), limit)
    if max_tokens is None:
        return max(1, limit - len(ids))
    if isinstance(max_tokens, int) and max_tokens > 0 and len(ids) + max_tokens > limit:
        raise bad_request(f"this model's maximum context length is {limit} tokens, but {len(ids)} prompt tokens "
                          f"plus max_tokens={max_tokens} exceed it; lower max_tokens or shorten the {param}",
                          "max_tokens", "context_length_exceeded")
    return max_tokens


def split_prompts(prompt: Any) -> list[str | list[int]]:
    """The prompts of a completions body: a string, token ids, or a batch of either (as OpenAI takes)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt is empty: give a string, a list of token ids, or a list of either",
                          "prompt", "invalid_value")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)
