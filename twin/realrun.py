"""Serves a simulator Workload on the real engine in real time, recording what the simulator records.

The loop is the simulator's (sim/world.py) with a wall clock, and its arrivals the simulator's:
open loop, or closed-loop clients (sim/clients.py) freed by the engine's real finishes. Token times are when a step's outputs
are ready; with a core process the steps kept are the core's, from its step records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from twinserve.core.errors import TwinserveError
from twinserve.core.sampling_params import SamplingParams
from twinserve.sim.clients import ClosedLoopSource
from twinserve.sim.world import INF, ArrivalSource, RequestRecord, make_source
from twinserve.sim.workload import WorkItem, Workload


@dataclass(slots=True)
class RealRun:
    """What one real-time replay produced; times in seconds from the run's start."""

    records: list[RequestRecord]
    step_starts: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    schedules: list[dict[str, int]] = field(default_factory=list)
    preempted: list[list[str]] = field(default_factory=list)
    interrupted: bool = False
    wall_time: float = 0.0
    num_preemptions: int = 0
    # Core process: per step, the latest arrival the core had received.
    admit_until: list[float] | None = None
    # ... and how many requests it had taken (requests sent at one time reach it one by one).
    admit_count: list[int] | None = None


@dataclass(slots=True)
class _Live:
    item: WorkItem
    prompt: list[int]
    token_times: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)


def run_real(engine: Any, workload: Workload, poll_s: float = 0.0005) -> RealRun:
    """Serve every request of workload on engine in real time (Ctrl-C: aborts, returns partial)."""
    source = make_source(workload)
    live: dict[str, _Live] = {}
    run = RealRun([])
    params: dict[int, SamplingParams] = {}
    core = engine.core
    in_process = getattr(engine, "core_mode", "inproc") == "process"
    if in_process:
        log = engine.step_log
        if not (log.enabled and log.record_schedule):
            raise TwinserveError("replaying a run of an engine core in its own process needs the engine's "
                                 "step log on with record_schedule=True (engine.set_step_log("
                                 "StepLog(path_or_keep, record_schedule=True))) before run_real")
        run.admit_until = []
        run.admit_count = []
    # Engine's absolute arrival time -> the workload's own (no float round trip).
    arrivals: dict[float, float] = {}
    t0 = time.monotonic()
    try:
        while True:
            now = time.monotonic() - t0
            for item in source.pop_until(now):
                arrivals[t0 + item.arrival_time] = item.arrival_time
                _add(engine, workload, item, t0, live, run, params, source)
            if core.has_unfinished_requests():
                if not in_process:
                    run.step_starts.append(now)
                outputs = engine.step()
                end = time.monotonic() - t0
                if in_process:
                    _core_steps(engine, run, t0, arrivals)
                else:
                    run.step_ends.append(end)
                    so = core.last_scheduler_output
                    run.schedules.append(dict(so.num_scheduled_tokens) if so is not None else {})
                    run.preempted.append(sorted(so.preempted_req_ids) if so is not None else [])
                for out in outputs:
                    st = live.get(out.request_id)
                    if st is None:
                        continue
                    delta = out.outputs[0].token_ids_delta
                    st.output_ids.extend(delta)
                    st.token_times.extend([end] * len(delta))
                    if out.finished:
                        _finish(workload, source, live.pop(out.request_id), out, t0, end, run)
                continue
            nxt = source.next_time()
            if nxt == INF:
                if not live:
                    break
                raise TwinserveError(f"{len(live)} requests were lost by the engine")
            wait = nxt - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait if wait > poll_s else poll_s)
    except KeyboardInterrupt:
        run.interrupted = True
        engine.abort_request(list(live))
    run.wall_time = time.monotonic() - t0
    return run


def _core_steps(engine: Any, run: RealRun, t0: float, arrivals: dict[float, float]) -> None:
    """Keep the steps the engine-core process ran, as its step records describe them."""
    for rec, tr in engine.last_core_steps:
        start = rec.start_s - t0
        run.step_starts.append(start)
        run.step_ends.append(start + rec.step_time_s)
        run.schedules.append(dict(tr.scheduled or {}))
        run.preempted.append(list(tr.preempted or []))
        a = tr.admitted_until
        run.admit_until.append(-INF if a is None else arrivals.get(a, a - t0))
        run.admit_count.append(tr.admitted_count or 0)


def _add(engine: Any, workload: Workload, item: WorkItem, t0: float, live: dict[str, _Live],
         run: RealRun, params: dict[int, SamplingParams],
         source: ArrivalSource | ClosedLoopSource) -> None:
    n_out = item.num_output_tokens
    sp = params.get(n_out)
    if sp is None:
        # Forced lengths: both sides do the same work whatever the model says.
        sp = params[n_out] = SamplingParams(max_tokens=n_out, ignore_eos=True, temperature=0.0)
    ids = workload.prompt_tokens(item)
    try:
        engine.add_request(item.request_id, {"prompt_token_ids": ids}, sp,
                           arrival_time=t0 + item.arrival_time)
    except TwinserveError as e:
        run.records.append(RequestRecord(
            item.request_id, item.arrival_time, item.num_prompt_tokens, n_out, None, None, None, 0,
            0, [], item.conversation, item.turn, "refused", str(e), client=item.client,
            warmup=item.warmup))
        if item.client >= 0:  # refused on arrival, as the simulator refuses: the client is free
            source.on_done(item, item.arrival_time)
        return
    live[item.request_id] = _Live(item, ids)


def _finish(workload: Workload, source: ArrivalSource | ClosedLoopSource, st: _Live, out: Any, t0: float, end: float,
            run: RealRun) -> None:
    m = out.metrics
    c = out.outputs[0]
    item = st.item
    first_sched = (m.first_scheduled_time - t0) if m and m.first_scheduled_time is not None else None
    run.num_preemptions += m.num_preemptions if m else 0
    run.records.append(RequestRecord(
        item.request_id, item.arrival_time, len(st.prompt), len(st.output_ids), first_sched,
        st.token_times[0] if st.token_times else None, end, m.num_cached_tokens if m else 0,
        m.num_preemptions if m else 0, st.token_times, item.conversation, item.turn,
        c.finish_reason or "", client=item.client, warmup=item.warmup))
    nxt = workload.next_turn(item, st.prompt + st.output_ids, end) if workload.cfg.turns > 1 else None
    if nxt is not None or item.client >= 0:
        source.on_done(item, end, nxt)
