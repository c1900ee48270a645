"""A batch of plain decodes kept as counts: windows and join steps in O(what changes).

core.sched.fast_forward applies a decode window or a join step's decode half as a pass over every
running request (a token appended to two lists, the computed count, the known length, a block at a
boundary). LazyDecodes keeps the same requests with those fields as they were at a base step and a
step counter for the batch: a step applies to the counter, the batch's context (a sum) and the few
requests that change (those that cross a block boundary take their block, those at their length
limit end); a request's tokens, computed count, fast_decode_limit and known length are brought up
to date (materialized) when it ends, or for all of them (flush) before anything else reads the
batch (a full step, a preemption, the end of the run).

Only for the case fast_forward._apply_uncached handles (no prefix cache, host tier, KV groups,
sliding window or speculation), each request sampling one fixed token per step (the simulated
executor's `tokens`), no per-token times, every running request a plain decode (one token left with
output, no stop token or EOS to sample, short of its length limit). Every figure is the pass's:
the same blocks to the same requests in the same calls (one pool call per window or step, split in
running order), the same KV usage per step, the same finishes (tests/sim/test_lazy_decodes.py,
tests/core/test_lazy_decodes.py).
"""

from __future__ import annotations

import heapq
from operator import itemgetter
from typing import Iterator, Mapping

from twinserve.core.request import Request
from twinserve.core.sched.fast_forward import _finish_by_length
from twinserve.core.sched.scheduler import Scheduler


# A request's record: [base step, running-order ticket, fast_decode_limit at the base, next crossing
# step (-1 once it ended), last step, the request, its block list (KVCacheManager.req_to_blocks' own:
# the list a decoding request holds keeps its identity until it is freed, and freeing or preempting
# a counted request flushes or ends its record first), blocks it holds as a count only (count_blocks)].
_BASE, _TICKET, _LIMIT, _CROSS, _LAST, _REQ, _HELD, _OWED = range(8)
_by_ticket = itemgetter(_TICKET)


