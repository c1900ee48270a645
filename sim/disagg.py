"""Disaggregated prefill and decode: a prefill pool and a decode pool, KV moved over a link.

A prefill replica computes the prompt and first token; the KV crosses the link (latency + bytes /
bandwidth) to the least loaded decode replica, where it is a prefill that holds blocks and budget
but costs no time. TTFT comes from the prefill replica (first_token "prefill", the default) or from
the decode replica's first step for the request ("decode": the serving front ends stream the client's
tokens from the decode worker, so the KV transfer and that step count into TTFT); later tokens come
from the decode replica.
"""

from __future__ import annotations

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
        if self.minus != (0, 0, 0, 0.0):  # only inside execute(), which steps: never a window
            raise RuntimeError("a decode window priced while a step's transferred prefill is "
                               "discounted")
        return self.inner.decode_step_times(num_seqs, context, max_steps, start, deadline)

    def step_time(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int) -> float:
        """The inner step time without the transferred tokens' prefill work."""
        a, b, c, d = self.minus
        return self.inner.step_time(pt - a, ps - b, pc - c, pa - d, ds, dc)


class DecodeExecutor(SimExecutor):
    """A SimExecutor whose requests may arrive with their prompt's KV already computed."""

    def __init__(self, cost_model: CostModel, window: int | None = None) -> None:
        super().__init__(_Discounted(cost_model), window)
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

    def execute(self, so: SchedulerOutput, decodes: tuple[int, int] | None = None) -> ModelRunnerOutput:
        """Price the step as SimExecutor does, minus the transferred tokens' prefill (decodes: as
        SimExecutor.execute's; plain decodes carry no transferred tokens)."""
        tr = self.transferred
        a = b = c = 0
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
        self.cost_model.minus = (a, b, c, d)
        w = self.totals
        out = super().execute(so, decodes)
        self.cost_model.minus = (0, 0, 0, 0.0)
        # Keep MFU/MBU honest: the transferred prefill was not computed here.
        w.num_prefill_tokens -= a
        w.num_prefill_seqs -= b
        w.prefill_context -= c
        w.prefill_attn -= d
        if w.window and (a or c):  # and the sliding layers' reads it priced (the caps are not linear)
            pt, ps, pc, _, ds, dc = self.last_features
            w.window_read -= w.window_tokens(pc, ps, pt, dc, ds) - w.window_tokens(pc - c, ps - b, pt - a, dc, ds)
        return out

    def beyond_fit(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int) -> bool:
        """Whether the step it prices (without the transferred prefill) passes the fitted shapes."""
        a, b, c, d = self.cost_model.minus
        return super().beyond_fit(pt - a, ps - b, pc - c, pa - d, ds, dc)


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
                 decode_router: str = "least_outstanding", **kw) -> None:
        if decode_router not in ("least_outstanding", "round_robin"):
            raise ValueError(f"decode_router {decode_router!r}: 'least_outstanding' or 'round_robin'")
        super().__init__(replicas, workload, router, **kw)
        if first_token not in ("prefill", "decode"):
            raise ValueError(f"first_token {first_token!r}: 'prefill' or 'decode'")
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

    def transfer_seconds(self, num_tokens: int) -> float:
        """Time to move num_tokens tokens' KV from a prefill to a decode replica."""
        return self.link_latency_s + num_tokens * self.kv_bytes_per_token / self.link_bandwidth

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
        self._record(rep, RequestRecord(
            rid, item.arrival_time, item.num_prompt_tokens, 1 + len(req.output_token_ids),
            half.first_scheduled_time, first, req.finish_time, half.prefix_hit_tokens,
            half.num_preemptions + req.num_preemptions,
            (([first] if first is not None else []) + req.token_times) if self.keep_token_times else [],
            item.conversation,
            item.turn, req.finish_reason.value if req.finish_reason is not None else "", "",
            rep.index, item.client, item.warmup))
        self._request_done(item, req)
