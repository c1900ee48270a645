"""A cluster replica's drafting decodes kept as counts between the steps that read them (LazyDrafts).

A disaggregated decode worker of hundreds to thousands of drafting (MTP) requests takes a new request every
one to three steps, each join a one-step drafting window (sim/cluster.py's _spec_join_step), and applying a
window appended every request's accepted tokens to its lists, its computed count, its draft counters and its
executor's known length: a Python pass over the batch a step (spec_window.append_tokens; 35 of 100 CPU s of
a 2,048-client row, docs/validate-speed.md "MTP past 1,024 clients").

LazyDrafts keeps instead, for the first len(reqs) running requests in running order, what the next window's
plan reads (computed tokens, length, length limit, blocks held, acceptance rates: numpy arrays, the window's
own per-step arrays taken over after it is applied) and the tokens and draft counts each has gained and not
yet been given (pending). A request is brought up to date (materialized) when it finishes, and every request
(flush) before anything else reads the batch: a full step (core.step: preemption, a request not plainly
drafting), a plain decode plan, the end of the run. The replays of the windows' KV calls (allocations,
trims) read only the block tables, which stay exact. Windows draw the same acceptances in the same order as
without it (rates_of is asked for each new request in running order, as plan_spec_window's gather does), so a
run is bit for bit the run without it (tests/sim/test_spec_lazy.py).

Only where spec_window's no-cache replays apply (one KV table, no prefix cache, host tier, KV groups or
sliding window), mixed batches, no per-token times, the executor the replica's own.
"""

from __future__ import annotations

from itertools import repeat
from operator import is_
from typing import Any

import numpy as np

from twinserve.backends.sim.executor import DEFAULT_TOKEN, SimExecutor
from twinserve.core.request import Request
from twinserve.core.sched.fast_forward import _finish_by_length
from twinserve.core.sched.scheduler import Scheduler
from twinserve.sim.spec_window import _all_ids, _computed, _outputs, _rid, _spec_ids, _stop_ids, _stop_len



