"""The SimPy world of a cluster: arrivals are routed to replicas, each replica an engine process.

Each replica is the core's unchanged EngineCore with its own SimExecutor (its own cost
model), driven by a SimPy process exactly as sim.world.Simulation drives one engine: a
step at clock t, then a timeout to t + duration. A dispatcher process wakes at each
arrival and hands the request to the router; follow-up turns get a timer of their own.
A replica about to step first routes every arrival up to its clock, so a one-replica
cluster admits exactly what the single-engine simulator admits (a test compares them).

The router sees each replica's state as of the end of its current step (the scheduler
has already applied it): at most one step ahead, as in the real engine, whose loop
also reports state between steps.

Fast-forward windows of identical decode steps stop before the next arrival anywhere
in the cluster; with multi-turn workloads they also stop before any other replica's
current step ends, because a finish there may create a follow-up turn that the router
could send here. Results are then identical to stepping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import simpy

from twinserve.backends.sim.executor import SimExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import InvalidRequestError
from twinserve.core.request import Request
from twinserve.core.routing import ReplicaLoad, RouteRequest, Router, token_prefix_keys
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched.fast_forward import apply_decode_steps, decode_window

from .world import INF, ArrivalSource, RequestRecord, RunResult, StepLog
from .workload import WorkItem, Workload


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
        self.end_time = 0.0
        self.num_events = 0
        self.num_ff_windows = 0
        self.records: list[RequestRecord] = []
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
                 fast_forward: bool = True, prefix_blocks: int = 4,
                 on_record: Callable[[RequestRecord], None] | None = None,
                 keep_records: bool = True) -> None:
        self.replicas = list(replicas)
        self.workload = workload
        self.router = router
        self.fast_forward = fast_forward
        self.prefix_blocks = prefix_blocks
        self.env = simpy.Environment()
        self.source = ArrivalSource(workload.items())
        self.loads = [r.load for r in self.replicas]
        self.on_record = on_record
        self.keep_records = keep_records
        self._params: dict[int, SamplingParams] = {}
        self._multi_turn = workload.cfg.turns > 1
        self._block_size = self.replicas[0].core.config.block_size
        self.records: list[RequestRecord] = []  # every replica's, in the order they ended

    # ------------------------------------------------------------------ routing
    def _route_until(self, t: float) -> None:
        for item in self.source.pop_until(t):
            self._route(item)

    def _route(self, item: WorkItem) -> None:
        # Token ids are made here, in arrival order, so the workload's random streams are
        # consumed in the order the single-engine simulator consumes them.
        tokens = self.workload.prompt_tokens(item)
        keys: tuple[int, ...] = ()
        if self.router.needs_prefix_keys:
            keys = token_prefix_keys(tokens, self._block_size, self.prefix_blocks)
        session = str(item.conversation) if item.conversation >= 0 else None
        idx = self.router.choose(RouteRequest(item.request_id, keys, session,
                                              item.num_prompt_tokens), self.loads)
        rep = self.replicas[idx]
        rep.load.outstanding += 1
        rep.load.routed += 1
        rep.inbox.append((item, tokens))
        wake = rep.wake
        if wake is not None and not wake.triggered:
            wake.succeed()

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
            n_out = item.num_output_tokens
            sp = self._params.get(n_out)
            if sp is None:
                sp = self._params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=True)
            req = Request(item.request_id, tokens, sp, arrival_time=item.arrival_time,
                          payload=item)
            try:
                core.add_request(req)
            except InvalidRequestError as e:
                rep.load.outstanding -= 1
                self._record(rep, RequestRecord(
                    item.request_id, item.arrival_time, item.num_prompt_tokens, n_out, None,
                    None, None, 0, 0, [], item.conversation, item.turn, "refused", str(e),
                    rep.index))
                continue
            rep.live[item.request_id] = req
            rep.executor.register(item.request_id, wl.sample_token(item))
        rep.inbox.clear()

    def _record(self, rep: Replica, rec: RequestRecord) -> None:
        if self.keep_records:
            rep.records.append(rec)
            self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def _finish(self, rep: Replica, rid: str) -> None:
        req = rep.live.pop(rid)
        item: WorkItem = req.payload
        rep.executor.forget(rid)
        rep.load.outstanding -= 1
        self._record(rep, RequestRecord(
            rid, req.arrival_time, req.num_prompt_tokens, len(req.output_token_ids),
            req.first_scheduled_time, req.first_token_time, req.finish_time,
            max(req.prefix_hit_tokens, 0), req.num_preemptions, req.token_times,
            item.conversation, item.turn,
            req.finish_reason.value if req.finish_reason is not None else "", "", rep.index))
        if self._multi_turn and req.finish_time is not None:
            nxt = self.workload.next_turn(item, req.all_token_ids, req.finish_time)
            if nxt is not None:
                self.source.push(nxt)
                timer = self.env.timeout(max(0.0, nxt.arrival_time - self.env.now))
                timer.callbacks.append(self._on_followup_timer)

    # ------------------------------------------------------------------ engine loops
    def _deadline(self, rep: Replica) -> float:
        d = self.source.next_time()
        if self._multi_turn:
            for other in self.replicas:
                if other is not rep and other.clock < d:
                    d = other.clock
        return d

    def _engine(self, rep: Replica):  # a SimPy process per replica
        env = self.env
        core = rep.core
        sched = core.scheduler
        t = 0.0
        while True:
            self._route_until(t)
            if rep.inbox:
                self._admit(rep)
            if not sched.has_unfinished_requests():
                rep.clock = INF
                rep.wake = env.event()
                rep.num_events += 1
                yield rep.wake
                rep.wake = None
                t = env.now if env.now > t else t
                continue
            if self.fast_forward and self._fast_forward(rep, t):
                t = rep.end_time
            else:
                in_system = len(sched.running) + len(sched.waiting)
                outputs, stats = core.step(t)
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
                rep.clock = t
                for out in outputs:
                    if out.finish_reason is not None:
                        self._finish(rep, out.req_id)
            rep.clock = t
            rep.num_events += 1
            yield env.timeout(max(0.0, t - env.now))

    def _fast_forward(self, rep: Replica, t: float) -> bool:
        sched = rep.core.scheduler
        k = decode_window(sched, 1 << 30)
        if k <= 0:
            return False
        running = sched.running
        n = len(running)
        context = 0
        for req in running:
            context += req.num_computed_tokens
        ex = rep.executor
        durations, ends = ex.decode_step_times(n, context, k, t, self._deadline(rep))
        if not ends:
            return False
        dropped = sched.finished_req_ids
        tokens = ex.tokens
        ids = [r.request_id for r in running]
        usage, finished = apply_decode_steps(sched, ends,
                                             lambda req, m: [tokens.get(req.request_id, 1)] * m)
        ex.advance_decode(ids, context, durations, dropped)
        k = len(ends)
        rep.core.num_steps += k
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
        log = rep.steps
        if log is not None:
            log.start.append(t)
            log.start.extend(ends[:-1])
            log.duration.extend(durations)
            reps = [n] * k
            log.in_system.extend(reps)
            log.running.extend(reps)
            if finished:
                log.running[-1] = n - len(finished)
            log.waiting.extend([0] * k)
            log.tokens.extend(reps)
            log.seqs.extend(reps)
            log.kv_usage.extend(usage)
            log.preempted.extend([0] * k)
        rep.num_ff_windows += 1
        rep.end_time = ends[-1]
        rep.clock = ends[-1]
        for rid in finished:
            self._finish(rep, rid)
        return True

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
            env.process(self._engine(rep))
        env.run()
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
