"""Windows of drafting decode steps: a speculative (MTP / draft-model / n-gram) decode-only batch advanced
several steps at once, as core.sched.fast_forward advances plain decodes.

While nothing joins, each step of such a batch follows from the batch: every running request verifies its k
drafts (a (1 + k)-token row; fewer within k + 1 of its length limit, step_parts._draft_len, and none with one
token left: a decode row) and, with a draft model, the draft catches up on what was accepted and drafts k
again. Only each request's accepted count per step is random. A window draws those counts for the whole batch
a step at a time (numpy, SpecAcceptance.draw_accepted: the same per-position rates as stepping's
SpecAcceptance.accepted, another random stream), so every step's context, KV blocks and price follow without
a Python pass per request per step; applying the window makes one pass per request.

The window ends (as plain windows do) after the first step where a request reaches its length limit (it
finishes there, as update_from_output ends it), before a step whose new blocks would not fit (stepping would
preempt or drop lookahead), before the deadline (the next arrival in sim/world.py; sim/cluster.py interrupts
a planned window at an arrival and applies the steps that started before it), or at max_steps
(MAX_SPEC_WINDOW at most). A batch wider than the step budget allows drafts for (schedule_batch gives drafts
only spare budget), with drafts switched off (disable_by_batch_size), a host tier, KV groups or a sliding
window, or with a request not plainly drafting, has no window: it steps.

Applying m steps replays, in stepping's order, the KV calls stepping makes that are not no-ops: each
step's allocate_slots (drafts and lookahead slots, registration of verified blocks) in running order,
then the trims of rejected drafts' blocks (Scheduler._release_rejected) in running order, then the
finishes. So the block tables, free blocks and prefix cache are stepping's for the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from twinserve.backends.sim.executor import DEFAULT_TOKEN, SimExecutor
from twinserve.core.sched.fast_forward import _finish_by_length
from twinserve.core.sched.fast_loop import fast_decode_limit
from twinserve.core.sched.scheduler import Scheduler

# A planned window's steps are drawn before it is known how many run (an arrival cuts a cluster's window):
# a bound on the draws an early cut wastes. Any bound gives the same statistics.
MAX_SPEC_WINDOW = 256
# Steps a cluster replica's window draws at first (sim/cluster.py: then doubling, extend_spec_window, while no
# arrival cuts it). In a disaggregated decode worker of hundreds of requests an arrival comes every few steps:
# drawn all at once, most of a window's draws were never applied. Any size gives the same statistics.
SPEC_FIRST_DRAW = 2
# The smallest drafting batch that advances in windows (sim/world.py, sim/cluster.py: a smaller one steps, as
# every drafting batch did before windows). A window pays ~30 numpy calls a drawn step whatever the batch, a
# stepped batch a Python pass a request a step: on small batches stepping is the cheaper of the two
# (docs/validate-speed.md, "Drafting windows only for wide batches"). Either gives the same statistics.
SPEC_WINDOW_MIN_BATCH = 64

_Features = tuple[int, int, int, float, int, int]

_spec_ids = attrgetter("spec_token_ids")
_stop_ids = attrgetter("stop_check_ids")
_outputs = attrgetter("output_token_ids")
_computed = attrgetter("num_computed_tokens")
_all_ids = attrgetter("all_token_ids")
_stop_len = attrgetter("stop_check_len")
_rid = attrgetter("request_id")


@dataclass(slots=True)
class SpecWindow:
    """A planned window: its steps' durations and end times and what applying them replays."""

    n: int  # running requests (the batch)
    k: int  # drafts verified per request per step
    durations: list[float]
    ends: list[float]
    accepted: list[np.ndarray] = field(default_factory=list)  # per step: each request's accepted drafts
    drafts: list[np.ndarray] = field(default_factory=list)  # per step: each request's drafts verified
    # per step: (rows allocating, their computed tokens before the step, their drafts, their lookahead slots)
    allocs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    trims: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # per step: (rows, tokens kept)
    prices: list[tuple[_Features, float, float]] = field(default_factory=list)  # (features, s, draft s)
    finishing: np.ndarray | None = None  # rows at their length limit after the last planned step
    context: list[int] = field(default_factory=list)  # per step: the batch's computed tokens before it
    # per step: verify_step_price's arguments (features, catch-up, verifies, drafts, drafting, their context)
    parts: list[tuple] = field(default_factory=list)
    cursor: Any = None  # where drawing stands (_Cursor): extend_spec_window draws on from it
    closed: bool = False  # no step can follow: a finish, or a step that would not fit
    sums: tuple | None = None  # (m, accepted, drafts) summed over the first m steps (_step_sums)
    # per step: each request's (computed tokens, length, blocks held) after it (the arrays the draw made:
    # sim/spec_lazy.py's counts take them over once the step is applied)
    after: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    def tokens(self, m: int) -> list[int]:
        """Tokens each of the first m steps schedules (the step log's tokens column)."""
        return [self.n + int(d.sum()) for d in self.drafts[:m]]


