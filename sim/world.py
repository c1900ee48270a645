"""The SimPy world: arrivals feed one engine replica whose loop is one SimPy event per step.

Token times are computed (t + step duration), not scheduled. With fast_forward, runs of identical
decode steps are applied at once with the same floats, so results equal stepping.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import simpy

from twinserve.backends.sim.executor import DEFAULT_TOKEN, SimExecutor
from twinserve.backends.sim.host_link import HostTierExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import InvalidRequestError
from twinserve.core.request import FinishReason, Request
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched.fast_forward import apply_decode_steps, decode_plan

from twinserve.sim.clients import ClosedLoopSource
from twinserve.sim.gc_policy import simulation_gc
from twinserve.sim.kv_offload import price_window_stores, store_free_window, stores_fit, window_stores
from twinserve.sim.spec_window import apply_spec_window, plan_spec_window, spec_window_applies, wide_enough
from twinserve.sim.workload import WorkItem, Workload

INF = float("inf")
# A record's finish_reason text ("" while unfinished): a lookup, not Enum.value's descriptor.
_REASON_TEXT: dict[FinishReason | None, str] = {r: r.value for r in FinishReason}
_REASON_TEXT[None] = ""


@dataclass(slots=True)
class RequestRecord:
    """One finished (or refused) request: what the metrics are computed from."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    prefix_hit_tokens: int
    num_preemptions: int
    token_times: list[float]
    conversation: int = -1
    turn: int = 0
    finish_reason: str = ""
    error: str = ""
    replica: int = 0
    client: int = -1       # closed loop: the client that sent it
    warmup: bool = False   # closed loop: a warm-up request, left out of the metrics


@dataclass(slots=True)
class StepLog:
    """Per-step columns (parallel lists) of the engine's load over time."""

    start: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    in_system: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start)

    def add_decode_window(self, t: float, ends: list[float], durations: list[float], n: int,
                          num_finished: int, usage: list[float]) -> None:
        """The rows of a fast-forwarded window: len(ends) decode steps of n sequences from t,
        nothing waiting or preempted; num_finished of them end in the last step."""
        k = len(ends)
        self.start.append(t)
        self.start.extend(ends[:-1])
        self.duration.extend(durations)
        rep = [n] * k
        self.in_system.extend(rep)
        self.running.extend(rep)
        if num_finished:
            self.running[-1] = n - num_finished
        self.waiting.extend([0] * k)
        self.tokens.extend(rep)
        self.seqs.extend(rep)
        self.kv_usage.extend(usage)
        self.preempted.extend([0] * k)


@dataclass(slots=True)
class RunResult:
    """Everything one simulation produced."""

    records: list[RequestRecord]
    steps: StepLog
    end_time: float
    wall_time: float
    num_steps: int
    num_events: int
    num_ff_windows: int
    num_preemptions: int
    prefix_queries: int
    prefix_hits: int
    num_blocks: int


class ArrivalSource:
    """Merges the workload's lazy first turns with follow-up turns made at run time."""

    def __init__(self, items: Iterator[WorkItem]) -> None:
        self._items = items
        self._next: WorkItem | None = next(items, None)
        self._heap: list[tuple[float, int, WorkItem]] = []

    def next_time(self) -> float:
        """Arrival time of the next request (inf when none is left)."""
        a = self._next.arrival_time if self._next is not None else INF
        b = self._heap[0][0] if self._heap else INF
        return a if a <= b else b

    def push(self, item: WorkItem) -> None:
        """Add a follow-up turn."""
        heapq.heappush(self._heap, (item.arrival_time, item.index, item))

    def on_done(self, item: WorkItem, t: float, followup: WorkItem | None = None) -> WorkItem | None:
        """A request ended at t: its follow-up turn (if any) arrives at its own time."""
        if followup is not None:
            self.push(followup)
        return followup

    def pop_next(self) -> WorkItem:
        """The next request in arrival order (the caller has checked there is one)."""
        a, h = self._next, self._heap
        if a is not None and (not h or a.arrival_time <= h[0][0]):
            self._next = next(self._items, None)
            return a
        return heapq.heappop(h)[2]

    def pop_until(self, t: float) -> list[WorkItem]:
        """All requests arriving at or before t, in arrival order."""
        out: list[WorkItem] = []
        while True:
            a = self._next
            h = self._heap
            if a is not None and a.arrival_time <= t and (not h or a.arrival_time <= h[0][0]):
                out.append(a)
                self._next = next(self._items, None)
            elif h and h[0][0] <= t:
                out.append(heapq.heappop(h)[2])
            else:
                return out


