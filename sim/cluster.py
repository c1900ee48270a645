"""The SimPy world of a cluster: arrivals are routed to replicas, each replica an engine process.

Each replica is the core's EngineCore with its own SimExecutor, stepped as sim.world drives one
engine; a replica first routes every arrival up to its clock, so one replica admits exactly what
the single-engine simulator does. Fast-forward is lazy: a replica sleeps through a run of decode
steps and, if a request arrives meanwhile, applies only the steps begun before it (same results).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import simpy

from twinserve.backends.sim.executor import DEFAULT_TOKEN, SimExecutor
from twinserve.backends.sim.host_link import HostTierExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import InvalidRequestError
from twinserve.core.request import Request
from twinserve.core.routing import ReplicaLoad, RouteRequest, Router, prefix_keys_needed, token_prefix_keys
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.engine_core import StepStats
from twinserve.core.sched.batch_policy import MixedBatches, PrefillFirst
from twinserve.core.sched.fast_forward import (apply_decode_steps, decode_plan, finish_decode_half,
                                               schedule_decode_half)
from twinserve.core.sched.fast_loop import NO_IDS, chunk, fast_decode_limit
from twinserve.core.sched.lazy_decodes import LazyDecodes
from twinserve.core.request import RequestStatus
from twinserve.core.sched.output import CachedRequestData

from twinserve.sim.kv_offload import store_free_window
from twinserve.sim.spec_lazy import LazyDrafts
from twinserve.sim.spec_window import (SPEC_FIRST_DRAW, SpecWindow, append_tokens, apply_spec_window,
                                       extend_spec_window, finish, plan_spec_window,
                                       replay_allocations, replay_trims, settle, spec_window_applies,
                                       wide_enough)
from twinserve.sim.gc_policy import simulation_gc
from twinserve.sim.workload import WorkItem, Workload
from twinserve.sim.world import INF, RequestRecord, RunResult, StepLog, first_tokens, make_source


class Replica:
    """One engine replica of the cluster: core, executor, step log, load as the router sees it."""

    def __init__(self, index: int, core: EngineCore, executor: SimExecutor, label: str = "",
                 keep_steps: bool = True) -> None:
        self.index = index
        self.core = core
        self.executor = executor
        self.label = label
        self.load = ReplicaLoad(index)
        self.inbox: list[tuple[WorkItem, list[int]]] = []
        self.live: dict[str, Request] = {}
        self.steps: StepLog | None = StepLog() if keep_steps else None
        self.clock = INF          # end of the step in flight; INF while idle
        self.wake: simpy.Event | None = None
        self.process: simpy.Process | None = None
        self.in_window = False    # sleeping through a planned fast-forward window
        self.end_time = 0.0
        self.num_events = 0
        self.num_ff_windows = 0
        self.records: list[RequestRecord] = []
        # The running plain decodes kept as counts (ClusterSimulation._lazy_for); None: not this replica.
        self.lazy: LazyDecodes | None = None
        # The running drafting decodes kept as counts (ClusterSimulation._drafts_for); None: not this replica.
        self.drafts: LazyDrafts | None = None
        # Time-weighted sums (value x step duration) kept even without a step log.
        self.busy_time = 0.0
        self.area_in_system = 0.0
        self.area_kv = 0.0
        self.area_batch = 0.0
        self.area_waiting = 0.0


@dataclass(slots=True)
class ClusterResult:
    """A cluster run: the whole cluster as one RunResult, and one RunResult per replica."""

    total: RunResult
    replicas: list[RunResult]
    labels: list[str]
    routed: list[int]
    busy_time: list[float]
    router: str
    num_spills: int = 0
    extra: dict = field(default_factory=dict)


class ClusterSimulation:
    """N replicas behind a router, driven in simulated time."""

    def __init__(self, replicas: Sequence[Replica], workload: Workload, router: Router,
                 fast_forward: bool = True, prefix_blocks: int | None = None,
                 on_record: Callable[[RequestRecord], None] | None = None,
                 keep_records: bool = True) -> None:
        self.replicas = list(replicas)
        self.workload = workload
        self.router = router
        self.fast_forward = fast_forward
        self.prefix_blocks = prefix_keys_needed(router) if prefix_blocks is None else prefix_blocks
        self.env = simpy.Environment()
        self.source = make_source(workload)
        self.loads = [r.load for r in self.replicas]
        self.on_record = on_record
        self.keep_records = keep_records
        self._params: dict[int, SamplingParams] = {}
        self._multi_turn = workload.cfg.turns > 1
        self._block_size = self.replicas[0].core.config.block_size
        # Steps planned per fast-forward window: an arrival mid-window wastes the rest.
        self.max_window = 256
        self.records: list[RequestRecord] = []  # every replica's, in the order they ended
        # Called with each record; True ends the run there (as Simulation.abort).
        self.abort: Callable[[RequestRecord], bool] | None = None
        self.aborted = False
        # Called with each request at its first token (as Simulation.first_token).
        self.first_token: Callable[[Request], bool] | None = None
        # False: no token_times in records or decode windows (as Simulation.keep_token_times).
        self.keep_token_times = True
        # Join steps (_join_step): a step of plain decodes that admits waiting requests takes the
        # decodes as a one-step window and only the newcomers through schedule/update; the same
        # results as core.step (tests/sim/test_join_steps.py). False: every such step is core.step.
        self.join_steps = True
        # Lazy decodes (core.sched.lazy_decodes): where join steps apply and no token times are kept, a
        # replica's plain decodes are held as counts, so windows and join steps cost what changes, not
        # a pass over the batch; the same results (tests/sim/test_lazy_decodes.py). False: the passes.
        self.lazy_decodes = True
        # With lazy decodes, a crossing's block is a count until a flush needs the tables (LazyDecodes'
        # count_blocks): the same free counts and figures, other block ids (set by runs that read no block
        # id: sim.validate.run_to_window). False: each crossing takes its block (ids as the passes give them).
        self.count_blocks = False
        # Lazy drafts (sim/spec_lazy.py): where drafting join steps and windows apply and no token times are
        # kept, a replica's drafting decodes' tokens are held as counts, so a join step costs its joiners and
        # the batch's draws, not a pass over the batch; the same run (tests/sim/test_spec_lazy.py). False: the
        # passes.
        self.lazy_drafts = True
        # True: _on_loop runs at the top of every replica's scheduler-loop iteration (sim/disagg.py's
        # SGLang pre-allocation); False (the default) keeps the loop free of the call.
        self.loop_hook = False

    # ------------------------------------------------------------------ routing
    def _route_until(self, t: float) -> None:
        for item in self.source.pop_until(t):
            self._route(item)

    def _route(self, item: WorkItem) -> None:
        # In arrival order, so random streams are consumed as in the single-engine simulator.
        tokens = self.workload.prompt_tokens(item)
        self._deliver(self.replicas[self._choose(item, tokens)], item, tokens)

    def _choose(self, item: WorkItem, tokens: list[int]) -> int:
        """The replica the router picks for an arriving request."""
        keys: tuple[int, ...] = ()
        if self.router.needs_prefix_keys:
            keys = token_prefix_keys(tokens, self._block_size, self.prefix_blocks)
        session = str(item.conversation) if item.conversation >= 0 else None
        return self.router.choose(RouteRequest(item.request_id, keys, session,
                                               item.num_prompt_tokens), self.loads)

    def _deliver(self, rep: Replica, item: WorkItem, tokens: list[int]) -> None:
        """Hand a routed request to a replica, waking it or cutting its window short."""
        rep.load.outstanding += 1
        rep.load.routed += 1
        rep.inbox.append((item, tokens))
        self._poke(rep)

    @staticmethod
    def _poke(rep: Replica) -> None:
        """Wake an idle replica, or cut its fast-forward window short: it has work at env.now."""
        wake = rep.wake
        if wake is not None and not wake.triggered:
            wake.succeed()
        elif rep.in_window:
            rep.in_window = False
            rep.process.interrupt()

    def _dispatcher(self):  # a SimPy process: wakes at each arrival of the lazy stream
        env = self.env
        source = self.source
        while True:
            nxt = source.next_time()
            if nxt == INF:
                return
            if nxt > env.now:
                yield env.timeout(nxt - env.now)
            self._route_until(env.now)

    def _on_followup_timer(self, _event: simpy.Event) -> None:
        self._route_until(self.env.now)

    # ------------------------------------------------------------------ requests
    def _admit(self, rep: Replica) -> None:
        core = rep.core
        wl = self.workload
        for item, tokens in rep.inbox:
            n_out = self._max_tokens(rep, item)
            sp = self._params.get(n_out)
            if sp is None:
                sp = self._params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=True)
            # tokens were made for this request (Workload.prompt_tokens), or are a finished prefill
            # request's (sim/disagg.py, nothing reads them there again): its token list, not copied.
            req = Request.owning(item.request_id, tokens, sp, arrival_time=item.arrival_time,
                                 payload=item)
            try:
                core.add_request(req)
            except InvalidRequestError as e:
                rep.load.outstanding -= 1
                self._record(rep, RequestRecord(
                    item.request_id, item.arrival_time, item.num_prompt_tokens, n_out, None,
                    None, None, 0, 0, [], item.conversation, item.turn, "refused", str(e),
                    rep.index, item.client, item.warmup))
                if item.client >= 0:  # refused: a closed-loop client is free again
                    self._next_request(item, self._refused_at(rep, item), None)
                continue
            rep.live[item.request_id] = req
            rep.executor.register(item.request_id, wl.sample_token(item))
        rep.inbox.clear()

    def _on_loop(self, rep: Replica, t: float) -> None:
        """A replica's scheduler loop comes round at t, its arrivals admitted (only when loop_hook)."""

    def _refused_at(self, rep: Replica, item: WorkItem) -> float:
        """When a refused request's client hears of it: on arrival, as a server answers 400."""
        return item.arrival_time

    def _max_tokens(self, rep: Replica, item: WorkItem) -> int:
        """Tokens the request generates on this replica (all of them when colocated)."""
        return item.num_output_tokens

    def _record(self, rep: Replica, rec: RequestRecord) -> None:
        if self.keep_records:
            rep.records.append(rec)
            self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)
        if self.abort is not None and self.abort(rec):
            self.aborted = True

    def _finish(self, rep: Replica, rid: str) -> None:
        req = rep.live.pop(rid)
        item: WorkItem = req.payload
        rep.executor.forget(rid)
        rep.load.outstanding -= 1
        self._record(rep, RequestRecord(
            rid, req.arrival_time, req.num_prompt_tokens, len(req.output_token_ids),
            req.first_scheduled_time, req.first_token_time, req.finish_time,
            max(req.prefix_hit_tokens, 0), req.num_preemptions,
            req.token_times if self.keep_token_times else [], item.conversation, item.turn,
            req.finish_reason.value if req.finish_reason is not None else "", "", rep.index,
            item.client, item.warmup))
        self._request_done(item, req)

    def _request_done(self, item: WorkItem, req: Request) -> None:
        """A request's last token: its follow-up turn, or a closed-loop client's next request."""
        nxt = None
        if self._multi_turn and req.finish_time is not None:
            nxt = self.workload.next_turn(item, req.all_token_ids, req.finish_time)
        if nxt is not None or item.client >= 0:
            done = req.finish_time if req.finish_time is not None else self.env.now
            self._next_request(item, done, nxt)

    def _next_request(self, item: WorkItem, t: float, followup: WorkItem | None) -> None:
        """Queue what follows item (ended at t) and route it when it arrives."""
        nxt = self.source.on_done(item, t, followup)
        if nxt is not None:
            timer = self.env.timeout(max(0.0, nxt.arrival_time - self.env.now))
            timer.callbacks.append(self._on_followup_timer)

    def _first_tokens(self, rep: Replica, outputs: list, hook: Callable[[Request], bool]) -> bool:
        """Report the step's first tokens to hook (sim.world.first_tokens); True: stop the run."""
        return first_tokens(rep.live, outputs, hook)

    # ------------------------------------------------------------------ engine loops
    def _engine(self, rep: Replica):  # a SimPy process per replica
        env = self.env
        core = rep.core
        sched = core.scheduler
        # The host tier's copies are priced from each step's start (None: no tier).
        tier = core.executor if isinstance(core.executor, HostTierExecutor) else None
        first_token = self.first_token
        rep.lazy = lazy = self._lazy_for(rep)
        rep.drafts = drafts = self._drafts_for(rep)
        t = 0.0
        while True:
            self._route_until(t)
            if rep.inbox:
                self._admit(rep)
            if self.loop_hook:
                self._on_loop(rep, t)
            if not sched.has_unfinished_requests():
                rep.clock = INF
                rep.wake = env.event()
                rep.num_events += 1
                yield rep.wake
                rep.wake = None
                if env.now > t:
                    rep.executor.idle(env.now - t)
                    t = env.now
                continue
            plan = self._plan_window(rep, t) if self.fast_forward and not rep.executor.waking else None
            if plan is not None:
                ends = plan.ends if type(plan) is SpecWindow else plan[3]
                rep.in_window = True
                try:
                    yield env.timeout(ends[-1] - env.now)
                    # A drafting window is drawn a few steps at a time (an arrival cuts most short: the
                    # steps drawn past it would be wasted), doubling while none comes.
                    while type(plan) is SpecWindow and extend_spec_window(rep.executor, plan, len(ends)):
                        yield env.timeout(ends[-1] - env.now)
                    m = len(ends)
                except simpy.Interrupt:
                    # A request arrived at env.now: the steps that started before it ran.
                    x = env.now
                    m = 0 if x <= t else 1 + min(bisect.bisect_left(ends, x), len(ends) - 1)
                rep.in_window = False
                if m == 0:
                    continue
                finished = self._apply_window(rep, t, plan, m)
                t = ends[m - 1]
            else:
                in_system = len(sched.running) + sched.num_waiting
                if tier is not None:
                    tier.now = t
                joined = (self._join_step(rep, t) if self.join_steps and self.fast_forward and tier is None
                          and (len(sched.waiting) > 0 or (lazy.active and lazy.tail() if lazy is not None
                                                          else _in_chunk(sched.running)))
                          and not rep.executor.waking else None)
                if joined is not None:
                    outputs, stats, finished = joined
                else:
                    if lazy is not None:
                        lazy.flush()  # core.step reads every running request
                    if drafts is not None:
                        drafts.flush()
                    outputs, stats = core.step(t)
                    finished = [out.req_id for out in outputs if out.finish_reason is not None]
                assert stats is not None
                d = stats.duration
                rep.load.kv_usage = stats.kv_usage
                rep.busy_time += d
                rep.area_in_system += in_system * d
                rep.area_kv += stats.kv_usage * d
                rep.area_batch += stats.num_scheduled_reqs * d
                rep.area_waiting += stats.num_waiting * d
                log = rep.steps
                if log is not None:
                    log.start.append(t)
                    log.duration.append(d)
                    log.in_system.append(in_system)
                    log.running.append(stats.num_running)
                    log.waiting.append(stats.num_waiting)
                    log.tokens.append(stats.num_scheduled_tokens)
                    log.seqs.append(stats.num_scheduled_reqs)
                    log.kv_usage.append(stats.kv_usage)
                    log.preempted.append(stats.num_preempted)
                t = t + d
                rep.end_time = t
                if first_token is not None and self._first_tokens(rep, outputs, first_token):
                    self.aborted = True
            rep.clock = t
            rep.num_events += 1
            if t > env.now:
                yield env.timeout(t - env.now)
            # Finishes reach the router (and start follow-up turns) when the step ends.
            for rid in finished:
                self._finish(rep, rid)

    def _join_step(self, rep: Replica, t: float) -> tuple[list, StepStats, list[str]] | None:
        """core.step(t) when every running request decodes and requests wait to join: the decodes'
        half is applied as a one-step window (O(1) Python work each, no outputs), the joiners go
        through schedule (Scheduler._admit, after the decodes as in schedule_batch) and
        update_from_output, and the step is priced from both halves in one execute call.

        Same KV hand-out order, token counts, finishes (decodes, then joiners, freed in that order),
        executor totals and step record as core.step; None (nothing done) where it does not apply:
        a batch policy other than mixed, a prefix cache with lazy decodes or prefill-first (with one,
        only schedule_decode_half's pass, which registers the blocks the decodes fill as
        allocate_slots does), host tier or KV groups, speculation, a request not plainly decoding,
        or no room for the decodes' blocks. A joiner's prefix hits are Scheduler._admit's own.
        Returns (outputs of the joiners and of requests failed while admitting, the step's stats,
        the ids finished in core.step's order)."""
        core = rep.core
        sched = core.scheduler
        ex = rep.executor
        kv = sched.kv
        policy = type(sched.batch_policy)
        if sched.spec is not None and sched.spec.active(len(sched.running)):
            return self._spec_join_step(rep, t)
        if rep.drafts is not None:
            rep.drafts.flush()  # the plain join step reads every running request
        if ((policy is not MixedBatches and policy is not PrefillFirst)
                or (kv.enable_caching and (rep.lazy is not None or policy is not MixedBatches))
                or kv.host is not None or kv.num_groups > 1 or kv.sliding_window is not None
                or sched.spec is not None or ex.spec is not None or ex.draft is not None
                or core.executor is not ex or sched._stalled or sched.failed_outputs):
            return None
        lazy = rep.lazy
        admit = policy is MixedBatches
        tail: list = []
        polled = None
        if lazy is not None and (lazy.active or lazy.enter()):
            if not admit:
                # SGLang's prefill-first step: the waiting requests that fit prefill alone (the
                # decodes wait); if none fits, the step decodes the whole batch (below, admitting none).
                # It reads only the requests schedule() would (Scheduler.hide_unread: the receive poll,
                # advanced once for this step; undone below if the step is left to core.step).
                polled = sched.poll_state()
                hidden = sched.hide_unread()
                joined = self._prefill_only_step(rep, t, lazy)
                sched.show_unread(hidden)
                if joined is not None:
                    sched.note_step(core.last_scheduler_output)
                    return joined
            extra = 0
            if lazy.tail():  # joiners still in their chunk (mixed only): scheduled one by one below
                tail = _tail_plan(sched, len(lazy.info))
                if tail is None:
                    return None
                extra = sum(need for _, _, need, _ in tail)
            half = lazy.decode_half(extra)  # the batch held as counts: the crossers and the ending only
            if half is None and polled is not None:
                sched.poll_restore(polled)  # core.step's schedule() polls instead
        elif not admit:
            return None  # prefill-first without lazy decodes: core.step
        else:
            lazy = None
            running = sched.running
            count = len(running)
            extra = 0
            last = running[-1] if running else None
            if last is not None and (len(last.all_token_ids) - last.num_computed_tokens != 1
                                     or not last.output_token_ids):
                # A joiner still in its chunk after the decodes: scheduled after them (as lazy's tail).
                tail = _tail_plan(sched, count - 1) if count > 1 else None
                if tail is None:
                    return None
                count -= 1
                extra = sum(need for _, _, need, _ in tail)
            # decode_plan's checks, waiting aside; the executor's known lengths advanced in the same pass.
            half = schedule_decode_half(sched, ex.tokens.get, DEFAULT_TOKEN, ex.state, count, extra)
        if half is None:
            return None
        n, done, context = half
        cfg = sched.config
        decodes = sched.running[:n] if self.keep_token_times else ()
        num_scheduled: dict[str, int] = {}
        new_reqs: list = []
        budget = cfg.max_num_batched_tokens - n
        cached = CachedRequestData([], [], [])
        if tail:
            budget -= _schedule_tail(sched, tail, cached, num_scheduled)
        if admit:
            # The requests the step can read, as schedule() does (Scheduler.hide_unread: TensorRT-LLM's overlap
            # loop, SGLang's receive poll); the poll's weight is the step's, set below (note_step).
            hidden = sched.hide_unread()
            budget = sched._admit(t, budget, num_scheduled, new_reqs, 0)
            sched.show_unread(hidden)
        joiners = sched.running[n:] if lazy is not None else ()
        if sched._stalled:
            sched._fail_stalled(t)
        so = sched.emit_step(new_reqs, cached, num_scheduled, cfg.max_num_batched_tokens - budget, [], {})
        sched.note_step(so, n)  # the poll's weight: the n decodes are not in so's per-request counts
        mro = ex.execute(so, (n, context))
        d = mro.step_time or 0.0
        end = t + d
        done = finish_decode_half(sched, decodes, done, end, self.keep_token_times)
        num_failed = len(sched.failed_outputs)
        outputs = sched.update_from_output(so, mro, end)
        if lazy is not None and not lazy.add_joined([r for r in joiners if r.status is RequestStatus.RUNNING],
                                                    tail=admit):
            lazy.flush()  # a joiner still in its chunk (prefill_first): the next step is core.step's
        return outputs, *_close_join_step(core, so, outputs, num_failed, done, t, d, n, len(new_reqs),
                                          len(num_scheduled))

    def _spec_join_step(self, rep: Replica, t: float) -> tuple[list, StepStats, list[str]] | None:
        """_join_step for a drafting batch (mixed batches only): the running requests' verify rows as a
        one-step drafting window (sim/spec_window.py: acceptances drawn for the batch at once, KV calls
        replayed in schedule_batch's order), the joiners admitted after them (Scheduler._admit, with the
        drafts' lookahead) and run through update_from_output, the step priced from both in one execute
        call. Decodes' finishes, then the joiners', in core.step's order. None (nothing done) where it does
        not apply: another batch policy, a host tier or KV groups, drafts switched off by batch size, a
        request not plainly drafting (a joiner still in its chunk), or no room for the decodes' blocks."""
        core = rep.core
        sched = core.scheduler
        ex = rep.executor
        kv = sched.kv
        if (type(sched.batch_policy) is not MixedBatches or kv.host is not None or kv.num_groups > 1
                or kv.sliding_window is not None or core.executor is not ex or sched._stalled
                or sched.failed_outputs or sched.spec.disable_by_batch_size > 0 or not wide_enough(sched)):
            return None
        drafts = rep.drafts
        win = plan_spec_window(sched, ex, 1, t, INF, joining=True, lazy=drafts)
        if win is None:
            return None
        n, k = win.n, win.k
        running = sched.running
        # schedule_batch's drafting loop: each decode's blocks (the calls that are not no-ops), then its
        # 1 + k tokens scheduled (held as counts: nothing reads the decodes' counts before they are set).
        replay_allocations(sched, win, 0)
        if drafts is None:
            for i, kk in enumerate(win.drafts[0].tolist()):
                running[i].num_computed_tokens += 1 + kk
        num_tokens = win.tokens(1)[0]
        cfg = sched.config
        num_scheduled: dict[str, int] = {}
        new_reqs: list = []
        budget = cfg.max_num_batched_tokens - num_tokens
        hidden = sched.hide_unread()
        if drafts is not None:
            sched.owed_counts = drafts.owed  # guaranteed_no_evict's sum over the decodes, from the counts
        try:
            budget = sched._admit(t, budget, num_scheduled, new_reqs, sched.lookahead)
        finally:
            sched.owed_counts = None
        sched.show_unread(hidden)
        if sched._stalled:
            sched._fail_stalled(t)
        so = sched.emit_step(new_reqs, CachedRequestData([], [], []), num_scheduled,
                             cfg.max_num_batched_tokens - budget, [], {})
        sched.note_step(so, num_tokens)  # the decodes' tokens are not in so's per-request counts
        mro = ex.execute(so, spec_rows=win.parts[0])
        d = mro.step_time or 0.0
        end = t + d
        if drafts is not None:
            drafts.advance(win, 1, win.accepted[0], win.drafts[0])
        else:
            append_tokens(sched, ex, win, 1, self.keep_token_times, [end])
        replay_trims(sched, win, 0)
        settle(sched, win, 1, drafts is not None)
        win.ends = [end]  # finish() reads the planned last step: this one
        done = finish(sched, win, 1, end, drafts)
        num_failed = len(sched.failed_outputs)
        outputs = sched.update_from_output(so, mro, end)
        return outputs, *_close_join_step(core, so, outputs, num_failed, done, t, d, n, len(new_reqs),
                                          len(num_scheduled))

    def _prefill_only_step(self, rep: Replica, t: float, lazy: LazyDecodes
                           ) -> tuple[list, StepStats, list[str]] | None:
        """core.step(t) under prefill_first (core.sched.batch_policy.PrefillFirst) with the running
        requests held as lazy decodes: no running prompt, so the step admits waiting requests into
        the whole budget (max_prefill_tokens capping joiners) and runs them alone, the decodes
        untouched; None (nothing changed: an admission that fails changes nothing) when none fits,
        and then the step decodes the batch."""
        core = rep.core
        sched = core.scheduler
        kv = sched.kv
        cfg = sched.config
        n = len(sched.running)
        num_scheduled: dict[str, int] = {}
        new_reqs: list = []
        budget = sched._admit(t, cfg.max_num_batched_tokens, num_scheduled, new_reqs, 0, cfg.max_prefill_tokens)
        if not num_scheduled:
            return None
        joiners = sched.running[n:]
        if sched._stalled:
            sched._fail_stalled(t)
        so = sched.emit_step(new_reqs, CachedRequestData([], [], []), num_scheduled,
                             cfg.max_num_batched_tokens - budget, [], {})
        mro = rep.executor.execute(so)
        d = mro.step_time or 0.0
        outputs = sched.update_from_output(so, mro, t + d)
        if not lazy.add_joined([r for r in joiners if r.status is RequestStatus.RUNNING]):
            lazy.flush()  # a joiner still in its chunk: the next step is core.step's
        core.last_scheduler_output = so
        stats = StepStats(core.num_steps, t, d, sched.num_running, sched.num_waiting, len(new_reqs),
                          len(num_scheduled), so.total_num_scheduled_tokens, kv.usage, kv.stats.queries,
                          kv.stats.hits, 0, len(sched.finished_req_ids))
        core.num_steps += 1
        return outputs, stats, [out.req_id for out in outputs if out.finish_reason is not None]

    def _plan_window(self, rep: Replica, t: float
                     ) -> tuple[int, int, list[float], list[float]] | SpecWindow | None:
        """The next run of identical decode steps (batch size, context, durations, ends), not applied
        (the batch is sched.running's until then: the replica sleeps through the window); a drafting
        batch's: its SpecWindow (sim/spec_window.py)."""
        sched = rep.core.scheduler
        if spec_window_applies(sched, rep.executor):
            if rep.core.executor is not rep.executor or not wide_enough(sched):
                return None  # a wrapped executor (host tier) or a narrow batch steps
            return plan_spec_window(sched, rep.executor, self.max_window, t, INF, first=SPEC_FIRST_DRAW,
                                    lazy=rep.drafts)
        if rep.drafts is not None:
            rep.drafts.flush()  # a plain decode plan reads every running request
        lazy = rep.lazy
        if lazy is not None and (lazy.active or (len(sched.waiting) == 0 and lazy.enter())):
            k, context = lazy.plan(self.max_window)
        else:
            k, context = decode_plan(sched, self.max_window)
        if k > 0 and sched.kv.host is not None:
            k = store_free_window(sched, k)
        if k <= 0:
            return None
        n = len(sched.running)
        durations, ends = rep.executor.decode_step_times(n, context, k, t, INF)
        return n, context, durations, ends

    def _apply_window(self, rep: Replica, t: float,
                      plan: tuple[int, int, list[float], list[float]], m: int) -> list[str]:
        """Apply the first m steps of a planned window; returns the requests that finished."""
        if type(plan) is SpecWindow:
            return self._apply_spec_window(rep, t, plan, m)
        n, context, durations, ends = plan
        durations, ends = durations[:m], ends[:m]
        sched = rep.core.scheduler
        ex = rep.executor
        dropped = sched.finished_req_ids
        if len(sched.running) != n:
            raise AssertionError("a decode window's batch changed between its plan and its steps")
        lazy = rep.lazy
        if lazy is not None and lazy.active:
            usage, finished = lazy.apply(ends)
        else:
            # The executor's known lengths advanced in apply's pass (not one of advance_decode's own).
            usage, finished = apply_decode_steps(sched, ends, repeat=ex.tokens, default=DEFAULT_TOKEN,
                                                 times=self.keep_token_times, known=ex.state)
        ex.advance_decode(None, context, durations, dropped, num=n)
        rep.core.num_steps += m
        busy = 0.0
        kv_area = 0.0
        for d, u in zip(durations, usage):
            busy += d
            kv_area += u * d
        rep.busy_time += busy
        rep.area_in_system += n * busy
        rep.area_batch += n * busy
        rep.area_kv += kv_area
        rep.load.kv_usage = usage[-1]
        if rep.steps is not None:
            rep.steps.add_decode_window(t, ends, durations, n, len(finished), usage)
        rep.num_ff_windows += 1
        rep.end_time = ends[-1]
        return finished

    def _apply_spec_window(self, rep: Replica, t: float, plan: SpecWindow, m: int) -> list[str]:
        """_apply_window for a drafting batch's window."""
        sched = rep.core.scheduler
        n = plan.n
        finished = apply_spec_window(sched, rep.executor, plan, m, self.keep_token_times, rep.drafts)
        durations, ends = plan.durations[:m], plan.ends[:m]
        rep.core.num_steps += m
        busy = 0.0
        for d in durations:
            busy += d
        usage = sched.kv.usage  # after the window (the replay's per-step usage is not kept)
        rep.busy_time += busy
        rep.area_in_system += n * busy
        rep.area_batch += n * busy
        rep.area_kv += usage * busy
        rep.load.kv_usage = usage
        if rep.steps is not None:
            log = rep.steps
            first = len(log)
            log.add_decode_window(t, ends, durations, n, len(finished), [usage] * m)
            log.tokens[first:] = plan.tokens(m)
        rep.num_ff_windows += 1
        rep.end_time = ends[-1]
        return finished

    def _lazy_for(self, rep: Replica) -> LazyDecodes | None:
        """The replica's LazyDecodes where its steps allow them (as _join_step's conditions, without
        token times), else None."""
        core = rep.core
        sched = core.scheduler
        ex = rep.executor
        kv = sched.kv
        if (not (self.lazy_decodes and self.join_steps and self.fast_forward) or self.keep_token_times
                or type(sched.batch_policy) not in (MixedBatches, PrefillFirst) or kv.enable_caching
                or kv.host is not None
                or kv.num_groups > 1 or kv.sliding_window is not None or sched.spec is not None
                or ex.spec is not None or ex.draft is not None or core.executor is not ex):
            return None
        return LazyDecodes(sched, ex.state, ex.tokens, DEFAULT_TOKEN, count_blocks=self.count_blocks)

    def _drafts_for(self, rep: Replica) -> LazyDrafts | None:
        """The replica's LazyDrafts where its drafting steps allow them (_spec_join_step's conditions and
        spec_window's no-cache replays: one KV table, no prefix cache; no token times), else None."""
        core = rep.core
        sched = core.scheduler
        ex = rep.executor
        kv = sched.kv
        if (not (self.lazy_drafts and self.join_steps and self.fast_forward) or self.keep_token_times
                or sched.spec is None or ex.spec is None or type(sched.batch_policy) is not MixedBatches
                or kv.enable_caching or not kv._one_table or kv.host is not None or kv.num_groups > 1
                or kv.sliding_window is not None or core.executor is not ex):
            return None
        return LazyDrafts(sched, ex)

    # ------------------------------------------------------------------ run
    def _replica_result(self, rep: Replica, wall: float) -> RunResult:
        sched = rep.core.scheduler
        stats = sched.kv.stats
        return RunResult(rep.records, rep.steps if rep.steps is not None else StepLog(),
                         rep.end_time, wall, rep.core.num_steps, rep.num_events,
                         rep.num_ff_windows, sched.num_preemptions, stats.queries, stats.hits,
                         rep.core.config.num_blocks)

    def run(self) -> ClusterResult:
        """Run until every request has finished on every replica."""
        wall = time.perf_counter()
        env = self.env
        env.process(self._dispatcher())
        for rep in self.replicas:
            rep.process = env.process(self._engine(rep))
        with simulation_gc():
            if self.abort is None and self.first_token is None:
                env.run()
            else:
                step = env.step
                try:
                    while not self.aborted:
                        step()
                except simpy.core.EmptySchedule:
                    pass
        for rep in self.replicas:
            if rep.lazy is not None:
                rep.lazy.flush()  # the requests still running, up to date for whoever reads them
            if rep.drafts is not None:
                rep.drafts.flush()
        wall = time.perf_counter() - wall
        per = [self._replica_result(rep, wall) for rep in self.replicas]
        total = RunResult(self.records, StepLog(), max((r.end_time for r in per), default=0.0), wall,
                          sum(r.num_steps for r in per), sum(r.num_events for r in per),
                          sum(r.num_ff_windows for r in per), sum(r.num_preemptions for r in per),
                          sum(r.prefix_queries for r in per), sum(r.prefix_hits for r in per),
                          sum(r.num_blocks for r in per))
        return ClusterResult(total, per, [r.label for r in self.replicas],
                             [r.load.routed for r in self.replicas],
                             [r.busy_time for r in self.replicas], self.router.name,
                             getattr(self.router, "num_spills", 0))


