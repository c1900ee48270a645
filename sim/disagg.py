"""Disaggregated prefill and decode: a prefill pool and a decode pool, KV moved over a link.

A prefill replica computes the prompt and first token; the KV crosses the link (latency + bytes /
bandwidth) to the least loaded decode replica, where it is a prefill that holds blocks and budget
but costs no time. TTFT comes from the prefill replica (first_token "prefill", the default), from
the decode replica's first step for the request ("decode": the serving front ends stream the client's
tokens from the decode worker, so the KV transfer and that step count into TTFT), or from the decode
replica's step boundary that admits it ("decode_admit": SGLang streams the transferred token before any
step runs it); later tokens come from the decode replica.

With prealloc_reserve set (SGLang's disaggregation), a request is not prefilled until its decode worker
has pre-allocated KV for it: the decode replica is chosen on arrival, and at each of its scheduler-loop
iterations it takes, first come first served, the queued requests whose prompt plus the reserve fits in
its free KV after the reserve is held for every request it runs, holds in flight or has waiting; only
then does the request reach its prefill replica's queue (the prefill side's bootstrap queue). The head
of the queue that does not fit blocks the ones behind it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from twinserve.backends.sim.cost_model import CostModel
from twinserve.backends.sim.executor import SimExecutor
from twinserve.core.routing import LeastOutstanding, RoundRobin, RouteRequest
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput

from twinserve.sim.cluster import ClusterSimulation, Replica
from twinserve.sim.world import RequestRecord
from twinserve.sim.workload import WorkItem


class _Discounted:
    """A cost model that leaves out the prefill features of transferred KV for one step."""

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "cost")
        self.minus = (0, 0, 0, 0.0)
        self.plus = (0, 0)  # decode rows (count, summed context) the step carries beside its own
        self.skip = 0.0  # the share of attention-DP ranks whose decodes the step's joiners hold back
        # A decode replica wakes from idle as slowly as any engine (the profile's wake cost).
        wake = getattr(inner, "wake_after", None)
        if wake is not None:
            self.wake_after = wake
        self.shape_range = getattr(inner, "shape_range", None) or {}
        # Decode windows (fast forward) price decode-only steps, which carry no transferred
        # prefill: the inner model's own loop gives the same floats without a call a step.
        if getattr(inner, "decode_step_times", None) is not None:
            self.decode_step_times = self._decode_step_times

    def _decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                           deadline: float) -> tuple[list[float], list[float]]:
        if self.minus != (0, 0, 0, 0.0) or self.plus != (0, 0) or self.skip:  # only inside execute(): never a window
            raise RuntimeError("a decode window priced while a step's transferred prefill is "
                               "discounted")
        return self.inner.decode_step_times(num_seqs, context, max_steps, start, deadline)

    # A verify row is priced as the inner model prices it: as 1 + k decode rows where it prices verify rows
    # (aic; a profile fitted on verify steps), else as a (1 + k)-token chunk. Until 2026-12-06 the wrapper hid
    # the inner model's choice, so a decode replica priced every verify row as a chunk, on aic's context graph.
    @property
    def prices_verify(self) -> bool:
        """The inner model's prices_verify (False where it has none)."""
        return bool(getattr(self.inner, "prices_verify", False))

    def verify_time(self, num_spec_reqs: int, num_draft_tokens: int) -> float:
        """The inner model's verify_time: seconds verify rows add beyond their price as decode rows."""
        return self.inner.verify_time(num_spec_reqs, num_draft_tokens)

    def step_time(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int) -> float:
        """The inner step time without the transferred tokens' prefill work (and with the decode rows that
        stand for it)."""
        a, b, c, d = self.minus
        e, f = self.plus
        return self.inner.step_time(pt - a, ps - b, pc - c, pa - d, ds + e, dc + f) * (1.0 + self.skip)


