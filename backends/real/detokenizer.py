"""Incremental detokenization and stop strings, with deltas safe to stream.

Decoding the tail of the sequence twice (up to the last emitted token, and through the
newest) and emitting only the difference keeps multi-byte characters whole: a token that
ends inside a UTF-8 sequence decodes to U+FFFD and is held back until it completes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Prompt tokens decoded along with the first outputs, so tokenizers that drop a leading
# space on the first token of a decode get the same text as a full decode.
_PREFIX_CONTEXT = 4
_REPLACEMENT = "\ufffd"


@dataclass(slots=True)
class IncrementalDetokenizer:
    """Turns a growing token sequence into text, emitting stable deltas."""

    tokenizer: Any
    skip_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""
    emitted: int = 0  # characters of text already handed out as deltas
    stop_hit: str | None = None
    # vLLM's include_stop_str_in_output: the stop string that ends the text stays in it.
    include_stop: bool = False

    @classmethod
    def for_prompt(cls, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool,
                   stop: list[str], include_stop: bool = False) -> "IncrementalDetokenizer":
        """A detokenizer seeded with the prompt's last tokens as decoding context."""
        ctx = list(prompt_token_ids[-_PREFIX_CONTEXT:])
        return cls(tokenizer, skip_special_tokens, list(stop), ctx, 0, len(ctx), include_stop=include_stop)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, new_ids: list[int]) -> bool:
        """Append tokens and extend text; True if a stop string ended the output (text trimmed)."""
        if self.stop_hit is not None:
            return True
        before = len(self.text)
        self.tokens.extend(new_ids)
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self.text += full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return self._check_stop(before)

    def flush(self) -> None:
        """At the end, emit what is pending, less an incomplete character a cut left at its tail."""
        if self.stop_hit is not None or self.read_offset == len(self.tokens):
            return
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        before = len(self.text)
        # max_tokens (or a stop token) can end inside a UTF-8 sequence: its bytes are dropped, as vLLM's
        # detokenizer never emits a held-back tail, rather than shown as U+FFFD.
        self.text += full[len(prefix):].rstrip(_REPLACEMENT)
        self.read_offset = len(self.tokens)
        self._check_stop(before)

    def _check_stop(self, before: int) -> bool:
        if not self.stop or len(self.text) == before:
            return False
        best = -1
        for s in self.stop:
            i = self.text.find(s, max(0, before - len(s) + 1))
            if i != -1 and (best == -1 or i < best):
                best, self.stop_hit = i, s
        if best == -1:
            return False
        self.text = self.text[:best + (len(self.stop_hit or "") if self.include_stop else 0)]
        return True

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, holds back what could start a stop string."""
        end = len(self.text)
        if not finished and self.stop and self.stop_hit is None:
            end -= max(len(s) for s in self.stop) - 1
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta
