"""Per-request state the model runner keeps between steps, in persistent host arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twinserve.core.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    """What the runner remembers about one request: its tokens, blocks and progress."""

    req_id: str
    row: int
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    num_blocks: int
    num_computed_tokens: int
    base_seed: int

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens generated so far (recomputed ones after a preemption included)."""
        return self.token_ids[self.num_prompt_tokens:]


class InputBatch:
    """Rows of token ids and block tables, one row per live request; only changes are written."""

    def __init__(self, max_rows: int, max_model_len: int, max_blocks_per_req: int, num_groups: int = 1) -> None:
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_rows, max_model_len), dtype=np.int64)
        # One block table per KV cache group; block_table is group 0's.
        self.num_groups = num_groups
        self.block_tables = [np.zeros((max_rows, max_blocks_per_req), dtype=np.int32) for _ in range(num_groups)]
        self.block_table = self.block_tables[0]
        self.free_rows = list(range(max_rows - 1, -1, -1))
        self.requests: dict[str, CachedRequestState] = {}

    def add(self, req_id: str, token_ids: list[int], num_prompt_tokens: int, params: SamplingParams,
            block_ids: list[int], num_computed: int, base_seed: int) -> CachedRequestState:
        """Take a row for a new (or resumed) request."""
        if not self.free_rows:
            self._grow()
        row = self.free_rows.pop()
        n = len(token_ids)
        self.token_ids[row, :n] = token_ids
        g = self.num_groups
        if g == 1:
            self.block_table[row, :len(block_ids)] = block_ids
        else:
            # Several groups' tables come one after another (KVCacheManager.get_block_ids).
            per = len(block_ids) // g
            for i, table in enumerate(self.block_tables):
                table[row, :per] = block_ids[i * per:(i + 1) * per]
        st = CachedRequestState(req_id, row, list(token_ids), num_prompt_tokens, params,
                                len(block_ids) // g, num_computed, base_seed)
        self.requests[req_id] = st
        return st

    def append_blocks(self, st: CachedRequestState, block_ids: list[int]) -> None:
        """Extend a request's block table."""
        if block_ids:
            n = st.num_blocks
            g = self.num_groups
            if g == 1:
                self.block_table[st.row, n:n + len(block_ids)] = block_ids
                st.num_blocks = n + len(block_ids)
                return
            # Group-major: each group gained the same number of blocks.
            per = len(block_ids) // g
            for i, table in enumerate(self.block_tables):
                table[st.row, n:n + per] = block_ids[i * per:(i + 1) * per]
            st.num_blocks = n + per

    def append_token(self, st: CachedRequestState, token: int) -> None:
        """Record a sampled token so the next step can feed it."""
        n = len(st.token_ids)
        if n < self.max_model_len:
            self.token_ids[st.row, n] = token
        st.token_ids.append(token)

    def remove(self, req_id: str) -> None:
        """Drop a finished or preempted request and free its row."""
        st = self.requests.pop(req_id, None)
        if st is not None:
            self.free_rows.append(st.row)

    def _grow(self) -> None:
        rows = self.token_ids.shape[0]
        self.token_ids = np.concatenate([self.token_ids, np.zeros_like(self.token_ids)])
        self.block_tables = [np.concatenate([t, np.zeros_like(t)]) for t in self.block_tables]
        self.block_table = self.block_tables[0]
        self.free_rows.extend(range(2 * rows - 1, rows - 1, -1))