def _in_chunk(running: list[Request]) -> bool:
    """Whether the last running request is still in its prompt after decodes (a join step's tail:
    _join_step; alone, a prompt's chunk is core.step's: there is no decode half to save)."""
    if len(running) < 2:
        return False
    last = running[-1]
    return len(last.all_token_ids) - last.num_computed_tokens != 1 or not last.output_token_ids


def _tail_plan(sched, n: int) -> list[tuple[Request, int, int, bool]] | None:
    """What Scheduler.schedule_batch gives, speculation off, a running request after the first n (n
    plain decodes, one token each, before it), nothing changed: [(it, tokens this step, new blocks,
    whether allocate_slots is called)]; None where the step is left to core.step: a tail of more
    than one request (a joiner's chunk takes the budget left, so a second one is rarely admitted
    before the first ends its prompt), one token left at a block boundary, a wrong computed count.
    One request after n <= budget - 1 decodes never takes the spare budget below zero: plain_head's
    loop alone (core.sched.fast_loop), never schedule_batch's checked one."""
    running = sched.running
    if len(running) != n + 1:
        return None
    req = running[n]
    kv = sched.kv
    c = req.num_computed_tokens
    num_new = len(req.all_token_ids) - c
    if num_new <= 0 or c < 0:
        return None
    if num_new == 1:
        limit = req.fast_decode_limit
        if c < limit or (c > limit and c < fast_decode_limit(kv, req.request_id)):
            return [(req, 1, 0, False)]  # within its blocks: no allocate_slots call
        return None  # one token at a block boundary (rare): core.step
    cfg = sched.config
    num_new = chunk(num_new, cfg.long_prefill_token_threshold, cfg.max_num_batched_tokens - n)
    need = -(-(c + num_new) // kv.block_size) - len(kv.req_to_blocks[req.request_id])
    return [(req, num_new, need if need > 0 else 0, True)]


def _schedule_tail(sched, plan: list[tuple[Request, int, int, bool]], cached: CachedRequestData,
                   num_scheduled: dict[str, int]) -> int:
    """Schedule _tail_plan's requests as schedule_batch does (after the step's decodes took their
    blocks): their blocks, counts, fast_decode_limit, chunks left partial; the tokens scheduled."""
    kv = sched.kv
    total = 0
    for req, q, _, alloc in plan:
        rid = req.request_id
        c = req.num_computed_tokens
        ids = NO_IDS
        if alloc:
            new_blocks = kv.allocate_slots(req, q)
            if new_blocks is None:
                raise AssertionError("a join step's tail found no blocks: check _tail_plan")
            req.fast_decode_limit = fast_decode_limit(kv, rid)
            ids = sched._table_ids(new_blocks)
        elif c > req.fast_decode_limit:  # plain_head's refresh
            req.fast_decode_limit = fast_decode_limit(kv, rid)
        if c + q < len(req.all_token_ids):
            sched._partial.append(req)
        cached.req_ids.append(rid)
        cached.new_block_ids.append(ids)
        cached.num_computed_tokens.append(c)
        req.num_computed_tokens = c + q
        num_scheduled[rid] = q
        total += q
    return total


def _close_join_step(core: Any, so: Any, outputs: list, num_failed: int, done: list[str], t: float, d: float,
                     n: int, num_new: int, num_scheduled: int) -> tuple[StepStats, list[str]]:
    """The end of a join step (Cluster._join_step, _spec_join_step) as core.step ends one: the step's output
    kept, its stats, the step counted, and the finished requests in core.step's order (the failures
    update_from_output reported first, then the n decodes' finishes `done`, then the rest)."""
    sched = core.scheduler
    kv = sched.kv
    core.last_scheduler_output = so
    stats = StepStats(core.num_steps, t, d, sched.num_running, sched.num_waiting, num_new, n + num_scheduled,
                      so.total_num_scheduled_tokens, kv.usage, kv.stats.queries, kv.stats.hits, 0,
                      len(sched.finished_req_ids))
    core.num_steps += 1
    finished = [out.req_id for out in outputs[:num_failed] if out.finish_reason is not None]
    finished += done
    finished += [out.req_id for out in outputs[num_failed:] if out.finish_reason is not None]
    return stats, finished
