"""Exact fast-forward over runs of identical decode steps.

When every running request decodes and nothing waits, steps up to the first length limit
apply at once, KV calls in schedule()'s order, matching stepping exactly (tests/sim).
Sliding windows and KV groups (without a prefix cache) replay allocate_slots itself at each
block boundary, where stepping calls it: its window drops free blocks in the same order.
"""

from __future__ import annotations

from typing import Callable, Mapping

from twinserve.core.kv.group_tables import _new_key
from twinserve.core.kv.hashing import BlockHash
from twinserve.core.request import FINISH_STATUS, FinishReason, Request
from twinserve.core.sched.scheduler import Scheduler


def decode_window(scheduler: Scheduler, max_steps: int) -> int:
    """How many next steps decode the same batch; only the last may finish requests."""
    return decode_plan(scheduler, max_steps)[0]


def decode_plan(scheduler: Scheduler, max_steps: int) -> tuple[int, int]:
    """decode_window's count and the batch's context (computed tokens summed; 0 with no window).

    Waiting requests end the window (they would join its first step; schedule_decode_half makes
    its own checks for a join step).
    """
    kv = scheduler.kv
    if (max_steps <= 0 or len(scheduler.waiting) > 0 or scheduler.loading
            or scheduler.loaded or kv.load_jobs
            or (_windowed(kv) and kv.enable_caching)):
        return 0, 0  # loads in flight; windows free blocks as requests advance: replayed only without a prefix cache
    running = scheduler.running
    cfg = scheduler.config
    if not running or len(running) > cfg.max_num_batched_tokens:
        return 0, 0
    spec = scheduler.spec
    if spec is not None and spec.active(len(running)):
        return 0, 0  # drafts come from the executor
    limit = max_steps
    context = 0  # summed in the same pass: the window's pricing needs it (one pass over the batch, not two)
    for req in running:
        n = len(req.all_token_ids)
        c = req.num_computed_tokens
        # Without output, one token left is still prefill.
        if n - c != 1 or not req.output_token_ids:
            return 0, 0
        context += c
        sp = req.sampling_params
        if sp.stop_token_ids or (req.eos_token_id is not None and not sp.ignore_eos):
            return 0, 0  # a sampled token could stop it
        rem = req.stop_check_len - n
        if rem < limit:
            limit = rem
            if limit <= 0:
                return 0, 0
    k = _fit_blocks(scheduler, running, limit)
    return k, context if k else 0


