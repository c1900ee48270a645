"""Prompt-lookup (n-gram) drafts, after Saxena's prompt lookup decoding as vLLM's `ngram` does it.

The longest recurring suffix (prompt_lookup_max down to _min tokens) proposes the k tokens that
followed its first earlier occurrence.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Proposes up to k drafts per request by matching its latest n-gram against its history."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: np.ndarray) -> list[int]:
        """Drafts for the sequence token_ids (1-D int array): [] when no n-gram recurs."""
        total = token_ids.shape[0]
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            pattern = token_ids[total - n:]
            # Windows that start before the suffix itself and leave at least one token after.
            windows = sliding_window_view(token_ids[:total - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return token_ids[start:start + self.k].tolist()
        return []
