"""Per-sequence grammar matchers and the batched token bitmask applied to logits before sampling."""

from __future__ import annotations

import time
from typing import Any

import torch


class GrammarMasker:
    """Keeps one xgrammar matcher per constrained sequence; masks a step's logits and advances them."""

    def __init__(self) -> None:
        self._matchers: dict[str, Any] = {}
        self._bitmask: torch.Tensor | None = None
        self._batch: Any = None
        # Seconds spent filling and applying masks in the latest step (the step log's grammar cost);
        # the model runner zeroes both at the start of a step.
        self.last_mask_time = 0.0
        self.last_num_masked = 0

    def __len__(self) -> int:
        return len(self._matchers)

    def add(self, req_id: str, compiled: Any, output_token_ids: list[int]) -> None:
        """Start a matcher for a (new or resumed) sequence; replay tokens it already generated."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled)
        for t in output_token_ids:
            if not matcher.accept_token(t):
                break
        self._matchers[req_id] = matcher

    def remove(self, req_id: str) -> None:
        """Forget a finished or preempted sequence."""
        self._matchers.pop(req_id, None)

    def apply(self, logits: torch.Tensor, req_ids: list[str]) -> None:
        """Mask in place the rows of logits whose sequence is constrained (row i belongs to req_ids[i])."""
        t0 = time.perf_counter()
        rows = [i for i, rid in enumerate(req_ids) if rid in self._matchers
                and not self._matchers[rid].is_terminated()]
        self.last_num_masked += len(rows)
        if not rows:
            return
        import xgrammar as xgr

        vocab = logits.shape[1]
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < len(req_ids) or bitmask.shape[1] != (vocab + 31) // 32:
            bitmask = self._bitmask = xgr.allocate_token_bitmask(max(len(req_ids), 8), vocab)
        matchers = [self._matchers[req_ids[i]] for i in rows]
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=1)
        # Row i of the bitmask belongs to row i of the logits; only constrained rows are filled or applied.
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        xgr.apply_token_bitmask_inplace(logits, bitmask[:len(req_ids)].to(logits.device), indices=rows)
        self.last_mask_time += time.perf_counter() - t0

    def apply_drafts(self, logits: torch.Tensor, req_id: str, drafts: list[int]) -> None:
        """Mask row j of logits (len(drafts) + 1 rows) as the grammar stands after drafts[:j].

        The matcher walks the drafts and rolls back, so it is left where it was. Rows after a draft
        the grammar refuses stay unmasked: that draft is rejected (its masked probability is 0), so
        verification never reads them.
        """
        m = self._matchers.get(req_id)
        if m is None or m.is_terminated():
            return
        import xgrammar as xgr

        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(len(drafts) + 1, logits.shape[1])
        rows: list[int] = []
        walked = 0
        for j in range(len(drafts) + 1):
            if m.is_terminated():
                break
            m.fill_next_token_bitmask(bitmask, j)
            rows.append(j)
            if j == len(drafts) or not m.accept_token(drafts[j]):
                break
            walked += 1
        if walked:
            m.rollback(walked)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
        self.last_num_masked += 1
        self.last_mask_time += time.perf_counter() - t0

    def accept(self, req_ids: list[str], tokens: list[int]) -> None:
        """Advance the matchers of constrained sequences by the tokens just sampled."""
        t0 = time.perf_counter()
        for rid, tok in zip(req_ids, tokens):
            m = self._matchers.get(rid)
            if m is not None and not m.is_terminated():
                m.accept_token(tok)
        self.last_mask_time += time.perf_counter() - t0