def make_source(workload: Workload) -> ArrivalSource | ClosedLoopSource:
    """The workload's arrivals: open loop, or its closed-loop clients when concurrency > 0."""
    cfg = workload.cfg
    if cfg.concurrency > 0:
        return ClosedLoopSource(workload.items(), cfg.concurrency, cfg.think_time_s,
                                cfg.warmup_requests)
    return ArrivalSource(workload.items())


def first_tokens(live: dict[str, Request], outputs: list, hook: Callable[[Request], bool]) -> bool:
    """Call hook with each request whose first tokens are a step's outputs; True if one said stop."""
    stop = False
    for out in outputs:
        req = live[out.req_id]
        # Every output token came this step: the first (a resumed preemption has earlier ones).
        if len(req.output_token_ids) == len(out.new_token_ids) and hook(req):
            stop = True
    return stop


class Simulation:
    """One engine replica (the core's EngineCore, unchanged) driven in simulated time."""

    def __init__(self, core: EngineCore, executor: SimExecutor, workload: Workload,
                 fast_forward: bool = True, step_starts: Sequence[float] | None = None,
                 admit_until: Sequence[float] | None = None,
                 admit_count: Sequence[int] | None = None) -> None:
        self.core = core
        self.executor = executor
        self.workload = workload
        self.fast_forward = fast_forward
        self.env = simpy.Environment()
        self.source = make_source(workload)
        self.live: dict[str, Request] = {}
        # Follow-up turn id -> (its history, the previous turn's block keys, salt): _reuse_hashes.
        self._carried_hashes: dict[str, tuple[list[int], list, str | None]] = {}
        self.records: list[RequestRecord] = []
        self.steps = StepLog()
        self.num_events = 0
        self.num_ff_windows = 0
        self._params: dict[int, SamplingParams] = {}
        # Replay: steps start at a real run's measured times, so admissions match the real engine's.
        self.step_starts = step_starts
        if step_starts is not None:
            self.fast_forward = False
        # Core in its own process: step k admits only what had reached it (admit_until[k]).
        self.admit_until = admit_until if step_starts is not None else None
        # ... and no more requests than it had taken by then (arrivals at one time come one by one).
        self.admit_count = admit_count if self.admit_until is not None else None
        self._num_added = 0
        self.replay_exhausted = False
        # Called with each finished record; True ends the run early (a search's lost SLO).
        self.abort: Callable[[RequestRecord], bool] | None = None
        self.aborted = False
        # Called with each request at its first token; True ends the run there (a TTFT miss is
        # certain then, long before the request finishes). None: no per-step look at the outputs.
        self.first_token: Callable[[Request], bool] | None = None
        # False: records carry no token_times and decode windows skip them (a caller that reads
        # first-token and finish times only, as validate: the lists are most of a long run's memory).
        self.keep_token_times = True

    # ------------------------------------------------------------------ arrivals
    def _admit(self, t: float) -> None:
        # A refusal frees a closed-loop client at once: its next request may be due by t too.
        items = self.source.pop_until(t)
        while items and self._admit_items(items):
            items = self.source.pop_until(t)

    def _admit_capped(self, t: float, cap: int) -> None:
        # Replay of a core process: one request at a time, up to the count the real core had taken.
        source = self.source
        while self._num_added < cap and source.next_time() <= t:
            self._admit_items([source.pop_next()])

    def _admit_items(self, items: list[WorkItem]) -> bool:
        """Add the requests to the core; True when a refusal freed a closed-loop client."""
        wl = self.workload
        freed = False
        for item in items:
            n_out = item.num_output_tokens
            sp = self._params.get(n_out)
            if sp is None:
                sp = self._params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=True)
            # A list made for this request (Workload.prompt_tokens): its token list, not copied.
            req = Request.owning(item.request_id, wl.prompt_tokens(item), sp,
                                 arrival_time=item.arrival_time, payload=item)
            carried = self._carried_hashes.pop(item.request_id, None) if self._carried_hashes else None
            if carried is not None:
                self._reuse_hashes(req, *carried)
            try:
                self.core.add_request(req)
            except InvalidRequestError as e:
                self.records.append(RequestRecord(
                    item.request_id, item.arrival_time, item.num_prompt_tokens, n_out, None, None,
                    None, 0, 0, [], item.conversation, item.turn, "refused", str(e),
                    client=item.client, warmup=item.warmup))
                # Refused on arrival (as a server answers 400): a closed-loop client is free again.
                if item.client >= 0:
                    self.source.on_done(item, item.arrival_time)
                    freed = True
                continue
            self.live[item.request_id] = req
            self._num_added += 1
            self.executor.register(item.request_id, wl.sample_token(item))
        return freed

    def _reuse_hashes(self, req: Request, history: list[int], hashes: list, salt: str | None) -> None:
        """Give a follow-up turn its previous turn's block keys where their blocks' tokens are its own.

        Keys are a function of the tokens, so the KV manager finds the same values without
        hashing the conversation's whole context again each turn (a hit confirms them as before).
        """
        n = min(len(hashes), len(history) // self.core.scheduler.kv.block_size)
        tokens = req.all_token_ids
        if n and req.cache_salt == salt and tokens[:len(history)] == history:
            req.block_hashes = hashes[:n]

    def _finish(self, rid: str) -> None:
        req = self.live.pop(rid)
        item: WorkItem = req.payload
        self.executor.forget(rid)
        self.records.append(RequestRecord(
            rid, req.arrival_time, req.num_prompt_tokens, len(req.output_token_ids),
            req.first_scheduled_time, req.first_token_time, req.finish_time,
            max(req.prefix_hit_tokens, 0), req.num_preemptions,
            req.token_times if self.keep_token_times else [], item.conversation, item.turn,
            _REASON_TEXT[req.finish_reason], client=item.client, warmup=item.warmup))
        if self.abort is not None and self.abort(self.records[-1]):
            self.aborted = True
        nxt = None
        if self.workload.cfg.turns > 1 and req.finish_time is not None:
            nxt = self.workload.next_turn(item, req.all_token_ids, req.finish_time)
            if nxt is not None and req.block_hashes:
                # The list itself: a pending chain's flush before the next turn comes in adds the
                # keys it computed (_reuse_hashes copies what is there then; no key hashed twice).
                self._carried_hashes[nxt.request_id] = (list(req.all_token_ids), req.block_hashes,
                                                        req.cache_salt)
        if nxt is not None or item.client >= 0:
            done = req.finish_time if req.finish_time is not None else req.arrival_time
            self.source.on_done(item, done, nxt)

    # ------------------------------------------------------------------ engine loop
    def _engine(self):  # a SimPy process
        env = self.env
        core = self.core
        sched = core.scheduler
        source = self.source
        log = self.steps
        t = 0.0
        starts = self.step_starts
        horizons = self.admit_until
        # The host tier's copies are priced from each step's start (None: no tier).
        tier = core.executor if isinstance(core.executor, HostTierExecutor) else None
        first_token = self.first_token
        live = self.live
        while not self.aborted:
            if starts is not None:
                k = core.num_steps
                if k >= len(starts):
                    # The simulator needs more steps than the real run took: not the same schedule.
                    self.replay_exhausted = sched.has_unfinished_requests() or source.next_time() < INF
                    return
                t = starts[k] if starts[k] > t else t
            if horizons is None:
                self._admit(t)
            else:
                if self.admit_count is None:
                    self._admit(horizons[k])
                else:
                    self._admit_capped(horizons[k], self.admit_count[k])
                if not sched.has_unfinished_requests():
                    # The real core had work for step k; with what reached it, the simulator has none.
                    self.replay_exhausted = True
                    return
            if not sched.has_unfinished_requests():
                nxt = source.next_time()
                if nxt == INF:
                    return
                if nxt > t:
                    self.executor.idle(nxt - t)
                    t = nxt
                self.num_events += 1
                yield env.timeout(max(0.0, t - env.now))
                continue
            if self.fast_forward and not self.executor.waking and self._fast_forward(t):
                t = self._t_after_ff
            else:
                in_system = len(sched.running) + sched.num_waiting
                if tier is not None:
                    tier.now = t
                outputs, stats = core.step(t)
                assert stats is not None
                d = stats.duration
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
                if first_token is not None and first_tokens(live, outputs, first_token):
                    self.aborted = True
                for out in outputs:
                    if out.finish_reason is not None:
                        self._finish(out.req_id)
            self.num_events += 1
            yield env.timeout(max(0.0, t - env.now))

    _t_after_ff: float = 0.0

    def _fast_forward(self, t: float) -> bool:
        sched = self.core.scheduler
        if spec_window_applies(sched, self.executor):
            return self.core.executor is self.executor and wide_enough(sched) and self._spec_window(t)
        k, context = decode_plan(sched, 1 << 30)
        tier = self.core.executor if sched.kv.host is not None else None
        ex = self.executor
        if k > 0 and tier is not None and (ex.draft is not None or tier.synchronous):
            # A draft model's window is not cut after pricing; synchronous copies lengthen steps.
            k = store_free_window(sched, k)
            tier = None
        if k <= 0:
            return False
        running = sched.running
        n = len(running)
        durations, ends = ex.decode_step_times(n, context, k, t, self.source.next_time())
        step_of = None
        if tier is not None and ends:
            # The window's stores, priced as stepping prices them: it ends where that would differ.
            counts, step_of = window_stores(sched, len(ends))
            counts[0] += len(sched.kv.kv_stores) + len(sched.kv.pool.evicted or ())
            m = stores_fit(tier.link, counts, t, durations)
            durations, ends = durations[:m], ends[:m]
        if not ends:
            return False
        dropped = sched.finished_req_ids
        usage, finished = apply_decode_steps(sched, ends, repeat=ex.tokens, default=DEFAULT_TOKEN,
                                             times=self.keep_token_times, known=ex.state)
        if step_of is not None:
            price_window_stores(tier, sched.kv, step_of, [t, *ends[:-1]])
        ex.advance_decode(None, context, durations, dropped, num=n)  # known lengths: advanced above
        k = len(ends)
        self.core.num_steps += k
        self.steps.add_decode_window(t, ends, durations, n, len(finished), usage)
        self.num_ff_windows += 1
        self._t_after_ff = ends[-1]
        for rid in finished:
            self._finish(rid)
        return True

    def _spec_window(self, t: float) -> bool:
        """_fast_forward for a drafting batch (sim/spec_window.py): its steps up to the next arrival."""
        sched = self.core.scheduler
        ex = self.executor
        win = plan_spec_window(sched, ex, 1 << 30, t, self.source.next_time())
        if win is None:
            return False
        m = len(win.ends)
        finished = apply_spec_window(sched, ex, win, m, self.keep_token_times)
        self.core.num_steps += m
        log = self.steps
        first = len(log)
        usage = sched.kv.usage
        log.add_decode_window(t, win.ends, win.durations, win.n, len(finished), [usage] * m)
        log.tokens[first:] = win.tokens(m)
        self.num_ff_windows += 1
        self._t_after_ff = win.ends[-1]
        for rid in finished:
            self._finish(rid)
        return True

    def run(self) -> RunResult:
        """Run until every request has finished; returns the records and the step log."""
        wall = time.perf_counter()
        self.env.process(self._engine())
        with simulation_gc():
            self.env.run()
        wall = time.perf_counter() - wall
        sched = self.core.scheduler
        stats = sched.kv.stats
        end = self.steps.start[-1] + self.steps.duration[-1] if len(self.steps) else 0.0
        return RunResult(self.records, self.steps, end, wall, self.core.num_steps,
                         self.num_events, self.num_ff_windows, sched.num_preemptions,
                         stats.queries, stats.hits, self.core.config.num_blocks)