def _fit_blocks(scheduler: Scheduler, running: list[Request], limit: int) -> int:
    """The largest k <= limit whose new blocks fit in the free ones."""
    kv = scheduler.kv
    # A new block takes a page in every group; blocks a window frees are not counted (so the
    # window may end early, never late: stepping would find at least this much room).
    pages = kv.num_groups
    free = kv.num_free_blocks
    # At most k // block_size + 1 blocks per request: usually no count.
    if len(running) * (limit // kv.block_size + 1) * pages <= free:
        return limit
    if _blocks_needed(scheduler, running, limit) * pages <= free:
        return limit
    lo, hi = 0, limit  # largest k with blocks_needed(k) <= free
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _blocks_needed(scheduler, running, mid) * pages <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _windowed(kv) -> bool:
    return kv.sliding_window is not None or kv.num_groups > 1


def _blocks_needed(scheduler: Scheduler, running: list[Request], num_steps: int) -> int:
    bs = scheduler.kv.block_size
    held = scheduler.kv.req_to_blocks
    total = 0
    for req in running:
        need = -(-(req.num_computed_tokens + num_steps) // bs) - len(held[req.request_id])
        if need > 0:
            total += need
    return total


def apply_decode_steps(scheduler: Scheduler, end_times: list[float],
                       token_ids: Callable[[Request, int], list[int]] | None = None, *,
                       repeat: Mapping[str, int] | None = None, default: int = 1,
                       times: bool = True, known: Mapping[str, list[int]] | None = None
                       ) -> tuple[list[float], list[str]]:
    """Apply len(end_times) decode steps (at most decode_window's count).

    token_ids(request, k) gives k tokens, or repeat maps ids to one token per step;
    returns KV usage per step and the ids finished. times=False leaves request.token_times
    alone (a caller that never reads them: the window's times are most of a run's memory).
    known: a model runner's per-request lists whose first item (the sequence length it knows)
    each running request's steps advance, in this pass (the simulated executor's state: then
    its advance_decode need not make a pass of its own).
    """
    get = repeat.get if repeat is not None else None
    if get is None and token_ids is None:
        raise TypeError("apply_decode_steps needs token_ids or repeat")
    k_steps = len(end_times)
    scheduler.advance_recv(k_steps)  # decode steps count toward the receive poll (Scheduler._received)
    kv = scheduler.kv
    bs = kv.block_size
    caching = kv.enable_caching
    if not caching and kv.host is None and not _windowed(kv):
        return _apply_uncached(scheduler, end_times, token_ids, get, default, times, known)
    if known is not None:
        for req in scheduler.running:
            known[req.request_id][0] += k_steps
    held = kv.req_to_blocks
    cached = kv.num_cached_blocks
    running = scheduler.running
    n_run = len(running)
    scheduler.finished_req_ids = set()
    # k * n_run + i: request i takes a block on step k (schedule()'s order).
    allocs: list[int] = []
    new_at = [0] * k_steps if not caching else []
    lazy = kv.pending_requests
    grows: list[int] = []
    registers = False  # a real registration
    done: list[Request] = []  # end on the last step
    windowed = _windowed(kv)  # decode_window: then no prefix cache
    boundaries: list[tuple[int, int]] = []  # (step, i): request i's allocate_slots call
    for i, req in enumerate(running):
        c = req.num_computed_tokens
        if get is not None:
            toks = [get(req.request_id, default)] * k_steps
        else:
            toks = token_ids(req, k_steps)  # type: ignore[misc]
        all_ids = req.all_token_ids
        all_ids.extend(toks)
        out_ids = req.output_token_ids
        out_ids.extend(toks)
        if times:
            req.token_times.extend(end_times)
        if len(all_ids) >= req.stop_check_len:
            done.append(req)
        if c + k_steps <= req.fast_decode_limit:
            # Nothing for the KV manager (Request.fast_decode_limit).
            req.num_computed_tokens = c + k_steps
            continue
        rid = req.request_id
        k = len(held[rid]) * bs - c
        if windowed:
            while k < k_steps:
                boundaries.append((k, i))
                k += bs
            req.num_computed_tokens = c + k_steps
            continue
        if not caching:
            # Without a prefix cache ids don't matter: one call per request.
            if k < k_steps:
                if kv.allocate_slots(req, k_steps) is None:
                    raise AssertionError("fast-forward allocation failed: check decode_window")
                while k < k_steps:
                    new_at[k] += 1
                    k += bs
            req.num_computed_tokens = c + k_steps
            continue
        req.num_computed_tokens = c + k_steps
        while k < k_steps:
            allocs.append(k * n_run + i)
            k += bs
        if (c + k_steps) // bs > cached.get(rid, 0):
            if rid in lazy:
                grows.append(i)  # it only extends its pending chain
            else:
                registers = True
    usage: list[float] = []
    num_blocks = kv.num_blocks
    free_queue = kv.pool.free_queue
    if windowed:
        _replay_allocations(kv, running, k_steps, boundaries, usage)
    elif not caching:
        free = free_queue.num_free + sum(new_at)
        for n_new in new_at:
            free -= n_new
            usage.append(1.0 - free / num_blocks)  # as KVCacheManager.usage
    elif not registers:
        # Map untouched: one call in allocation order gives the same blocks.
        for i in grows:
            # cache_blocks, inlined.
            req = running[i]
            rid = req.request_id
            cached[rid] = lazy[rid].hi = req.num_computed_tokens // bs
        if allocs:
            allocs.sort()
            free = free_queue.num_free
            if len(allocs) > free:
                raise AssertionError(
                    "fast-forward allocation failed: decode_window was not checked")
            last = -1
            for j, (e, block) in enumerate(zip(allocs, kv.pool.get_new_blocks(len(allocs)))):
                k, i = divmod(e, n_run)
                if k != last:
                    usage.extend([1.0 - (free - j) / num_blocks] * (k - len(usage)))
                    last = k
                held[running[i].request_id].append(block)
    elif kv.lazy or not _register_window(kv, running, k_steps, allocs, usage):
        _step_through_events(kv, running, k_steps, usage)
    u = 1.0 - free_queue.num_free / num_blocks
    usage.extend([u] * (k_steps - len(usage)))
    finished = _finish_by_length(scheduler, done, end_times[-1])
    if finished:
        usage[-1] = 1.0 - free_queue.num_free / num_blocks
    return usage, finished


def _apply_uncached(scheduler: Scheduler, end_times: list[float],
                    token_ids: Callable[[Request, int], list[int]] | None,
                    get: Callable[[str, int], int] | None, default: int, times: bool,
                    known: Mapping[str, list[int]] | None = None) -> tuple[list[float], list[str]]:
    """apply_decode_steps without a prefix cache, host tier or KV groups (the validate rows' case).

    Each request's new blocks come from one pool call for the whole window, in running order:
    the blocks the per-request allocate_slots calls would hand out, to the same requests.
    """
    k_steps = len(end_times)
    kv = scheduler.kv
    bs = kv.block_size
    held = kv.req_to_blocks
    scheduler.finished_req_ids = set()
    new_at = [0] * k_steps  # blocks taken at each step
    takers: list[tuple[list, int]] = []  # (block table, blocks it takes), running order
    total = 0
    done: list[Request] = []
    running = scheduler.running
    if get is not None and known is not None and not times:
        # The validate runs' case (windows are mostly 1-3 steps between arrivals): the same
        # updates as the general loop below, without its branches; one step appends.
        one = k_steps == 1
        for req in running:
            rid = req.request_id
            known[rid][0] += k_steps
            tok = get(rid, default)
            all_ids = req.all_token_ids
            if one:
                all_ids.append(tok)
                req.output_token_ids.append(tok)
            else:
                toks = [tok] * k_steps
                all_ids += toks
                req.output_token_ids.extend(toks)
            if len(all_ids) >= req.stop_check_len:
                done.append(req)
            c = req.num_computed_tokens
            end = req.num_computed_tokens = c + k_steps
            if end <= req.fast_decode_limit:
                continue  # Nothing for the KV manager (Request.fast_decode_limit).
            blocks = held[rid]
            have = len(blocks)
            k = have * bs - c  # the first step past the held blocks
            if k >= k_steps:
                req.fast_decode_limit = have * bs
                continue
            need = -(-end // bs) - have
            takers.append((blocks, need))
            total += need
            req.fast_decode_limit = (have + need) * bs  # as schedule() sets it after allocate_slots
            while k < k_steps:
                new_at[k] += 1
                k += bs
        running = ()
    for req in running:
        rid = req.request_id
        if known is not None:
            known[rid][0] += k_steps
        if get is not None:
            toks = [get(rid, default)] * k_steps
        else:
            toks = token_ids(req, k_steps)  # type: ignore[misc]
        all_ids = req.all_token_ids
        all_ids.extend(toks)
        req.output_token_ids.extend(toks)
        if times:
            req.token_times.extend(end_times)
        if len(all_ids) >= req.stop_check_len:
            done.append(req)
        c = req.num_computed_tokens
        end = req.num_computed_tokens = c + k_steps
        if end <= req.fast_decode_limit:
            continue  # Nothing for the KV manager (Request.fast_decode_limit).
        blocks = held[rid]
        have = len(blocks)
        k = have * bs - c  # the first step past the held blocks
        if k >= k_steps:
            req.fast_decode_limit = have * bs
            continue
        need = -(-end // bs) - have
        takers.append((blocks, need))
        total += need
        req.fast_decode_limit = (have + need) * bs  # as schedule() sets it after allocate_slots
        while k < k_steps:
            new_at[k] += 1
            k += bs
    free_queue = kv.pool.free_queue
    if total:
        if total > free_queue.num_free:
            raise AssertionError("fast-forward allocation failed: check decode_window")
        new = kv.pool.get_new_blocks(total)
        j = 0
        for blocks, need in takers:
            blocks.extend(new[j:j + need])
            j += need
    num_blocks = kv.num_blocks
    free = free_queue.num_free + total
    usage = []
    for n_new in new_at:
        free -= n_new
        usage.append(1.0 - free / num_blocks)  # as KVCacheManager.usage
    finished = _finish_by_length(scheduler, done, end_times[-1])
    if finished:
        usage[-1] = 1.0 - free_queue.num_free / num_blocks
    return usage, finished


def schedule_decode_half(scheduler: Scheduler, get: Callable[[str, int], int], default: int,
                         known: Mapping[str, list[int]] | None = None, count: int | None = None,
                         extra: int = 0) -> tuple[int, list[Request], int] | None:
    """A step's schedule() and the token part of its update_from_output() for its running requests,
    when all are plain decodes with room for their blocks (decode_plan(.., 1)'s checks but the waiting
    one, made in this pass; a failed one rolls back what the pass did and returns None), without
    a host tier or KV groups: one token computed and one sampled (from get) each, and the new
    blocks of those at a block boundary, in running order (without a prefix cache one pool call:
    the ids per-request allocate_slots calls give). With a prefix cache, each request whose step
    is not allocate_slots' no-op (a new block, or a block it fills to register) makes
    allocate_slots' one-table calls in running order after the pass: its new blocks, then
    cache_blocks, as schedule()'s plain_head would; the pass appended only the sampled token,
    past every block it registers. known (as apply_decode_steps'): each decode's first
    item advanced by one in this pass, the model runner's half of the step. count: the decodes are
    the first count running requests (default all; the rest, a joiner in its chunk, the caller
    schedules after them); extra: blocks the rest will take, which must fit with the decodes'.

    The waiting requests are then admitted as schedule() would after them (Scheduler._admit): nothing
    there reads the decodes' tokens. Returns the number of decodes (the running requests), those at
    their length limit (for finish_decode_half once the step is priced) and the batch's context
    (computed tokens summed before the step, as decode_plan gives it).
    """
    kv = scheduler.kv
    running = scheduler.running
    if count is not None and count < len(running):
        running = running[:count]  # the decodes: the rest are scheduled after them by the caller
    if (scheduler.loading or scheduler.loaded or kv.load_jobs or not running
            or len(scheduler.running) > scheduler.config.max_num_batched_tokens
            or (kv.enable_caching and not kv._one_table)):
        return None
    last = running[-1]  # the last joiner, when a join step fails: still in a chunk (no pass, no rollback)
    if len(last.all_token_ids) - last.num_computed_tokens != 1 or not last.output_token_ids:
        return None
    bs = kv.block_size
    held = kv.req_to_blocks
    caching = kv.enable_caching
    counts = kv.num_cached_blocks
    takers: list[tuple[list, int]] = []
    crossers: list[tuple[Request, list, int]] = []  # with a prefix cache: (request, block table, new blocks)
    limits: list[tuple[Request, int]] = []  # fast_decode_limit before this pass changed it
    total = 0
    context = 0
    done: list[Request] = []
    for req in running:
        all_ids = req.all_token_ids
        n = len(all_ids)
        c = req.num_computed_tokens
        out = req.output_token_ids
        lim = req.stop_check_len
        sp = req.sampling_params
        # decode_plan's checks, before anything changes for this request: a plain decode (one
        # token left with output: without output it is still prefill), no stop token or EOS to
        # sample, not at its length limit.
        if (n - c != 1 or not out or lim <= n or sp.stop_token_ids
                or (req.eos_token_id is not None and not sp.ignore_eos)):
            _undo_decode_half(running, running.index(req), limits, known)  # (only here: no enumerate)
            return None
        context += c
        rid = req.request_id
        if known is not None:
            known[rid][0] += 1
        tok = get(rid, default)
        all_ids.append(tok)
        out.append(tok)
        if n + 1 >= lim:
            done.append(req)
        end = req.num_computed_tokens = c + 1
        if end <= req.fast_decode_limit:
            continue
        blocks = held[rid]
        have = len(blocks)
        limits.append((req, req.fast_decode_limit))
        if caching:
            # allocate_slots(req, 1) at c: a no-op when its blocks hold end tokens and no block
            # fills (plain_head's refresh then stores fast_decode_limit's value, as below).
            registered = counts[rid]
            if end <= have * bs and end // bs <= registered:
                limit = (registered + 1) * bs - 1
                req.fast_decode_limit = limit if limit < have * bs else have * bs
                continue
            need = -(-end // bs) - have
            if need < 0:
                need = 0
            crossers.append((req, blocks, need))
            total += need
            continue
        if end <= have * bs:
            req.fast_decode_limit = have * bs
            continue
        need = -(-end // bs) - have
        takers.append((blocks, need))
        total += need
        req.fast_decode_limit = (have + need) * bs
    if (total or extra) and total + extra > kv.pool.free_queue.num_free:  # decode_plan's _fit_blocks for one step
        # Each allocate_slots call fails only past the free blocks (cache_blocks frees none).
        _undo_decode_half(running, len(running), limits, known)
        return None
    if crossers:
        # allocate_slots' one-table path for each, in running order (the pool may evict cached
        # blocks and cache_blocks may take keys: their order is schedule()'s).
        get_new_blocks = kv.pool.get_new_blocks
        cache_blocks = kv.cache_blocks
        for req, blocks, need in crossers:
            if need:
                blocks.extend(get_new_blocks(need))
            end = req.num_computed_tokens
            if end // bs > counts[req.request_id]:
                cache_blocks(req, end)
            have = len(blocks)
            limit = (counts[req.request_id] + 1) * bs - 1  # fast_loop.fast_decode_limit
            req.fast_decode_limit = limit if limit < have * bs else have * bs
    if total and not crossers:
        new = kv.pool.get_new_blocks(total)
        j = 0
        for blocks, need in takers:
            blocks.extend(new[j:j + need])
            j += need
    return len(running), done, context


def _undo_decode_half(running: list[Request], count: int, limits: list[tuple[Request, int]],
                      known: Mapping[str, list[int]] | None = None) -> None:
    """Roll back schedule_decode_half's pass over running[:count] (nothing was allocated yet)."""
    for req in running[:count]:
        req.all_token_ids.pop()
        req.output_token_ids.pop()
        req.num_computed_tokens -= 1
        if known is not None:
            known[req.request_id][0] -= 1
    for req, limit in limits:
        req.fast_decode_limit = limit


def finish_decode_half(scheduler: Scheduler, decodes: list[Request], done: list[Request], now: float,
                       times: bool) -> list[str]:
    """The rest of update_from_output() for schedule_decode_half's decodes, the step ending at now:
    their token times (times=True) and those at their length limit ended and freed in order; the
    ids that finished. Call it before update_from_output for the step's other requests (admitted
    after the decodes, so freed after them, as one update_from_output would)."""
    if times:
        for req in decodes:
            req.token_times.append(now)
    return _finish_by_length(scheduler, done, now)


def _replay_allocations(kv, running: list[Request], k_steps: int, boundaries: list[tuple[int, int]],
                        usage: list[float]) -> None:
    """allocate_slots(request, 1) where each request crosses a block boundary, in schedule()'s
    order (step, then running position): elsewhere stepping's call is a no-op."""
    boundaries.sort()
    free_queue = kv.pool.free_queue
    num_blocks = kv.num_blocks
    allocate = kv.allocate_slots
    for k, i in boundaries:
        if k > len(usage):  # steps before k are over
            usage.extend([1.0 - free_queue.num_free / num_blocks] * (k - len(usage)))
        req = running[i]
        end = req.num_computed_tokens
        req.num_computed_tokens = end - k_steps + k
        new_blocks = allocate(req, 1)
        req.num_computed_tokens = end
        if new_blocks is None:
            raise AssertionError("fast-forward allocation failed: check decode_window")


def _register_window(kv, running: list[Request], k_steps: int, allocs: list[int], usage: list[float]) -> bool:
    """Eager registration (a host tier keeps it on): the window's new blocks in one call, then every
    block it fills keyed, when no key it registers is cached already or twice; False otherwise,
    with nothing changed but keys computed (request.block_hashes), and the caller steps through.

    The same state as _step_through_events: without such a key, no registration takes a key from
    another block, so evictions (the host tier's stores) and registrations commute.
    """
    bs = kv.block_size
    cached = kv.pool.cached
    counts = kv.num_cached_blocks
    key_of = kv._key
    hash_fn = kv.hash_fn
    seen: set[int] = set()
    todo = []
    for req in running:
        rid = req.request_id
        done = counts[rid]
        full = req.num_computed_tokens // bs
        if full <= done:
            continue
        hashes = req.block_hashes
        tokens = req.all_token_ids
        n = len(hashes)
        parent = hashes[done - 1] if done else None
        for i in range(done, full):
            if i < n or not i:
                parent = key_of(req, hashes, i, parent)
                n = len(hashes)
            else:
                # KVCacheManager._key's new-key case inlined (hot path; only block 0 carries a salt).
                block_tokens = tuple(tokens[i * bs:(i + 1) * bs])
                parent = _new_key(BlockHash, (hash_fn(parent[0], block_tokens, None), parent, block_tokens, None))
                hashes.append(parent)
                n += 1
            value = parent[0]
            if value in cached or value in seen:
                return False  # a key taken from another block: its order matters
            seen.add(value)
        todo.append((rid, hashes, done, full))
    held = kv.req_to_blocks
    if allocs:
        allocs.sort()
        free_queue = kv.pool.free_queue
        free = free_queue.num_free
        if len(allocs) > free:
            raise AssertionError("fast-forward allocation failed: decode_window was not checked")
        num_blocks = kv.num_blocks
        n_run = len(running)
        last = -1
        for j, (e, block) in enumerate(zip(allocs, kv.pool.get_new_blocks(len(allocs)))):
            k, i = divmod(e, n_run)
            if k != last:
                usage.extend([1.0 - (free - j) / num_blocks] * (k - len(usage)))
                last = k
            held[running[i].request_id].append(block)
    for rid, hashes, done, full in todo:
        # KVCacheManager._register with no key taken (checked above).
        blocks = held[rid]
        for i in range(done, full):
            key = hashes[i]
            block = blocks[i]
            block.block_hash = key
            cached[key[0]] = block
        counts[rid] = full
    return True


def _step_through_events(kv, running: list[Request], k_steps: int, usage: list[float]) -> None:
    """Replay the window's allocations and registrations in schedule()'s order."""
    bs = kv.block_size
    held = kv.req_to_blocks
    cached = kv.num_cached_blocks
    events: list[tuple[int, int]] = []
    for i, req in enumerate(running):
        c = req.num_computed_tokens - k_steps
        k = len(held[req.request_id]) * bs - c
        while k < k_steps:
            events.append((k, i))
            k += bs
        k = (cached.get(req.request_id, 0) + 1) * bs - c - 1
        if k < 0:
            events.append((0, i))
            k = ((c + 1) // bs + 1) * bs - c - 1
        while k < k_steps:
            events.append((k, i))
            k += bs
    events.sort()
    # allocate_slots(req, 1) without its no-op checks.
    free_queue = kv.pool.free_queue
    num_blocks = kv.num_blocks
    get_new_blocks = kv.pool.get_new_blocks
    cache_blocks = kv.cache_blocks
    last = prev_i = -1
    for k, i in events:
        if k == last and i == prev_i:
            continue  # a new block and a full one can share a call
        if k != last:
            u = 1.0 - free_queue.num_free / num_blocks
            usage.extend([u] * (k - len(usage)))
        req = running[i]
        total = req.num_computed_tokens - k_steps + k + 1
        rid = req.request_id
        blocks = held[rid]
        need = -(-total // bs) - len(blocks)
        if need > 0:
            if need > free_queue.num_free:
                raise AssertionError(
                    "fast-forward allocation failed: decode_window was not checked")
            blocks.extend(get_new_blocks(need))
        if total // bs > cached[rid]:
            cache_blocks(req, total)
        last, prev_i = k, i


def _finish_by_length(scheduler: Scheduler, done: list[Request], now: float) -> list[str]:
    """End requests at their length limit as update_from_output() does."""
    if not done:
        return []
    status = FINISH_STATUS[FinishReason.LENGTH]
    requests = scheduler.requests
    kv = scheduler.kv
    ids = []
    for req in done:
        req.status = status
        req.finish_reason = FinishReason.LENGTH
        req.stop_reason = None
        req.finish_time = now
    for req in done:
        rid = req.request_id
        del requests[rid]
        kv.free(req)
        scheduler.finished_req_ids.add(rid)
        ids.append(rid)
    running = scheduler.running
    if len(done) <= 8:
        for req in done:
            running.remove(req)  # identity (Request has no __eq__): a C scan, not a Python pass
    else:
        scheduler.running = [r for r in running if r.finish_reason is None]
    return ids