def spec_window_applies(sched: Scheduler, ex: SimExecutor) -> bool:
    """Whether the running batch drafts this step (its steps are drafting steps, never plain decodes)."""
    spec = sched.spec
    return spec is not None and spec.active(len(sched.running))


def wide_enough(sched: Scheduler) -> bool:
    """Whether a drafting batch is wide enough to advance in windows (SPEC_WINDOW_MIN_BATCH); else it steps."""
    return len(sched.running) >= SPEC_WINDOW_MIN_BATCH


def plan_spec_window(sched: Scheduler, ex: SimExecutor, max_steps: int, start: float,
                     deadline: float, joining: bool = False, first: int | None = None,
                     lazy: Any = None) -> SpecWindow | None:
    """The next run of same-shape drafting decode steps from start (each starting before deadline), drawn
    and priced but not applied; None where the batch does not allow one (see the module's doc).
    joining: requests wait to join the first step (sim/cluster.py's drafting join step: one step, the
    decodes' half of it, priced with the joiners by the caller). first: draw only this many steps now
    (extend_spec_window draws more, up to max_steps). lazy: the replica's sim.spec_lazy.LazyDrafts, whose
    counts are the batch's (read from it, not from the requests)."""
    kv = sched.kv
    running = sched.running
    n = len(running)
    spec = sched.spec
    acc_model = ex.spec
    if (max_steps <= 0 or n == 0 or spec is None or acc_model is None or not spec.active(n)
            or (len(sched.waiting) > 0 and not joining) or sched.loading or sched.loaded or kv.load_jobs
            or kv.host is not None or kv.num_groups > 1 or kv.sliding_window is not None
            or sched._stalled or sched.failed_outputs or ex.waking):
        return None
    k = acc_model.k
    if len(running) * (1 + k) > sched.config.max_num_batched_tokens:
        return None  # drafts take only spare budget (schedule_batch): some would verify fewer
    state = ex.state
    known = len(state) - sum(1 for rid in sched.finished_req_ids if rid in state)
    if not ex.spec_active(known):
        return None  # the runner would not propose: the next step verifies nothing
    caching = kv.enable_caching
    held = kv.req_to_blocks
    cached_of = kv.num_cached_blocks
    spread = acc_model.spread > 0.0
    if lazy is not None:
        got = lazy.gather(k, spread)
        if got is None:
            return None  # a request taken on is not a plain drafting decode
        c, length, limit, h, rates = got
        if rates is None:
            rates = np.broadcast_to(np.asarray(acc_model.rates, float), (n, k))
        cc = np.zeros(n, np.int64)
        return _plan_from(sched, ex, acc_model, n, k, c, length, limit, h, cc, rates, start, max_steps, deadline,
                          first)
    rates = np.empty((n, k)) if spread else np.broadcast_to(np.asarray(acc_model.rates, float), (n, k))
    # Each request's proposals, whether it is a plain drafting decode with its first token and nothing to stop
    # it (stop_check_ids, Scheduler.add_request), then computed tokens, length, limit and blocks held: a pass
    # of C-level attribute reads each (map over attrgetter), not a Python frame per request.
    if any(map(k.__ne__, map(len, map(_spec_ids, running)))) or any(map(_stop_ids, running)) \
            or not all(map(_outputs, running)):
        return None  # not a plain drafting decode, or a sampled token could stop it
    c = np.fromiter(map(_computed, running), np.int64, n)
    length = np.fromiter(map(len, map(_all_ids, running)), np.int64, n)
    if not (length - c == 1).all():
        return None
    limit = np.fromiter(map(_stop_len, running), np.int64, n)
    rids = list(map(_rid, running))
    h = np.fromiter(map(len, map(held.get, rids, repeat(()))), np.int64, n)
    cc = np.fromiter(map(cached_of.__getitem__, rids), np.int64, n) if caching else np.zeros(n, np.int64)
    if spread:
        for i, req in enumerate(running):
            rates[i] = acc_model.rates_of(req.request_id)
    return _plan_from(sched, ex, acc_model, n, k, c, length, limit, h, cc, rates, start, max_steps, deadline, first)


