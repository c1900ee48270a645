"""Small pieces of a scheduler step shared by the batch policies (core/sched/batch_policy.py)."""

from __future__ import annotations

from twinserve.core.kv.block_pool import KVCacheBlock
from twinserve.core.request import Request

# The hot path's helpers live in fast_loop.py (one definition); the policies take them from here.
from twinserve.core.sched.fast_loop import NO_IDS as _NO_IDS  # noqa: F401
from twinserve.core.sched.fast_loop import block_ids as _block_ids  # noqa: F401
from twinserve.core.sched.fast_loop import chunk as _chunk  # noqa: F401
from twinserve.core.sched.fast_loop import fast_decode_limit as _fast_decode_limit  # noqa: F401
from twinserve.core.sched.fast_loop import refresh_fast_decode_limit as _refresh_fast_decode_limit  # noqa: F401

_NO_BLOCKS: list[KVCacheBlock] = []


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