class LazyDrafts:
    """One replica's drafting decodes as counts (see the module docstring)."""

    def __init__(self, sched: Scheduler, ex: SimExecutor) -> None:
        self.sched = sched
        self.ex = ex
        self.reqs: list[Request] = []  # the requests held, the first len(reqs) running requests in order
        self._empty()
        self.num_flushed = 0
        self.num_gathered = 0  # requests read from their objects (joiners, and every request after a flush)

    def _empty(self) -> None:
        z = np.zeros(0, np.int64)
        self.c = z            # computed tokens (each request's true count)
        self.length = z       # len(all_token_ids), true
        self.limit = z        # stop_check_len
        self.h = z            # blocks held (len of its block table)
        self.rates: np.ndarray | None = None  # per-request acceptance rates (with a spread), else None
        self.peak = z         # blocks each holds at its peak (Scheduler._peak_blocks)
        self.gained = z       # tokens sampled, not yet appended
        self.drafted = z      # drafts verified, not yet counted on the request
        self.accepted = z     # drafts accepted, not yet counted

    # ------------------------------------------------------------------ reading the batch
    def gather(self, k: int, spread: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray | None] | None:
        """plan_spec_window's gather of the running batch: (computed, length, limit, blocks held, rates or
        None), from the arrays for the requests held and from the objects for the rest (taken on: the
        joiners since the last plan, or all after a flush); None where a request taken on is not a plain
        drafting decode (k proposals, its first token, nothing to stop it, one token left), and then
        nothing is taken on."""
        sched = self.sched
        running = sched.running
        reqs = self.reqs
        held_n = len(reqs)
        if held_n and (len(running) < held_n or not all(map(is_, running, reqs))):
            self.flush()  # the batch changed under it (a guard: every path that changes it flushes first)
            held_n = 0
        rest = running[held_n:] if held_n else running
        if rest:
            if (any(map(k.__ne__, map(len, map(_spec_ids, rest)))) or any(map(_stop_ids, rest))
                    or not all(map(_outputs, rest))):
                return None
            n = len(rest)
            c = np.fromiter(map(_computed, rest), np.int64, n)
            length = np.fromiter(map(len, map(_all_ids, rest)), np.int64, n)
            if not (length - c == 1).all():
                return None
            limit = np.fromiter(map(_stop_len, rest), np.int64, n)
            tables = self.sched.kv.req_to_blocks
            h = np.fromiter(map(len, map(tables.get, map(_rid, rest), repeat(()))), np.int64, n)
            key = sched.peak_key
            peak_of = sched._peak_blocks
            peak = np.fromiter((r.peak_blocks if r.peak_owner == key else peak_of(r) for r in rest), np.int64, n)
            rates = None
            acc_model = self.ex.spec
            if spread:
                rates = np.empty((n, k))
                for i, req in enumerate(rest):
                    rates[i] = acc_model.rates_of(req.request_id)
            self.num_gathered += n
            if held_n:
                self.c = np.concatenate((self.c, c))
                self.length = np.concatenate((self.length, length))
                self.limit = np.concatenate((self.limit, limit))
                self.h = np.concatenate((self.h, h))
                self.peak = np.concatenate((self.peak, peak))
                if spread:
                    self.rates = np.concatenate((self.rates, rates))
                zeros = np.zeros(n, np.int64)
                self.gained = np.concatenate((self.gained, zeros))
                self.drafted = np.concatenate((self.drafted, zeros))
                self.accepted = np.concatenate((self.accepted, zeros))
                reqs += rest
            else:
                self.c, self.length, self.limit, self.h, self.rates = c, length, limit, h, rates
                self.peak = peak
                self.gained = np.zeros(n, np.int64)
                self.drafted = np.zeros(n, np.int64)
                self.accepted = np.zeros(n, np.int64)
                self.reqs = list(rest)
        return self.c, self.length, self.limit, self.h, self.rates

    # ------------------------------------------------------------------ applying a window
    def advance(self, win: Any, m: int, acc_sum: np.ndarray, kk_sum: np.ndarray) -> None:
        """The window's first m steps applied to the counts (append_tokens' work, kept pending): each request's
        computed tokens, length and blocks as the window's step m left them."""
        if len(self.reqs) != win.n:
            raise AssertionError("a drafting window's batch is not the one held as counts")
        self.c, self.length, self.h = win.after[m - 1]
        self.gained = self.gained + acc_sum + m
        self.drafted = self.drafted + kk_sum
        self.accepted = self.accepted + acc_sum

    def finish(self, rows: list[int], now: float) -> list[str]:
        """End the requests at rows (at their length limit after the window) as spec_window.finish does, each
        brought up to date first; they leave the counts."""
        reqs = self.reqs
        for i in rows:
            self._materialize(i)
        n = len(reqs)
        ids = _finish_by_length(self.sched, [reqs[i] for i in rows], now)
        # The rest stay in running order at the head of the batch (_finish_by_length keeps the order).
        self.reqs = self.sched.running[:n - len(rows)]
        keep = np.ones(n, bool)
        keep[rows] = False
        self.c, self.length, self.limit, self.h = self.c[keep], self.length[keep], self.limit[keep], self.h[keep]
        self.peak = self.peak[keep]
        if self.rates is not None:
            self.rates = self.rates[keep]
        self.gained, self.drafted, self.accepted = self.gained[keep], self.drafted[keep], self.accepted[keep]
        return ids

    def owed(self, count: int) -> int | None:
        """Scheduler._running_blocks_owed for the first count running requests where they are the requests
        held (their peaks less the blocks their tables hold now, read in one pass: a drafting join step's
        admissions come after its replayed allocations); None otherwise."""
        reqs = self.reqs
        running = self.sched.running
        if count != len(reqs) or len(running) < count or (count and running[count - 1] is not reqs[-1]):
            return None
        tables = self.sched.kv.req_to_blocks
        held = np.fromiter(map(len, map(tables.__getitem__, map(_rid, reqs))), np.int64, count)
        return int(np.maximum(self.peak - held, 0).sum())

    # ------------------------------------------------------------------ materializing
    def _materialize(self, i: int) -> None:
        """Request i given its pending tokens and counts (append_tokens' per-request work, summed)."""
        g = int(self.gained[i])
        req = self.reqs[i]
        if g:
            ex = self.ex
            rid = req.request_id
            tok = [ex.tokens.get(rid, DEFAULT_TOKEN)] * g if ex.tokens else [DEFAULT_TOKEN] * g
            req.all_token_ids += tok
            req.output_token_ids += tok
            ex.state[rid][0] += g
            req.num_draft_tokens += int(self.drafted[i])
            req.num_accepted_tokens += int(self.accepted[i])
            self.gained[i] = self.drafted[i] = self.accepted[i] = 0
        req.num_computed_tokens = int(self.c[i])
        req.fast_decode_limit = len(self.sched.kv.req_to_blocks[req.request_id]) * self.sched.kv.block_size

    def flush(self) -> None:
        """Bring every request held up to date and hold none (before anything else reads the batch)."""
        reqs = self.reqs
        if not reqs:
            return
        ex = self.ex
        get = ex.tokens.get
        per = bool(ex.tokens)
        state = ex.state
        tables = self.sched.kv.req_to_blocks
        bs = self.sched.kv.block_size
        same = [[DEFAULT_TOKEN] * g for g in range(int(self.gained.max()) + 1)] if not per else None
        for req, g, kd, a, c in zip(reqs, self.gained.tolist(), self.drafted.tolist(), self.accepted.tolist(),
                                    self.c.tolist()):
            rid = req.request_id
            if g:
                tok = same[g] if same is not None else [get(rid, DEFAULT_TOKEN)] * g
                req.all_token_ids += tok
                req.output_token_ids += tok
                state[rid][0] += g
                req.num_draft_tokens += kd
                req.num_accepted_tokens += a
            req.num_computed_tokens = c
            req.fast_decode_limit = len(tables[rid]) * bs
        self.reqs = []
        self._empty()
        self.num_flushed += 1


__all__ = ["LazyDrafts"]