def _plan_from(sched: Scheduler, ex: SimExecutor, acc_model: Any, n: int, k: int, c: np.ndarray, length: np.ndarray,
               limit: np.ndarray, h: np.ndarray, cc: np.ndarray, rates: np.ndarray, start: float, max_steps: int,
               deadline: float, first: int | None) -> SpecWindow | None:
    """plan_spec_window once the batch is read: the window's cursor and its first draws."""
    kv = sched.kv
    lookahead = sched.lookahead
    mml = sched.config.max_model_len
    bs = kv.block_size
    caching = kv.enable_caching
    free = kv.pool.free_queue.num_free
    as_decode = getattr(ex.cost_model, "prices_verify", False)
    drafting = ex.draft is not None
    win = SpecWindow(n, k, [], [])
    win.cursor = _Cursor(c, length, limit, h, cc, rates, free, start, min(max_steps, MAX_SPEC_WINDOW), deadline,
                         lookahead, mml, bs, caching, as_decode, drafting)
    _draw(ex, win, win.cursor.cap if first is None else first)
    if not win.ends:
        return None
    return win


def extend_spec_window(ex: SimExecutor, win: SpecWindow, more: int) -> bool:
    """Draw and price up to `more` further steps of a planned window that nothing has changed since (its
    batch sleeping through it, as sim/cluster.py's replicas do); False (nothing drawn) where the window
    is closed: it reached a finish, a step that would not fit, its deadline or its cap."""
    cur = win.cursor
    if win.closed or cur is None or len(win.ends) >= cur.cap or cur.t >= cur.deadline:
        return False
    _draw(ex, win, more)
    return True


@dataclass(slots=True)
class _Cursor:
    """Where a window's drawing stands after its last drawn step (what the next step starts from)."""

    c: np.ndarray
    length: np.ndarray
    limit: np.ndarray
    h: np.ndarray
    cc: np.ndarray
    rates: np.ndarray
    free: int
    t: float
    cap: int
    deadline: float
    lookahead: int
    mml: int
    bs: int
    caching: bool
    as_decode: bool
    drafting: bool


