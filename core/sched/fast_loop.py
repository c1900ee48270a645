"""The scheduler's hot path helpers: the first loop over running requests when nothing speculates.

Kept apart from Scheduler.schedule's general loop so a plain decode step pays nothing for
drafts or lookahead slots (issue 53 item 13: it was 11-13% dearer once drafts existed).
"""

from __future__ import annotations

from typing import Callable, Sequence

from twinserve.core.kv.block_pool import KVCacheBlock
from twinserve.core.kv.kv_cache_manager import KVCacheManager
from twinserve.core.request import Request

# Shared: executors must not mutate it.
NO_IDS: tuple[int, ...] = ()


def block_ids(blocks: list[KVCacheBlock]) -> Sequence[int]:
    """The ids of newly allocated blocks (the shared empty tuple when none)."""
    if not blocks:
        return NO_IDS
    if len(blocks) == 1:
        return [blocks[0].block_id]
    return [b.block_id for b in blocks]


def no_block_ids(blocks: list[KVCacheBlock]) -> Sequence[int]:
    """block_ids for an executor that reads no block tables (Scheduler.executor_reads_tables False)."""
    return NO_IDS


def fast_decode_limit(kv: KVCacheManager, rid: str) -> int:
    """Request.fast_decode_limit, mirroring allocate_slots' no-op case."""
    bs = kv.block_size
    limit = len(kv.req_to_blocks[rid]) * bs
    if kv.enable_caching:
        registered = (kv.num_cached_blocks[rid] + 1) * bs - 1
        if registered < limit:
            return registered
    return limit


def refresh_fast_decode_limit(kv: KVCacheManager, req: Request) -> int:
    """Recompute and store req.fast_decode_limit; return it."""
    limit = req.fast_decode_limit = fast_decode_limit(kv, req.request_id)
    return limit


def chunk(num_new: int, threshold: int, budget: int) -> int:
    """Tokens this step, capped by the long-prefill threshold and the budget."""
    if 0 < threshold < num_new:
        num_new = threshold
    return num_new if num_new < budget else budget


def plain_head(head: list[Request], kv: KVCacheManager, c_ids: list[str], c_computed: list[int],
               other: dict[int, tuple[int, Sequence[int]]], spare: int, threshold: int,
               budget: int, stalled: list[Request], partial: list[Request],
               ids: Callable[[list[KVCacheBlock]], Sequence[int]] = block_ids) -> tuple[int, int]:
    """Schedule's first loop without drafts: (tokens past one per request, requests skipped).

    Same decisions as the general loop with speculation off; it stops at the first request
    that does not fit without preempting, or once the budget may not cover the rest.
    Requests with no token left to compute go to `stalled` (the scheduler fails them); those given a chunk
    short of their last token, to `partial` (update_from_output checks that they sampled nothing).
    ids gives a chunk's new block ids (Scheduler._table_ids).
    """
    add_id, add_computed = c_ids.append, c_computed.append
    allocate = kv.allocate_slots
    extra = skipped = 0
    for req in head:
        c = req.num_computed_tokens
        num_new = len(req.all_token_ids) - c
        rid = req.request_id
        if num_new == 1:
            # Past the bound: fast-forward advanced it, so refresh.
            if c < req.fast_decode_limit or (
                    c > req.fast_decode_limit and c < refresh_fast_decode_limit(kv, req)):
                add_id(rid)
                add_computed(c)
                req.num_computed_tokens = c + 1
                continue
        else:
            if num_new <= 0 or c < 0:  # a wrong computed-token count: skipped forever, or positions < 0
                stalled.append(req)
                skipped += 1
                spare += 1
                continue
            rest = num_new
            num_new = chunk(num_new, threshold, budget - len(c_ids) - extra)
            if num_new <= 0:
                skipped += 1
                spare += 1
                continue
            if num_new < rest:
                partial.append(req)
        new_blocks = allocate(req, num_new)
        if new_blocks is None:
            break  # needs preemption: the caller's checked loop
        req.fast_decode_limit = fast_decode_limit(kv, rid)
        other[len(c_ids)] = (num_new, ids(new_blocks))
        add_id(rid)
        add_computed(c)
        req.num_computed_tokens = c + num_new
        extra += num_new - 1
        spare -= num_new - 1
        if spare < 0:
            break  # the caller's checked loop takes the rest
    return extra, skipped
