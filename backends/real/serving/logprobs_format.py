"""Log-probabilities in OpenAI's two shapes: chat's `content` list and completions' parallel lists."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from twinserve.core.sched.output import Logprob

TokenText = Callable[[int], str]

# vLLM's floor for a logprob: a token a constraint masks has -inf, which JSON cannot carry.
LOGPROB_FLOOR = -9999.0


def finite_logprob(value: float) -> float:
    """The logprob as JSON can carry it: -inf and NaN become LOGPROB_FLOOR (as vLLM clamps them)."""
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR  # NaN compares False: floored too


class TokenTexts:
    """Token id -> its text on its own (cached: the same ids recur across requests)."""

    def __init__(self, tokenizer: Any, max_entries: int = 200_000) -> None:
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        """The token decoded alone (special tokens kept, so every id has a visible string)."""
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < self.max_entries:
                self._cache[token_id] = text
        return text


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(records: Sequence[Logprob], top_n: int, text: TokenText) -> dict[str, Any]:
    """choice.logprobs of a chat completion (or of one streamed delta)."""
    content = []
    for r in records:
        token = text(r.token_id)
        content.append({"token": token, "logprob": finite_logprob(r.logprob), "bytes": _bytes(token),
                        "top_logprobs": [{"token": text(t), "logprob": finite_logprob(lp), "bytes": _bytes(text(t))}
                                         for t, lp in r.top[:top_n]]})
    return {"content": content}


class CompletionLogprobs:
    """completions' choice.logprobs, built incrementally so streamed offsets continue across chunks."""

    def __init__(self, top_n: int, text: TokenText) -> None:
        self.top_n = top_n
        self.text = text
        self.offset = 0

    def build(self, records: Sequence[Logprob | None], token_ids: Sequence[int]) -> dict[str, Any]:
        """Lists for these tokens; a None record (the first prompt token) has no logprob."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, r in zip(token_ids, records):
            tok = self.text(tid)
            tokens.append(tok)
            offsets.append(self.offset)
            self.offset += len(tok)
            if r is None:
                token_lps.append(None)
                tops.append(None)
                continue
            token_lps.append(finite_logprob(r.logprob))
            # As OpenAI documents: the most likely tokens, and the chosen one as well.
            top = {self.text(t): finite_logprob(lp) for t, lp in r.top[:self.top_n]}
            top.setdefault(tok, finite_logprob(r.logprob))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def merge_completion_logprobs(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Concatenate two completions logprob objects (echoed prompt, then generated tokens)."""
    if a is None:
        return b
    return {k: a[k] + b[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def vllm_prompt_logprobs(records: Sequence[Logprob | None] | None, token_ids: Sequence[int], top_n: int,
                         text: TokenText) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}},
    holding the prompt's own token and the top N."""
    records = records or [None] * len(token_ids)
    out: list[dict[str, dict[str, Any]] | None] = []
    for tid, r in zip(token_ids, records):
        if r is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": finite_logprob(lp), "rank": rank, "decoded_token": text(t)}
                 for rank, (t, lp) in enumerate(r.top[:top_n], start=1)}
        entry.setdefault(str(tid), {"logprob": finite_logprob(r.logprob), "rank": r.rank,
                                    "decoded_token": text(tid)})
        out.append(entry)
    return out