def _draw(ex: SimExecutor, win: SpecWindow, more: int) -> None:
    """Draw and price up to `more` steps of win from its cursor (plan_spec_window's loop)."""
    cur = win.cursor
    c, length, limit, h, cc, rates, free, t = cur.c, cur.length, cur.limit, cur.h, cur.cc, cur.rates, cur.free, cur.t
    lookahead, mml, bs, caching, as_decode, drafting = (cur.lookahead, cur.mml, cur.bs, cur.caching, cur.as_decode,
                                                        cur.drafting)
    deadline = cur.deadline
    acc_model = ex.spec
    n, k = win.n, win.k
    cap = min(cur.cap, len(win.ends) + more)
    while len(win.ends) < cap and t < deadline:
        # Each request's drafts this step (step_parts._draft_len: k, fewer within k + 1 of its length
        # limit; room in the budget was checked above); one with none is a plain decode row.
        kk = np.minimum(k, limit - length - 1)
        la = np.minimum(lookahead, np.maximum(mml - length, 0)) if lookahead else np.zeros(n, np.int64)
        total = c + 1 + kk + la
        need = -(-total // bs) - h
        alloc = need > 0
        if caching:
            alloc |= (c + 1) // bs > cc
        new = int(need[need > 0].sum()) if alloc.any() else 0
        if new > free:
            win.closed = True
            break  # stepping would preempt (or drop lookahead): not this shape
        acc = np.minimum(acc_model.draw_accepted(rates), kk)
        ctx = int(c.sum())
        total_acc = int(acc.sum())
        verify = kk > 0
        nv = int(verify.sum())
        nvd = int(kk.sum())
        # _execute_spec's features: a verifying row is a (1 + drafts)-token chunk at its context, or, by a
        # profile that prices verify rows, 1 + drafts decode rows there (plus its verify_time); a row
        # without drafts is one decode row.
        if nv == n:
            qs = kk + 1
            vctx = ctx
            dec_n = dec_ctx = 0
        else:
            qs = (kk + 1)[verify]
            vctx = int(c[verify].sum())
            dec_n = n - nv
            dec_ctx = ctx - vctx
        q_sum = int(qs.sum())
        if as_decode:
            qc = int(((kk + 1) * c)[verify].sum()) if nv != n else int(((kk + 1) * c).sum())
            features: _Features = (0, 0, 0, 0.0, q_sum + dec_n, qc + dec_ctx)
        else:
            cv = c if nv == n else c[verify]
            pa = float((qs * cv).sum()) + float((qs * qs).sum()) * 0.5
            features = (q_sum, nv, vctx, pa, dec_n, dec_ctx)
        catch_up = None
        if drafting:
            # The draft catches up on the accepted drafts, the token before them and the new one (acc + 2
            # tokens a row, a chunk), then drafts k - 1 more decode tokens (DraftModelSteps.time).
            m = acc + 2
            d_pa = float((m * c).sum()) + float((m * m).sum()) * 0.5
            catch_up = (2 * n + total_acc, n, ctx, d_pa, 0, 0)
        part = (features, catch_up, nv, nvd, n, ctx + 2 * n + total_acc)
        win.parts.append(part)
        d, draft_s = ex.verify_step_price(features, nv, nvd, catch_up, n, part[5])
        if alloc.any():
            rows = np.flatnonzero(alloc)
            win.allocs.append((rows, c[rows], kk[rows], la[rows]))
            h = np.maximum(h, -(-total // bs))
            if caching:
                cc = np.maximum(cc, (c + 1) // bs)
            free -= new
        else:
            win.allocs.append(_NONE4)
        win.context.append(ctx)
        c = c + 1 + acc
        length = length + 1 + acc
        done = length >= limit
        keep = -(-c // bs)
        trim = (acc < kk) & (h > keep) & ~done  # finished requests are freed whole, not trimmed
        if trim.any():
            rows = np.flatnonzero(trim)
            win.trims.append((rows, c[rows]))
            free += int((h[rows] - keep[rows]).sum())
            h = np.where(trim, keep, h)
        else:
            win.trims.append(_NONE2)
        win.accepted.append(acc)
        win.drafts.append(kk)
        win.after.append((c, length, h))
        win.prices.append((features, d, draft_s))
        t = t + d
        win.durations.append(d)
        win.ends.append(t)
        if done.any():
            win.finishing = np.flatnonzero(done)
            win.closed = True
            break
    cur.c, cur.length, cur.h, cur.cc, cur.free, cur.t = c, length, h, cc, free, t


_EMPTY = np.zeros(0, np.int64)
_NONE4 = (_EMPTY, _EMPTY, _EMPTY, _EMPTY)
_NONE2 = (_EMPTY, _EMPTY)


def apply_spec_window(sched: Scheduler, ex: SimExecutor, win: SpecWindow, m: int, times: bool,
                      lazy: Any = None) -> list[str]:
    """Apply a planned window's first m steps as stepping would; returns the ids that finished (in running
    order, freed in that order as update_from_output frees them). times: keep each token's time. lazy: the
    replica's sim.spec_lazy.LazyDrafts (the window was planned from it): the requests' tokens and counts are
    kept pending there, not appended."""
    if len(sched.running) != win.n:
        raise AssertionError("a drafting window's batch changed between its plan and its steps")
    state = ex.state
    for rid in sched.finished_req_ids:
        state.pop(rid, None)
    sched.finished_req_ids = set()
    sched.advance_recv(m)  # decode steps count toward the receive poll (Scheduler._received)
    if lazy is not None:
        lazy.advance(win, m, *_step_sums(win, m))
    else:
        append_tokens(sched, ex, win, m, times)
    for j in range(m):
        replay_allocations(sched, win, j)
        replay_trims(sched, win, j)
    settle(sched, win, m, lazy is not None)
    ex.count_verify_steps(win.prices[:m])
    return finish(sched, win, m, win.ends[m - 1], lazy)


def _step_sums(win: SpecWindow, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's accepted drafts and drafts verified over the window's first m steps; summed once for
    append_tokens and settle, which both read them (kept on the window for its m)."""
    if win.sums is None or win.sums[0] != m:
        acc = np.sum(win.accepted[:m], axis=0) if m > 1 else win.accepted[0]
        kk = np.sum(win.drafts[:m], axis=0) if m > 1 else win.drafts[0]
        win.sums = (m, acc, kk)
    return win.sums[1], win.sums[2]


def append_tokens(sched: Scheduler, ex: SimExecutor, win: SpecWindow, m: int, times: bool,
                  ends: list[float] | None = None) -> None:
    """The decodes' (the first win.n running requests') sampled tokens of the first m steps, with the executor's
    known lengths (stepping's update_from_output and _execute_spec) and their draft counters (settle sets
    the rest, after the replayed trims)."""
    running = sched.running
    n = win.n
    accepted = win.accepted[:m]
    acc_sum, kk_sum = _step_sums(win, m)
    gained = (acc_sum + m).tolist()  # tokens each request gains: one a step plus its accepted drafts
    acc_list = acc_sum.tolist()
    kk_list = kk_sum.tolist()
    get = ex.tokens.get
    state = ex.state
    if ends is None:
        ends = win.ends[:m]
    if times:
        per_step = [(a + 1).tolist() for a in accepted]
    kv = sched.kv
    bs = kv.block_size
    held = kv.req_to_blocks
    caching = kv.enable_caching
    # Without per-request tokens every request samples the default one: one list per count, shared (+= copies).
    same = [[DEFAULT_TOKEN] * g for g in range(max(gained) + 1)] if not ex.tokens else None
    for i, req, g, kd, a in zip(range(n), running, gained, kk_list, acc_list):
        rid = req.request_id
        tok = same[g] if same is not None else [get(rid, DEFAULT_TOKEN)] * g
        all_ids = req.all_token_ids
        all_ids += tok
        req.output_token_ids += tok
        state[rid][0] += g
        req.num_draft_tokens += kd
        req.num_accepted_tokens += a
        # Where the steps allocate or trim, settle sets these again after the replays.
        req.num_computed_tokens = len(all_ids) - 1
        req.fast_decode_limit = fast_decode_limit(kv, rid) if caching else len(held[rid]) * bs
        if times:
            tt = req.token_times
            for j in range(m):
                tt.extend([ends[j]] * per_step[j][i])


def replay_allocations(sched: Scheduler, win: SpecWindow, j: int) -> None:
    """Step j's allocate_slots calls that are not no-ops (schedule_batch's drafting loop), in running order."""
    rows, before, drafts, las = win.allocs[j]
    if not len(rows):
        return
    running = sched.running
    kv = sched.kv
    if not kv.enable_caching and kv._one_table:
        # Without a prefix cache each call is allocate_slots' block-filling path less its registration: the
        # row's missing blocks from the pool and onto its table. One pool call split in running order hands out
        # the same blocks (get_new_blocks takes the free queue's front in order). Computed counts are left to
        # settle (which sets them for every row a replay touches).
        tables = list(map(kv.req_to_blocks.__getitem__, map(_rid, map(running.__getitem__, rows.tolist()))))
        bs = kv.block_size
        need = (-(-(before + 1 + drafts + las) // bs)
                - np.fromiter(map(len, tables), np.int64, len(tables))).tolist()
        total = sum(need)
        if total > kv.pool.free_queue.num_free or min(need) <= 0:
            raise AssertionError("a drafting window's allocation failed: check plan_spec_window")
        new = kv.pool.get_new_blocks(total)
        at = 0
        for blocks, k in zip(tables, need):
            blocks += new[at:at + k]
            at += k
        return
    allocate = kv.allocate_slots
    for i, ci, kk, la in zip(rows.tolist(), before.tolist(), drafts.tolist(), las.tolist()):
        req = running[i]
        req.num_computed_tokens = ci
        if allocate(req, 1 + kk + la, num_draft_tokens=kk + la) is None:
            raise AssertionError("a drafting window's allocation failed: check plan_spec_window")


def replay_trims(sched: Scheduler, win: SpecWindow, j: int) -> None:
    """Step j's trims of rejected drafts' blocks (update_from_output's _release_rejected), in running order."""
    rows, kept = win.trims[j]
    if not len(rows):
        return
    running = sched.running
    kv = sched.kv
    if not kv.enable_caching and kv._one_table:
        # Scheduler._release_rejected's KVCacheManager.trim on one table with nothing registered: each row's
        # blocks past its kept tokens off its table, freed last first, the counts the executor is told of.
        # One free_blocks call over the rows' blocks in running order queues them as the per-row calls would.
        # Computed counts and fast-decode limits are left to settle (it sets them for every touched row).
        held = kv.req_to_blocks
        bs = kv.block_size
        dropped = sched._dropped
        freed: list = []
        for i, ci in zip(rows.tolist(), kept.tolist()):
            rid = running[i].request_id
            blocks = held[rid]
            keep = -(-ci // bs)
            x = len(blocks) - keep
            if x > 0:
                gone = blocks[keep:]
                del blocks[keep:]
                gone.reverse()
                freed += gone
                dropped[rid] = dropped.get(rid, 0) + x
        if freed:
            kv.pool.free_blocks(freed)
        return
    release = sched._release_rejected
    for i, ci in zip(rows.tolist(), kept.tolist()):
        req = running[i]
        req.num_computed_tokens = ci
        release(req)


def settle(sched: Scheduler, win: SpecWindow, m: int, counts_only: bool = False) -> None:
    """After m steps (append_tokens' and the replays' calls made): the decodes' computed tokens and
    fast-decode limits, and the scheduler's acceptance statistics (SpecDecodeStats.observe for the
    steps' verifications, summed). counts_only: the statistics alone (the requests are held as counts,
    sim/spec_lazy.py, which sets the rest when it brings them up to date)."""
    running = sched.running
    kv = sched.kv
    accepted = win.accepted[:m]
    drafts = win.drafts[:m]
    acc_sum, kk_sum = _step_sums(win, m)
    # The requests whose blocks the replays changed (and whose computed tokens they set): the rest were
    # set by append_tokens, and a step leaves them where it finds them.
    touched = [r for j in range(m) for r in (win.allocs[j][0], win.trims[j][0]) if len(r)] if not counts_only else ()
    if touched:
        rows = np.unique(np.concatenate(touched)).tolist() if len(touched) > 1 else touched[0].tolist()
        if kv.enable_caching:
            for i in rows:
                req = running[i]
                req.num_computed_tokens = len(req.all_token_ids) - 1
                req.fast_decode_limit = fast_decode_limit(kv, req.request_id)
        else:
            held = kv.req_to_blocks
            bs = kv.block_size
            for req in map(running.__getitem__, rows):
                req.num_computed_tokens = len(req.all_token_ids) - 1
                req.fast_decode_limit = len(held[req.request_id]) * bs  # fast_decode_limit without a cache
    stats = sched.spec_stats
    stats.num_drafts += sum(int((d > 0).sum()) for d in drafts)  # rows that verified drafts
    stats.num_draft_tokens += int(kk_sum.sum())
    stats.num_accepted_tokens += int(acc_sum.sum())
    per_pos = stats.accepted_per_pos
    top = max(int(d.max()) for d in drafts)
    if len(per_pos) < top:
        per_pos.extend([0] * (top - len(per_pos)))
    for p in range(top):
        per_pos[p] += sum(int((a > p).sum()) for a in accepted)
    last, last_kk = accepted[-1], drafts[-1]
    sched.step_num_spec_reqs = int((last_kk > 0).sum())
    sched.step_num_draft_tokens = int(last_kk.sum())
    sched.step_num_accepted_tokens = int(last.sum())


def finish(sched: Scheduler, win: SpecWindow, m: int, now: float, lazy: Any = None) -> list[str]:
    """End the decodes at their length limit after m steps (only after the planned last step), in running
    order, as update_from_output ends and frees them; their ids. lazy: the replica's LazyDrafts (each
    brought up to date first)."""
    if m != len(win.ends) or win.finishing is None:
        return []
    if lazy is not None:
        return lazy.finish(win.finishing.tolist(), now)
    running = sched.running
    return _finish_by_length(sched, [running[i] for i in win.finishing.tolist()], now)


__all__: list[Any] = ["MAX_SPEC_WINDOW", "SPEC_FIRST_DRAW", "SpecWindow", "append_tokens", "apply_spec_window",
                      "extend_spec_window", "finish", "plan_spec_window", "replay_allocations", "replay_trims",
                      "settle", "spec_window_applies", "SPEC_WINDOW_MIN_BATCH", "wide_enough"]
