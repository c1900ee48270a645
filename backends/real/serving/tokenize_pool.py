"""Tokenization for the server: off the event loop, on worker threads sized by the job, and bounded.

Small texts and large ones go to separate workers, so a request of a few words never waits
behind a large prompt's tokenization. Each worker owns a copy of the tokenizer (a fast
tokenizer is one Rust object that is not meant to be shared across threads).

A text that cannot fit max_model_len is refused before it is tokenized whole: no token covers
more characters than the longest vocabulary entry, so a text longer than (max_model_len + 1)
times that many characters only has its first such prefix tokenized, and the count of the
prefix already proves the text too long.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from twinserve.core.errors import PromptTooLongError

_T = TypeVar("_T")

# Texts of more characters than this are tokenized on the large-job worker (tens of ms and up).
LARGE_JOB_CHARS = 16 * 1024
SMALL_WORKERS = 2
LARGE_WORKERS = 1


def max_chars_per_token(tokenizer: Any) -> int:
    """The most characters of text one token can stand for (the longest vocabulary entry).

    A byte-level BPE entry spells each byte as one character and a SentencePiece entry each
    character as itself (byte-fallback entries like <0x41> are longer still), so an entry's
    length bounds the text it decodes to.
    """
    vocab = tokenizer.get_vocab()
    longest = max((len(k) for k in vocab), default=1)
    added = getattr(tokenizer, "added_tokens_encoder", None) or {}
    return max(1, longest, *(len(k) for k in added))


class TokenizerPool:
    """Worker threads that tokenize, each with its own tokenizer copy; small jobs never queue behind large ones."""

    def __init__(self, tokenizer: Any, max_model_len: int, small_workers: int = SMALL_WORKERS,
                 large_workers: int = LARGE_WORKERS, large_job_chars: int = LARGE_JOB_CHARS) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.large_job_chars = large_job_chars
        self.max_chars_per_token = max_chars_per_token(tokenizer)
        # Any text longer than this is known to exceed max_model_len once its prefix is counted.
        self.char_bound = (max_model_len + 1) * self.max_chars_per_token
        self._local = threading.local()
        self._small = ThreadPoolExecutor(small_workers, thread_name_prefix="twinserve-tokenize",
                                         initializer=self._init_worker)
        self._large = ThreadPoolExecutor(large_workers, thread_name_prefix="twinserve-tokenize-large",
                                         initializer=self._init_worker)

    def _init_worker(self) -> None:
        self._local.tokenizer = copy.deepcopy(self.tokenizer)

    async def run(self, size: int, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """fn(tokenizer, *args, **kwargs) on a worker; `size` (characters or tokens) picks the worker."""
        pool = self._large if size > self.large_job_chars else self._small
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, lambda: fn(self._local.tokenizer, *args, **kwargs))

    def shutdown(self) -> None:
        """Stop the workers (jobs already running finish on their own)."""
        self._small.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)

    def encode(self, tokenizer: Any, text: str, add_special_tokens: bool = True, param: str = "prompt",
               limit: int | None = None, truncate: int | None = None) -> list[int]:
        """Token ids of text; PromptTooLongError, before tokenizing it all, if it cannot fit `limit` tokens.

        With `truncate`, only the text's last `truncate` tokens (vLLM's truncate_prompt_tokens): just
        enough of its end is tokenized to hold them.
        """
        if truncate is not None:
            tail = (truncate + 1) * self.max_chars_per_token
            ids = _ids(tokenizer, text[-tail:] if len(text) > tail else text, add_special_tokens)
            return ids[-truncate:]
        limit = self.max_model_len if limit is None else limit
        bound = (limit + 1) * self.max_chars_per_token
        if len(text) > bound:
            # The prefix alone overflows unless a normalizer shrank it; then count the whole text.
            head = _ids(tokenizer, text[:bound], add_special_tokens)
            if len(head) > limit:
                err = PromptTooLongError(
                    f"this model's maximum context length is {limit} tokens, but the {param} has more than "
                    f"{len(head)} tokens ({len(text)} characters); shorten the {param}", len(head), limit)
                err.param = param
                raise err
        return _ids(tokenizer, text, add_special_tokens)


def decode_ids(tokenizer: Any, ids: list[int]) -> str:
    """tokenizer.decode(ids), through the fast tokenizer's batch call when that gives the same text.

    The Rust backend's decode keeps the GIL for the whole call (0.44 s for 2M ids: every stream waits
    on a worker thread as on the loop); decode_batch lets go of it while it decodes. transformers' decode
    is that backend decode plus an optional clean-up, so with clean-up off the two are the same text.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode_batch") or getattr(tokenizer, "clean_up_tokenization_spaces",
                                                                          True):
        return tokenizer.decode(ids)
    return backend.decode_batch([ids], skip_special_tokens=False)[0]


def _ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    # The batch call, not the backend's encode: it lets go of the GIL while it tokenizes.
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]) if text else []


def text_size(value: Any) -> int:
    """Characters of text inside a JSON value (messages, tools): what a chat template renders."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_size(k) + text_size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(text_size(v) for v in value)
    return 0