class DecodeExecutor(SimExecutor):
    """A SimExecutor whose requests may arrive with their prompt's KV already computed."""

    def __init__(self, cost_model: CostModel, window: int | None = None, join_as_decode: bool = False,
                 join_ranks: int = 1) -> None:
        super().__init__(_Discounted(cost_model), window)
        # A request scheduled up to one token past its transferred KV: that token is priced as a decode row
        # at the transferred context, not as a one-token prefill ([cluster] disagg_join_row "decode").
        self.join_as_decode = join_as_decode
        # ... and on a worker of join_ranks attention-DP ranks, a rank that takes requests runs no decode of
        # its own in that iteration (SGLang: an idle batch beside the other ranks' decodes): the step's j
        # joiners, placed on min(j, ranks) ranks in turn, hold back that share of the running requests' tokens,
        # priced as the step lasting (1 + min(j, ranks) / ranks) times as long (the same tokens a second).
        self.join_ranks = join_ranks
        self.transferred: dict[str, int] = {}  # request -> prompt tokens whose KV came over
        # Requests that may still have transferred tokens to schedule (computed < transferred): the
        # rest never discount, so a step of decodes need not look at each of them (O(joiners)).
        self.pending: set[str] = set()

    def receive(self, req_id: str, num_tokens: int) -> None:
        """A request arrives with num_tokens tokens' KV already computed."""
        self.transferred[req_id] = num_tokens
        self.pending.add(req_id)

    def forget(self, req_id: str) -> None:
        """Drop what is known about a finished request."""
        super().forget(req_id)
        self.transferred.pop(req_id, None)
        self.pending.discard(req_id)

    def execute(self, so: SchedulerOutput, decodes: tuple[int, int] | None = None,
                spec_rows: tuple | None = None) -> ModelRunnerOutput:
        """Price the step as SimExecutor does, minus the transferred tokens' prefill (decodes, spec_rows: as
        SimExecutor.execute's; plain decodes and drafting decodes carry no transferred tokens)."""
        tr = self.transferred
        a = b = c = e = f = 0
        d = 0.0
        if tr:
            num = so.num_scheduled_tokens
            pending = self.pending
            for rid in so.preempted_req_ids:
                if rid in tr:
                    pending.add(rid)  # recomputed from scratch (a guard: it comes back as a new request)
            new = so.scheduled_new_reqs
            pairs = [(n.req_id, n.num_computed_tokens) for n in new]
            if pending:
                new_ids = {n.req_id for n in new}
                if any(rid in num and rid not in new_ids for rid in pending):
                    # A running request still in its transferred tokens (a chunk): every pair, in order.
                    cached = so.scheduled_cached_reqs
                    pairs += list(zip(cached.req_ids, cached.num_computed_tokens))
            for rid, done in pairs:
                t = tr.get(rid, 0)
                q = num.get(rid, 0)
                if done >= t or q == 0:
                    if done >= t:
                        pending.discard(rid)
                    continue
                if done + q >= t:
                    pending.discard(rid)  # past its transferred tokens after this step
                qt = min(done + q, t) - done  # scheduled tokens whose KV already exists
                a += qt
                c += done
                d += qt * (done + qt * 0.5)
                if qt == q:
                    b += 1
                elif qt + 1 == q and self.join_as_decode:
                    # The one token past the transferred KV runs as a decode row at context t: the row's
                    # whole prefill features come off (SimExecutor.execute added q, 1, done, q (done + q / 2)).
                    a += 1
                    b += 1
                    d += q * (done + q * 0.5) - qt * (done + qt * 0.5)
                    e += 1
                    f += t
        self.cost_model.minus = (a, b, c, d)
        self.cost_model.plus = (e, f)
        r = self.join_ranks
        self.cost_model.skip = min(e, r) / r if e and r > 1 else 0.0
        w = self.totals
        out = super().execute(so, decodes, spec_rows)
        self.cost_model.minus = (0, 0, 0, 0.0)
        self.cost_model.plus = (0, 0)
        self.cost_model.skip = 0.0
        # Keep MFU/MBU honest: the transferred prefill was not computed here.
        w.num_prefill_tokens -= a
        w.num_prefill_seqs -= b
        w.prefill_context -= c
        w.prefill_attn -= d
        w.num_decode_seqs += e  # ... and the decode rows that stand for the tokens past it were
        w.decode_context += f
        if w.window and (a or c):  # and the sliding layers' reads it priced (the caps are not linear)
            pt, ps, pc, _, ds, dc = self.last_features
            w.window_read -= (w.window_tokens(pc, ps, pt, dc, ds)
                              - w.window_tokens(pc - c, ps - b, pt - a, dc + f, ds + e))
        return out

    def beyond_fit(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int) -> bool:
        """Whether the step it prices (without the transferred prefill) passes the fitted shapes."""
        a, b, c, d = self.cost_model.minus
        e, f = self.cost_model.plus
        return super().beyond_fit(pt - a, ps - b, pc - c, pa - d, ds + e, dc + f)


@dataclass(slots=True)
class _PrefillHalf:
    """What the prefill replica measured, kept until the decode half ends."""

    replica: int
    first_scheduled_time: float | None
    first_token_time: float | None
    prefix_hit_tokens: int
    num_preemptions: int