class LazyDecodes:
    """One scheduler's running plain decodes as counts (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, known: dict[str, list[int]], tokens: Mapping[str, int],
                 default: int, count_blocks: bool = False) -> None:
        self.sched = scheduler
        self.kv = scheduler.kv
        self.bs = scheduler.kv.block_size
        self.known = known        # the model runner's per-request [known length, prompt length]
        self.tokens = tokens      # request id -> the token it samples each step
        self.default = default
        self.active = False
        self.steps = 0            # decode steps the batch has run (the global index of the next one)
        self.context = 0          # computed tokens of the running requests, summed
        self.info: dict[Request, list] = {}             # request -> its record
        self.crossings: dict[int, list[list]] = {}      # step -> records taking a block on it (checked)
        self.ends: list[tuple[int, int, list]] = []     # (last step, ticket, record): a heap
        self.tickets = 0
        self.num_entered = 0      # times the batch was taken over (each O(running))
        self.num_flushed = 0
        # count_blocks: a crossing takes its block off the pool's free count only (the record's _OWED);
        # the blocks are taken for real at a flush, and given back as a count when the request ends
        # (KVCacheManager.uncounted). Every free count, usage and owed sum is the same; which block ids
        # a request holds is not (for callers that never read them: the simulator).
        self.count_blocks = count_blocks
        self.owed_total = 0       # blocks the counted requests hold as counts
        if count_blocks:
            scheduler.owed_counts = self._owed_sum

    # ------------------------------------------------------------------ taking over, giving back
    def enter(self) -> bool:
        """Take over every running request if each is a plain decode; False (nothing changed) if not."""
        running = self.sched.running
        if not running or not _plain(running[-1]):  # the last joiner is the usual exception: no pass
            return False
        for req in running:
            if not _plain(req):
                return False
        self.active = True
        self.num_entered += 1
        self.info = {}
        self.crossings = {}
        self.ends = []
        self.tickets = 0
        self.context = 0
        for req in running:
            self._add(req)
        heapq.heapify(self.ends)
        return True

    def _add(self, req: Request, push: bool = False) -> None:
        """Count req from this step on (its fields exact now)."""
        g = self.steps
        c = req.num_computed_tokens
        blocks = self.kv.req_to_blocks[req.request_id]
        cross = g + len(blocks) * self.bs - c  # the step computing position held * bs (the first past its blocks)
        last = g + req.stop_check_len - len(req.all_token_ids) - 1  # the step that samples its last token
        t = self.tickets
        self.tickets = t + 1
        rec = [g, t, req.fast_decode_limit, cross, last, req, blocks, 0]
        self.info[req] = rec
        bucket = self.crossings.get(cross)
        if bucket is None:
            self.crossings[cross] = [rec]
        else:
            bucket.append(rec)
        if push:
            heapq.heappush(self.ends, (last, t, rec))
        else:
            self.ends.append((last, t, rec))
        self.context += c

    def add_joined(self, reqs: list[Request], tail: bool = False) -> bool:
        """Count requests that joined the batch this step (after it: their fields exact), in running
        order; False when one is not a plain decode (then the caller flushes). tail=True: count the
        plain ones up to the first that is not and leave it and those after it running uncounted (the
        tail, running[len(self.info):], which join steps schedule request by request); never False."""
        k = 0
        for req in reqs:
            if not _plain(req):
                if not tail:
                    return False
                break
            k += 1
        for req in (reqs if k == len(reqs) else reqs[:k]):
            self._add(req, push=True)
        return True

    def tail(self) -> int:
        """Running requests after the counted ones (a joiner still in its chunk and those after it)."""
        return len(self.sched.running) - len(self.info)

    def _materialize(self, rec: list) -> None:
        d = self.steps - rec[_BASE]
        if d:
            req = rec[_REQ]
            rid = req.request_id
            toks = [self.tokens.get(rid, self.default)] * d
            req.all_token_ids += toks
            req.output_token_ids += toks
            c = req.num_computed_tokens = req.num_computed_tokens + d
            self.known[rid][0] += d
            if c > rec[_LIMIT]:  # as the passes set it past the old limit: the blocks held
                req.fast_decode_limit = (len(rec[_HELD]) + rec[_OWED]) * self.bs
            rec[_BASE] = self.steps
            rec[_LIMIT] = req.fast_decode_limit

    def flush(self) -> None:
        """Bring every running request up to date and stop counting (before anything else reads them)."""
        if not self.active:
            return
        info = self.info
        if self.owed_total:
            pool = self.kv.pool
            queue = pool.free_queue
            for req in self.sched.running:  # the owed blocks taken for real, in running order
                rec = info.get(req)
                if rec is not None and rec[_OWED]:
                    owed = rec[_OWED]
                    queue.num_free += owed
                    rec[_HELD].extend(pool.get_new_blocks(owed))
                    rec[_OWED] = 0
            self.owed_total = 0
        for req in self.sched.running:
            rec = info.get(req)
            if rec is not None:
                self._materialize(rec)
        self.active = False
        self.num_flushed += 1
        self.info = {}
        self.crossings = {}
        self.ends = []

    # ------------------------------------------------------------------ planning
    def plan(self, max_steps: int) -> tuple[int, int]:
        """fast_forward.decode_plan's (steps, context) for the batch held."""
        sched = self.sched
        kv = self.kv
        if (max_steps <= 0 or len(sched.waiting) > 0 or sched.loading or sched.loaded or kv.load_jobs):
            return 0, 0
        running = sched.running
        if not running or len(running) > sched.config.max_num_batched_tokens or len(running) != len(self.info):
            return 0, 0  # (a tail: its next chunk is a join step's, never a window's)
        limit = self.ends[0][0] - self.steps + 1
        if max_steps < limit:
            limit = max_steps
        if limit <= 0:
            return 0, 0
        free = kv.num_free_blocks
        pages = kv.num_groups
        if len(running) * (limit // self.bs + 1) * pages > free and self._blocks_needed(limit) * pages > free:
            lo, hi = 0, limit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._blocks_needed(mid) * pages <= free:
                    lo = mid
                else:
                    hi = mid - 1
            limit = lo
        return limit, (self.context if limit else 0)

    def _blocks_needed(self, k: int) -> int:
        """New blocks the next k steps take (fast_forward._blocks_needed)."""
        g = self.steps
        end = g + k
        bs = self.bs
        total = 0
        crossings = self.crossings
        for x in range(g, end):
            for rec in crossings.get(x, ()):
                if rec[_CROSS] == x:
                    total += 1 + (end - 1 - x) // bs
        return total

    # ------------------------------------------------------------------ steps
    def _advance(self, k: int, new_at: list[int]) -> Iterator[list[list]]:
        """Each of the next k steps' crossers (the records whose next crossing is that step), moved on to
        their next crossing; new_at[j] counts step j's."""
        g = self.steps
        bs = self.bs
        crossings = self.crossings
        for j in range(k):
            bucket = crossings.pop(g + j, None)
            if bucket is None:
                continue
            x = g + j
            nxt = x + bs
            moved = [rec for rec in bucket if rec[_CROSS] == x]  # the rest ended
            if not moved:
                continue
            new_at[j] = len(moved)
            for rec in moved:
                rec[_CROSS] = nxt
            b = crossings.get(nxt)
            if b is None:
                crossings[nxt] = moved
            else:
                b += moved
            yield moved

    def _take(self, k: int) -> tuple[list[int], list[list], list[int] | None]:
        """The block-boundary crossings of the next k steps, each crosser's next one moved on:
        (count per step, the crossers in running order, blocks each takes: None for one each)."""
        new_at = [0] * k
        if self.count_blocks:
            return self._take_counted(k, new_at)
        hits: list[list] = []
        for moved in self._advance(k, new_at):
            hits += moved
        if k <= self.bs or len(hits) <= 1:  # one crossing each at most
            if len(hits) > 1:
                hits.sort(key=_by_ticket)
            return new_at, hits, None
        count: dict[int, int] = {}
        for rec in hits:
            t = rec[_TICKET]
            count[t] = count.get(t, 0) + 1
        order = sorted({rec[_TICKET]: rec for rec in hits}.values(), key=_by_ticket)
        return new_at, order, [count[rec[_TICKET]] for rec in order]

    def _take_counted(self, k: int, new_at: list[int]) -> tuple[list[int], list[list], None]:
        """_take for count_blocks: each crosser owes one more block per crossing (no order, no list)."""
        total = 0
        for moved in self._advance(k, new_at):
            total += len(moved)
            for rec in moved:
                rec[_OWED] += 1
        if total:
            queue = self.kv.pool.free_queue
            if total > queue.num_free:
                raise AssertionError("fast-forward allocation failed: check the plan")
            queue.num_free -= total
            self.owed_total += total
        return new_at, [], None

    def _owed_sum(self, count: int) -> int | None:
        """Scheduler.owed_counts: Scheduler._running_blocks_owed's sum over the first count running
        requests with the blocks held as counts counted as held (None: none is, the tables are exact)."""
        kv = self.kv
        uncounted = kv.uncounted
        if not (self.active and self.owed_total) and not uncounted:
            return None
        sched = self.sched
        running = sched.running
        tables = kv.req_to_blocks
        key = sched.peak_key
        info = self.info if self.active else {}
        total = 0
        for r in (running if count >= len(running) else running[:count]):
            peak = r.peak_blocks if r.peak_owner == key else sched._peak_blocks(r)
            rid = r.request_id
            rec = info.get(r)
            held = len(tables.get(rid, ())) + (rec[_OWED] if rec is not None else uncounted.get(rid, 0))
            if peak > held:
                total += peak - held
        return total

    def _hand_out(self, hits: list[list], counts: list[int] | None) -> int:
        """Give the crossers their new blocks from one pool call, in running order; the total."""
        if not hits:
            return 0
        pool = self.kv.pool
        total = len(hits) if counts is None else sum(counts)
        if total > pool.free_queue.num_free:
            raise AssertionError("fast-forward allocation failed: check the plan")
        new = pool.get_new_blocks(total)
        if counts is None:
            for rec, block in zip(hits, new):
                rec[_HELD].append(block)
        else:
            j = 0
            for rec, need in zip(hits, counts):
                rec[_HELD].extend(new[j:j + need])
                j += need
        return total

    def _ended(self, last: int) -> list[Request]:
        """Pop the requests whose last step is `last` (running order), materialized."""
        ends = self.ends
        done = []
        info = self.info
        while ends and ends[0][0] == last:
            rec = heapq.heappop(ends)[2]
            req = rec[_REQ]
            del info[req]
            self._materialize(rec)
            if rec[_OWED]:  # given back when it is freed (KVCacheManager.free)
                self.kv.uncounted[req.request_id] = rec[_OWED]
                self.owed_total -= rec[_OWED]
                rec[_OWED] = 0
            rec[_CROSS] = -1
            self.context -= req.num_computed_tokens
            done.append(req)
        return done

    def apply(self, end_times: list[float]) -> tuple[list[float], list[str]]:
        """fast_forward.apply_decode_steps for len(end_times) steps (at most plan's count)."""
        k = len(end_times)
        sched = self.sched
        sched.advance_recv(k)  # decode steps count toward the receive poll (Scheduler._received)
        kv = self.kv
        sched.finished_req_ids = set()
        new_at, hits, counts = self._take(k)
        total = sum(new_at) if self.count_blocks else self._hand_out(hits, counts)
        n = len(sched.running)
        self.steps += k
        self.context += n * k
        num_blocks = kv.num_blocks
        free_queue = kv.pool.free_queue
        free = free_queue.num_free + total
        usage = []
        for n_new in new_at:
            free -= n_new
            usage.append(1.0 - free / num_blocks)  # as KVCacheManager.usage
        done = self._ended(self.steps - 1)
        finished = _finish_by_length(sched, done, end_times[-1])
        if finished:
            usage[-1] = 1.0 - free_queue.num_free / num_blocks
        return usage, finished

    def decode_half(self, extra: int = 0) -> tuple[int, list[Request], int] | None:
        """fast_forward.schedule_decode_half for the batch held (the counted requests, running's
        first len(self.info)); None (nothing changed) where it declines (loads, an over-budget batch,
        no room for the step's blocks and `extra` more: the tail's, which take theirs after these)."""
        sched = self.sched
        kv = self.kv
        running = sched.running
        if (sched.loading or sched.loaded or kv.load_jobs or not running
                or len(running) > sched.config.max_num_batched_tokens):
            return None
        g = self.steps
        bucket = self.crossings.get(g)
        free = kv.pool.free_queue.num_free - extra
        if (bucket and len(bucket) > free) or free < 0:
            if (sum(1 for rec in bucket if rec[_CROSS] == g) if bucket else 0) > free:
                return None
        _, hits, counts = self._take(1)
        self._hand_out(hits, counts)
        context = self.context
        n = len(self.info)
        self.steps = g + 1
        self.context += n
        return n, self._ended(g), context


def _plain(req: Request) -> bool:
    """decode_plan's per-request checks: a plain decode with a step left before its length limit."""
    n = len(req.all_token_ids)
    if n - req.num_computed_tokens != 1 or not req.output_token_ids or req.stop_check_len <= n:
        return False
    sp = req.sampling_params
    return not sp.stop_token_ids and (req.eos_token_id is None or sp.ignore_eos)
