"""The engine core in a process of its own, linked to the front end by ZeroMQ.

The front end PUSHes requests and PULLs one StepOutputs per busy-loop iteration; the core
process runs the same EngineCore as the in-process mode.
"""

from __future__ import annotations

import atexit
import os
import shutil
import weakref
import tempfile
import time
import traceback
from typing import Any, Iterable

import msgspec
import zmq

from twinserve.core.engine_core import StepStats
from twinserve.core.errors import EngineDeadError, PrefixCacheBusyError, TwinserveError
from twinserve.core.request import FinishReason, Request
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.core_client import CoreRequests, CoreStep, core_output, core_stats
from twinserve.backends.real.core_messages import (AbortRequests, AddRequest, Bye, Consumed, CoreError, CoreOutput, CoreStats, Ready,
                            ResetPrefixCache, SetStepLog, Shutdown, StepOutputs, StepTrace, encoder,
                            from_core_decoder, to_core_decoder)
from twinserve.backends.real.models.registry import ModelSource
from twinserve.backends.real.procs import EngineStartupError, die_with_parent, exit_description, spawn_context, stop_process
from twinserve.backends.real.step_log import extra_costs

STARTUP_TIMEOUT_S = 600.0
_MAX_MERGED_BATCHES = 64
# Credit: the core steps only while fewer batches than this wait for the front end, so a lagging
# front end holds it back instead of outputs piling up and aborted requests running on.
MAX_UNCONSUMED_BATCHES = 2


def run_engine_core(in_addr: str, out_addr: str, args: EngineArgs, max_model_len: int,
                    eos_ids: list[int], source: ModelSource | None, parent_pid: int, num_threads: int) -> None:
    """Entry point of the engine-core process: build, then loop until Shutdown."""
    die_with_parent(parent_pid)
    import torch

    torch.set_num_threads(num_threads)
    ctx = zmq.Context()
    inp = ctx.socket(zmq.PULL)
    inp.connect(in_addr)
    out = ctx.socket(zmq.PUSH)
    out.connect(out_addr)
    enc = encoder()
    executor = None
    try:
        from twinserve.backends.real.core_build import build_engine_core

        core, executor, kv_bytes = build_engine_core(args, max_model_len, eos_ids, source=source)
        out.send(enc.encode(Ready(core.config.num_blocks, kv_bytes,
                                  [os.getpid(), *getattr(executor, "worker_pids", [])])))
        _busy_loop(core, executor, inp, out, enc)
        out.send(enc.encode(Bye()))
    except BaseException as e:  # report, then exit: the front end raises EngineDeadError
        try:
            out.send(enc.encode(CoreError(f"{type(e).__name__}: {e}", traceback.format_exc())))
        except Exception:
            pass
        raise SystemExit(1)
    finally:
        if executor is not None:
            executor.shutdown()
        out.close(linger=2000)
        inp.close(linger=0)
        ctx.term()


class _StepTracer:
    """The core process's half of the step log, active only while it is on."""

    def __init__(self, core: Any, executor: Any) -> None:
        self.core = core
        self.executor = executor
        self.on = False
        self.record_schedule = False
        self._last_end = 0.0
        self._busy_after_last = False

    def set(self, msg: SetStepLog) -> None:
        self.on = msg.on
        self.record_schedule = msg.on and msg.record_schedule
        self.core.clock = time.perf_counter if msg.on else None
        self.executor.set_timing(msg.on)
        self._busy_after_last = False  # no gap across a switch

    def trace(self, start: float, end: float, admitted_until: float | None, admitted_count: int) -> StepTrace:
        """The step just run (perf_counter times)."""
        gap = start - self._last_end if self._busy_after_last else 0.0
        self._last_end = end
        self._busy_after_last = self.core.has_unfinished_requests()
        ex = self.executor
        shape = ex.last_step_shape
        computed = shape.num_new_tokens > 0
        prepare, forward, sample = ex.last_step_timing if computed else (0.0, 0.0, 0.0)
        extra = extra_costs(shape, ex.last_comm_time if computed else 0.0)
        tr = StepTrace(list(shape.prefills), list(shape.decodes), prepare, forward, sample, end - start,
                       gap, extra or None)
        if self.record_schedule:
            so = self.core.last_scheduler_output
            tr.scheduled = dict(so.num_scheduled_tokens)
            tr.preempted = sorted(so.preempted_req_ids)
            tr.admitted_until = admitted_until
            tr.admitted_count = admitted_count
        return tr


