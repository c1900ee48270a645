"""Tokenizer loading (local files only) and prompt rendering through the chat template."""

from __future__ import annotations

import os
from typing import Any

from twinserve.core.errors import InvalidRequestError, UnsupportedModelError
from twinserve.backends.real.models.registry import ModelSource


def load_tokenizer(source: ModelSource, override: str | None = None) -> Any:
    """The model's transformers tokenizer, never fetched from a hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        if override is not None:
            return AutoTokenizer.from_pretrained(override, local_files_only=True)
        if source.is_gguf:
            return AutoTokenizer.from_pretrained(str(source.path.parent), gguf_file=source.path.name)
        return AutoTokenizer.from_pretrained(str(source.path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise UnsupportedModelError(f"cannot load a tokenizer for {source.path}: {e}") from e
    except Exception as e:  # a tokenizer file of the wrong shape: KeyError, or the tokenizers library's bare Exception
        raise UnsupportedModelError(f"cannot load a tokenizer for {source.path}: its tokenizer files do not "
                                    f"parse ({type(e).__name__}: {e})") from e


def _check_messages(messages: Any) -> None:
    """A typed error unless messages is a non-empty list of role dicts."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise InvalidRequestError("messages must be a list of {'role': ..., 'content': ...} dicts",
                                  param="messages")
    if not messages:
        raise InvalidRequestError("messages must hold at least one message", param="messages")


def apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                        **kwargs: Any) -> list[int]:
    """Render a conversation to prompt token ids with the tokenizer's chat template."""
    _check_messages(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model's tokenizer has no chat template; use generate()",
                                  param="messages")
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                            tokenize=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - jinja, argument and encoding errors: the request's own
        raise InvalidRequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                                  param="messages") from e
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                **kwargs: Any) -> str:
    """A conversation rendered to prompt text with the chat template (or `chat_template` if given).

    Tokenizing the text without special tokens gives apply_chat_template's ids; the server
    renders first so that it can bound the tokenization of an over-long conversation.
    """
    _check_messages(messages)
    if kwargs.get("chat_template") is None and getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model's tokenizer has no chat template; start the server with "
                                  "--chat-template or use /v1/completions", param="messages")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                             tokenize=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - jinja, argument and encoding errors: the request's own
        raise InvalidRequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                                  param="messages") from e
    if not isinstance(text, str):
        raise InvalidRequestError("the chat template did not render to text", param="messages")
    return text
