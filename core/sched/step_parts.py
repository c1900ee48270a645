"""Small pieces of a scheduler step shared by the batch policies (core/sched/batch_policy.py)."""

from __future__ import annotations

from typing import Sequence

from twinserve.core.kv.block_pool import KVCacheBlock
from twinserve.core.kv.kv_cache_manager import KVCacheManager
from twinserve.core.request import Request

# Shared: executors must not mutate it.
_NO_IDS: tuple[int, ...] = ()
_NO_BLOCKS: list[KVCacheBlock] = []


def _block_ids(blocks: list[KVCacheBlock]) -> Sequence[int]:
    if not blocks:
        return _NO_IDS
    if len(blocks) == 1:
        return [blocks[0].block_id]
    return [b.block_id for b in blocks]


def _fast_decode_limit(kv: KVCacheManager, rid: str) -> int:
    """Request.fast_decode_limit, mirroring allocate_slots' no-op case."""
    bs = kv.block_size
    limit = len(kv.req_to_blocks[rid]) * bs
    if kv.enable_caching:
        registered = (kv.num_cached_blocks[rid] + 1) * bs - 1
        if registered < limit:
            return registered
    return limit


def _refresh_fast_decode_limit(kv: KVCacheManager, req: Request) -> int:
    limit = req.fast_decode_limit = _fast_decode_limit(kv, req.request_id)
    return limit


def _draft_len(req: Request, room: int) -> int:
    """Drafts to verify this step: within room and the length limit."""
    k = len(req.spec_token_ids)
    limit = req.stop_check_len - len(req.all_token_ids) - 1
    if limit < k:
        k = limit
    return k if k < room else room


def _lookahead(req: Request, end: int, lookahead: int, max_model_len: int) -> int:
    """Lookahead slots for a step that computes up to `end`: only when it samples (reaches the
    last token), and never past max_model_len."""
    if not lookahead or end != len(req.all_token_ids):
        return 0
    room = max_model_len - end
    return lookahead if lookahead < room else max(room, 0)


def _chunk(num_new: int, threshold: int, budget: int) -> int:
    """Tokens this step, capped by the long-prefill threshold and the budget."""
    if 0 < threshold < num_new:
        num_new = threshold
    return num_new if num_new < budget else budget