def _busy_loop(core: Any, executor: Any, inp: zmq.Socket, out: zmq.Socket, enc: Any) -> None:
    dec = to_core_decoder()
    requests = CoreRequests()
    tracer = _StepTracer(core, executor)
    inputs_seen = reported_seen = 0
    sent = consumed = 0
    admitted_until: float | None = None
    admitted_count = 0
    while True:
        msgs = []
        if not core.has_unfinished_requests() or sent - consumed >= MAX_UNCONSUMED_BATCHES:
            msgs.append(dec.decode(inp.recv()))  # idle or held back: block until the front end speaks
        while True:
            try:
                msgs.append(dec.decode(inp.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        outputs: list[CoreOutput] = []
        for m in msgs:
            if isinstance(m, Consumed):
                consumed = max(consumed, m.count)
                continue
            inputs_seen += 1
            if isinstance(m, Shutdown):
                return
            if isinstance(m, AddRequest):
                req = Request(m.request_id, m.prompt_token_ids, m.sampling_params, m.arrival_time,
                              m.priority, cache_salt=m.cache_salt, eos_token_id=m.eos_token_id)
                try:
                    core.add_request(req)
                except TwinserveError as e:  # the front end validated it: this is a bug, not bad input
                    outputs.append(CoreOutput(m.request_id, [], FinishReason.ERROR,
                                              error=f"the engine core refused the request: {e}"))
                else:
                    requests.live[m.request_id] = req
                    admitted_count += 1
                    if admitted_until is None or m.arrival_time > admitted_until:
                        admitted_until = m.arrival_time
            elif isinstance(m, AbortRequests):
                aborted = core.abort(m.request_ids, time.monotonic(), m.reason)
                outputs.extend(core_output(o, requests.live.pop(o.req_id, None)) for o in aborted)
            elif isinstance(m, SetStepLog):
                tracer.set(m)
            elif isinstance(m, ResetPrefixCache):
                try:
                    core.scheduler.reset_prefix_cache()
                except TwinserveError:
                    pass  # requests came in after the front end checked: the cache stays, as in process
        stats = trace = None
        stepped = core.has_unfinished_requests() and sent - consumed < MAX_UNCONSUMED_BATCHES
        if stepped:
            t_start = time.perf_counter() if tracer.on else 0.0
            step_outputs, stats = core.step(time.monotonic())
            outputs.extend(requests.wrap(step_outputs))
            if tracer.on:
                trace = tracer.trace(t_start, time.perf_counter(), admitted_until, admitted_count)
        if stepped or outputs or inputs_seen != reported_seen:
            out.send(enc.encode(StepOutputs(outputs, core_stats(core), inputs_seen, stats, trace)))
            sent += 1
            reported_seen = inputs_seen


class _SchedulerView:
    """What tests and metrics read from the scheduler, mirrored from the core's latest stats."""

    def __init__(self) -> None:
        self.num_running = self.num_waiting = self.num_preemptions = 0
        self.kv = _KVView()


class _KVView:
    def __init__(self) -> None:
        self.num_free_blocks = self.num_blocks = 0
        self.usage = 0.0
        self.stats = _PrefixStats()


class _PrefixStats:
    def __init__(self) -> None:
        self.queries = self.hits = 0


class MPCoreClient:
    """Runs the engine core in a child process and talks to it over ZeroMQ."""

    def __init__(self, args: EngineArgs, max_model_len: int, eos_ids: list[int],
                 source: ModelSource | None) -> None:
        self._dir = tempfile.mkdtemp(prefix="twinserve-core-")
        in_addr, out_addr = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        self._ctx = zmq.Context()
        self._in = self._ctx.socket(zmq.PUSH)
        self._in.bind(in_addr)
        self._out = self._ctx.socket(zmq.PULL)
        self._out.bind(out_addr)
        self._enc = encoder()
        self._dec = from_core_decoder()
        self._stats = CoreStats()
        self.scheduler = _SchedulerView()
        self._closed = False
        self._sent = self._seen = 0
        self._taken = 0  # the core's credit: see MAX_UNCONSUMED_BATCHES
        self._step_log = SetStepLog(False)
        self.dead: str | None = None
        import torch

        self.proc = spawn_context().Process(
            target=run_engine_core, name="twinserve-engine-core", daemon=False,
            args=(in_addr, out_addr, args, max_model_len, eos_ids, source, os.getpid(), torch.get_num_threads()))
        self.proc.start()
        # Before multiprocessing's own exit hook, which would wait forever on the idle core.
        ref = weakref.ref(self)
        atexit.register(lambda: (c := ref()) is not None and c.shutdown())
        try:
            ready = self._wait_ready()
        except BaseException:
            self._close(kill=True)
            raise
        self.num_blocks = ready.num_blocks
        self.kv_bytes_per_token = ready.kv_bytes_per_token
        self.pids = ready.pids
        self._stats = CoreStats(num_blocks=ready.num_blocks, num_free_blocks=ready.num_blocks)
        self._update_view()

    def _wait_ready(self) -> Ready:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._out.poll(100):
                msg = self._dec.decode(self._out.recv())
                if isinstance(msg, CoreError):
                    raise EngineStartupError(f"the engine core failed to start: {msg.message}\n"
                                             f"--- its traceback ---\n{msg.traceback}")
                if isinstance(msg, Ready):
                    return msg
            elif not self.proc.is_alive():
                raise EngineStartupError("the engine core process died while starting "
                                         f"({exit_description(self.proc.exitcode)})")
        raise EngineStartupError(f"the engine core did not start within {STARTUP_TIMEOUT_S:.0f} s")

    @property
    def num_steps(self) -> int:
        """Engine steps the core has reported."""
        return self._stats.num_steps

    def add_request(self, request: Request) -> None:
        """Send a validated request to the core."""
        params = request.sampling_params
        spec = params.structured_output
        if spec is not None and spec.compiled is not None:  # a compiled grammar does not serialize
            params = params.clone(structured_output=spec.portable())
        self._send(AddRequest(request.request_id, request.prompt_token_ids, params, request.arrival_time,
                              request.priority, request.eos_token_id, request.cache_salt))

    def abort(self, request_ids: Iterable[str], reason: FinishReason = FinishReason.ABORT) -> None:
        """Ask the core to end requests (their blocks are freed in its next iteration)."""
        ids = list(request_ids)
        if ids and self.dead is None and not self._closed:  # aborting on a dead core is moot
            self._send(AbortRequests(ids, reason))

    def set_step_log(self, on: bool, record_schedule: bool = False) -> None:
        """Turn the core's step timing and traces on or off (steps it already ran stay untraced)."""
        msg = SetStepLog(on, on and record_schedule)
        if msg != self._step_log:
            self._send(msg)
            self._step_log = msg

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; PrefixCacheBusyError while requests may hold blocks."""
        s = self._stats
        if s.num_running or s.num_waiting or self.has_pending():
            raise PrefixCacheBusyError("cannot reset the prefix cache while the engine core has requests "
                                       "(or has not yet answered); finish or abort them first")
        self._send(ResetPrefixCache())

    def _send(self, msg: Any) -> None:
        if self.dead is not None or self._closed:
            raise EngineDeadError(self.dead or "the engine core is shut down")
        self._in.send(self._enc.encode(msg))
        self._sent += 1

    def has_unfinished_requests(self) -> bool:
        """True while the core reported work, or has not yet answered what was sent."""
        return self._stats.num_running + self._stats.num_waiting > 0 or self.has_pending()

    def has_pending(self) -> bool:
        """True while the core has not yet answered everything sent to it."""
        return self._seen < self._sent and self.dead is None and not self._closed

    def get_output(self, timeout: float) -> CoreStep | None:
        """The core's next batch, or None after timeout; EngineDeadError if the core is gone."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        if not self._out.poll(int(timeout * 1000)):
            if not self.proc.is_alive():
                self._die(f"the engine core process died ({exit_description(self.proc.exitcode)})")
            return None
        # Take every batch already waiting, in order (the core may have run ahead).
        outputs: list[CoreOutput] = []
        raw_stats = None
        traces: list[tuple[StepStats, StepTrace]] = []
        for _ in range(_MAX_MERGED_BATCHES):
            msg = self._dec.decode(self._out.recv())
            if isinstance(msg, CoreError):
                self._die(f"the engine core failed: {msg.message}\n--- its traceback ---\n{msg.traceback}")
            if not isinstance(msg, StepOutputs):
                self._die(f"unexpected message from the engine core: {type(msg).__name__}")
            outputs.extend(msg.outputs)
            self._taken += 1
            self._stats = msg.stats
            self._seen = msg.inputs_seen
            if msg.step_stats is not None:
                raw_stats = msg.step_stats
                if msg.trace is not None:
                    traces.append((msgspec.convert(raw_stats, StepStats), msg.trace))
            if not self._out.poll(0):
                break
        self._in.send(self._enc.encode(Consumed(self._taken)))  # not a request: _sent stays
        self._update_view()
        stats = msgspec.convert(raw_stats, StepStats) if raw_stats is not None else None
        return CoreStep(outputs, stats, traces or None)

    def _die(self, reason: str) -> None:
        self.dead = reason
        self._close(kill=True)
        raise EngineDeadError(reason)

    def _update_view(self) -> None:
        s, v = self._stats, self.scheduler
        v.num_running, v.num_waiting, v.num_preemptions = s.num_running, s.num_waiting, s.num_preemptions
        v.kv.num_free_blocks, v.kv.num_blocks, v.kv.usage = s.num_free_blocks, s.num_blocks, s.kv_usage
        v.kv.stats.queries, v.kv.stats.hits = s.prefix_queries, s.prefix_hits

    def stats(self) -> CoreStats:
        """The core's state as of the latest message received."""
        return self._stats

    def shutdown(self) -> None:
        """Ask the core to stop (it stops its workers) and wait."""
        if self._closed:
            return
        if self.dead is None and self.proc.is_alive():
            try:
                self._in.send(self._enc.encode(Shutdown()))
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline and self.proc.is_alive():
                    if self._out.poll(100) and isinstance(self._dec.decode(self._out.recv()), Bye):
                        break
            except zmq.ZMQError:
                pass
        self._close(kill=False)

    def _close(self, kill: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if kill and self.proc.is_alive():
            self.proc.kill()
        stop_process(self.proc, timeout=10.0)
        self._in.close(linger=0)
        self._out.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self._close(kill=True)
        except Exception:
            pass