class DisaggregatedSimulation(ClusterSimulation):
    """Prefill replicas [0, num_prefill) and decode replicas [num_prefill, n)."""

    def __init__(self, replicas, workload, router, num_prefill: int, link_bandwidth: float,
                 link_latency_s: float, kv_bytes_per_token: int, first_token: str = "prefill",
                 decode_router: str = "least_outstanding", prealloc_reserve: int | None = None,
                 **kw) -> None:
        if decode_router not in ("least_outstanding", "round_robin"):
            raise ValueError(f"decode_router {decode_router!r}: 'least_outstanding' or 'round_robin'")
        if prealloc_reserve is not None and prealloc_reserve < 0:
            raise ValueError(f"prealloc_reserve {prealloc_reserve}: a token count >= 0, or None")
        super().__init__(replicas, workload, router, **kw)
        if first_token not in ("prefill", "decode", "decode_admit"):
            raise ValueError(f"first_token {first_token!r}: 'prefill', 'decode' or 'decode_admit'")
        self.first_token_from = first_token
        self.num_prefill = num_prefill
        self.loads = [r.load for r in self.replicas[:num_prefill]]
        self.decode_loads = [r.load for r in self.replicas[num_prefill:]]
        self.decode_router = LeastOutstanding() if decode_router == "least_outstanding" else RoundRobin()
        self.link_bandwidth = link_bandwidth
        self.link_latency_s = link_latency_s
        self.kv_bytes_per_token = kv_bytes_per_token
        self._halves: dict[str, _PrefillHalf] = {}
        self.transfer_time = 0.0
        self.num_transfers = 0
        # SGLang's decode-side pre-allocation (None: the decode side takes whatever is transferred).
        # sgl-project/sglang python/sglang/srt/disaggregation/decode.py @278e503
        # (DecodePreallocQueue.pop_preallocated, _allocatable_tokens): at each decode scheduler-loop
        # iteration the queue is walked in order; a request is pre-allocated when its prompt length plus
        # num_reserved_decode_tokens fits in the free KV less num_reserved_decode_tokens for each request
        # running, in the transfer queue or in the waiting queue, else the walk stops (break). The prefill
        # server keeps the request in its bootstrap queue until the decode side has sent the pre-allocated
        # KV indices (prefill.py, PrefillBootstrapQueue). server_args.py: num_reserved_decode_tokens = 512.
        # Left out: the term that also keeps room for one running request's max_new_tokens (it binds only
        # while the running batch holds fewer tokens than one request's full length), the request-slot and
        # metadata-buffer counts, and retraction.
        self.prealloc_reserve = prealloc_reserve
        num_decode = len(self.replicas) - num_prefill
        self._prealloc: list[deque] = [deque() for _ in range(num_decode)]  # (item, tokens, prefill index)
        self._held = [0] * num_decode       # prompt tokens pre-allocated, KV not yet arrived
        self._in_flight = [0] * num_decode  # requests pre-allocated, KV not yet arrived
        self._decode_of: dict[str, int] = {}  # request -> the decode replica that pre-allocated it
        if prealloc_reserve is not None:
            self.loop_hook = True

    def transfer_seconds(self, num_tokens: int) -> float:
        """Time to move num_tokens tokens' KV from a prefill to a decode replica."""
        return self.link_latency_s + num_tokens * self.kv_bytes_per_token / self.link_bandwidth

    def _route(self, item: WorkItem) -> None:
        if self.prealloc_reserve is None:
            super()._route(item)
            return
        # Both workers are chosen on arrival (SGLang's router and Dynamo send the request to a prefill and
        # a decode worker at once); each counts it as outstanding from then.
        tokens = self.workload.prompt_tokens(item)
        p = self._choose(item, tokens)
        d = self.decode_router.choose(RouteRequest(item.request_id), self.decode_loads)
        self.replicas[p].load.outstanding += 1
        rep = self.replicas[d]
        rep.load.outstanding += 1
        q = self._prealloc[d - self.num_prefill]
        q.append((item, tokens, p))
        self._poke(rep)  # its next loop iteration (at once if idle) looks at the queue

    def _on_loop(self, rep: Replica, t: float) -> None:
        k = rep.index - self.num_prefill
        if k < 0:
            return
        q = self._prealloc[k]
        if not q:
            return
        reserve = self.prealloc_reserve
        sched = rep.core.scheduler
        kv = sched.kv
        # Admitted requests not yet scheduled hold no blocks here (SGLang's waiting queue already holds its
        # pre-allocated KV): their prompts count as held.
        waiting = list(sched.waiting)
        free = (kv.num_free_blocks // max(1, kv.num_groups)) * self._block_size - self._held[k] \
            - sum(r.num_prompt_tokens - r.num_computed_tokens for r in waiting)
        queued = len(sched.running) + len(waiting) + self._in_flight[k]
        allocatable = free - reserve * queued
        while q:
            item, tokens, p = q[0]
            need = item.num_prompt_tokens + reserve
            if need > allocatable and queued:  # (an empty replica takes it: the engine refuses what never fits)
                break
            q.popleft()
            allocatable -= need
            queued += 1
            self._held[k] += item.num_prompt_tokens
            self._in_flight[k] += 1
            self._decode_of[item.request_id] = rep.index
            pre = self.replicas[p]
            pre.load.outstanding -= 1  # _deliver counts it again
            self._deliver(pre, item, tokens)

    def _release(self, rid: str, num_prompt_tokens: int) -> int | None:
        """Drop a request's pre-allocation (its KV arrived, or never will): its decode replica, or None."""
        idx = self._decode_of.pop(rid, None)
        if idx is not None:
            k = idx - self.num_prefill
            self._held[k] -= num_prompt_tokens
            self._in_flight[k] -= 1
            self.replicas[idx].load.outstanding -= 1  # counted since arrival
        return idx

    def _record(self, rep: Replica, rec: RequestRecord) -> None:
        if rec.finish_reason == "refused" and rep.index < self.num_prefill:
            self._release(rec.request_id, rec.num_prompt_tokens)
        super()._record(rep, rec)

    def _refused_at(self, rep: Replica, item: WorkItem) -> float:
        # A decode replica refuses after the prefill half ran: the client hears of it then.
        return item.arrival_time if rep.index < self.num_prefill else self.env.now

    def _max_tokens(self, rep: Replica, item: WorkItem) -> int:
        if rep.index < self.num_prefill:
            return 1
        return item.num_output_tokens - 1

    def _first_tokens(self, rep: Replica, outputs: list, hook) -> bool:
        # A decode replica's first token is the request's second: its TTFT came from the prefill half.
        return rep.index < self.num_prefill and super()._first_tokens(rep, outputs, hook)

    def _finish(self, rep: Replica, rid: str) -> None:
        if rep.index >= self.num_prefill:
            self._finish_decode(rep, rid)
            return
        req = rep.live[rid]
        item: WorkItem = req.payload
        if item.num_output_tokens <= 1 or req.finish_time is None:
            self._release(rid, item.num_prompt_tokens)
            super()._finish(rep, rid)  # nothing to decode: the request ends here
            return
        rep.live.pop(rid)
        rep.executor.forget(rid)
        rep.load.outstanding -= 1
        self._halves[rid] = _PrefillHalf(rep.index, req.first_scheduled_time,
                                         req.first_token_time, max(req.prefix_hit_tokens, 0),
                                         req.num_preemptions)
        delay = self.transfer_seconds(req.num_prompt_tokens)
        self.transfer_time += delay
        self.num_transfers += 1
        # The finished prefill request's own list, not a copy: nothing appends to a finished
        # request, and the decode side's Request takes it over (Request.owning). Its pending
        # prefix-cache chain may still read it (PendingChain.token_ids): only its blocks' tokens,
        # which the decode side's appends leave as they are.
        tokens = req.all_token_ids
        arrive = req.finish_time + delay
        timer = self.env.timeout(max(0.0, arrive - self.env.now))
        timer.callbacks.append(lambda _ev: self._to_decode(item, tokens))

    def _to_decode(self, item: WorkItem, tokens: list[int]) -> None:
        idx = self._release(item.request_id, item.num_prompt_tokens)  # it lands in what was pre-allocated
        if idx is None:
            idx = self.decode_router.choose(RouteRequest(item.request_id), self.decode_loads)
        rep = self.replicas[idx]
        rep.executor.receive(item.request_id, len(tokens) - 1)
        self._deliver(rep, item, tokens)

    def _finish_decode(self, rep: Replica, rid: str) -> None:
        req = rep.live.pop(rid)
        item: WorkItem = req.payload
        rep.executor.forget(rid)
        rep.load.outstanding -= 1
        half = self._halves.pop(rid)
        first = half.first_token_time
        if self.first_token_from == "decode" and req.first_token_time is not None:
            # The client's first chunk is the decode replica's first step for the request (it carries
            # the prefill's token with the step's own): TTFT takes the transfer and the wait for that
            # step; the request's token count is unchanged. (The first_token hook still fires on the
            # prefill replica: a lower bound of this TTFT, so a miss it counts is certain.)
            first = req.first_token_time
        elif self.first_token_from == "decode_admit" and req.first_scheduled_time is not None:
            # SGLang: the decode server streams the transferred token at the loop iteration that takes the
            # request (a prebuilt batch, no forward), the step boundary where the replica admits it; its own
            # first step's token is the request's second (sim/config.py disagg_first_token).
            first = req.first_scheduled_time
        self._record(rep, RequestRecord(
            rid, item.arrival_time, item.num_prompt_tokens, 1 + len(req.output_token_ids),
            half.first_scheduled_time, first, req.finish_time, half.prefix_hit_tokens,
            half.num_preemptions + req.num_preemptions,
            (([first] if first is not None else []) + req.token_times) if self.keep_token_times else [],
            item.conversation,
            item.turn, req.finish_reason.value if req.finish_reason is not None else "", "",
            rep.index, item.client, item.warmup))
        self._request_done(item, req)
