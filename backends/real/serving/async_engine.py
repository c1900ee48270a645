"""The async front end: the engine's busy loop on its own thread, asyncio streams per request.

With engine_core_mode='process' the thread only feeds the engine-core process and reads back
its per-step batches (LLMEngine hides which); scheduling and the forward pass then never
share this process's GIL with HTTP handling, tokenization or detokenization.

Only the engine thread touches the LLMEngine. The event loop sends it commands (add, abort,
stop) through a thread-safe queue and receives each step's outputs in one batch through
loop.call_soon_threadsafe, so an HTTP handler never waits on a forward pass and the engine
never waits on a slow client. The forward pass releases the GIL inside torch, so the event
loop keeps serving while a step runs (see experiments/bench_serving.py for the measurement).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from twinserve.core.errors import EngineDeadError, TwinserveError
from twinserve.core.sampling_params import SamplingParams
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.outputs import RequestOutput
from twinserve.backends.real.serving.errors import ServerOverloadedError

logger = logging.getLogger("twinserve.serve")

# The engine thread steps only while fewer than this many of its batches wait for the event loop
# to hand them to the streams. A loop that falls behind (many streams, slow clients, CPU-bound
# handlers) then holds the engine back: outputs do not pile up, and a hung-up client's abort
# reaches the engine a step or two after the loop notices it, not after the request has run out.
MAX_UNDISPATCHED_BATCHES = 2


@dataclass(slots=True, frozen=True)
class EngineSnapshot:
    """Scheduler and KV-cache state after the engine thread's latest iteration."""

    num_running: int = 0
    num_waiting: int = 0
    num_unfinished: int = 0
    kv_usage: float = 0.0
    num_free_blocks: int = 0
    num_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()
    # Tokens scheduled by the latest engine step (0 when no step ran since the last snapshot).
    step_tokens: int = 0
    # Host tier (CoreStats' fields of the same names).
    external_queries: int = 0
    external_hits: int = 0
    offload_bytes_stored: int = 0
    offload_bytes_loaded: int = 0


class EngineObserver(Protocol):
    """Called on the engine thread after every iteration (metrics live behind this seam)."""

    def on_iteration(self, snapshot: EngineSnapshot, outputs: list[RequestOutput], now: float) -> None:
        """Record one iteration's state and outputs."""


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: dict[str, Any]
    params: SamplingParams
    arrival_time: float
    done: concurrent.futures.Future[None]
    priority: int = 0
    cache_salt: str | None = None


@dataclass(slots=True)
class _Abort:
    request_ids: list[str]


class _AbortAll:
    pass


class _Stop:
    pass


class AsyncLLMEngine:
    """Runs an LLMEngine on a background thread and streams its outputs to asyncio consumers."""

    def __init__(self, engine: LLMEngine, max_queued_requests: int | None = None,
                 observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self.observer = observer
        self._cmds: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._stopping = False
        self._live: set[str] = set()  # request ids inside the engine (engine thread only)
        self._undispatched = 0  # batches posted to the loop and not yet dispatched
        self._dispatched = threading.Condition()
        stats = engine.core.stats()
        self.snapshot = EngineSnapshot(num_blocks=stats.num_blocks, num_free_blocks=stats.num_free_blocks)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume outputs."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="twinserve-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        """True while the engine thread is alive and has not failed."""
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def dead_reason(self) -> str | None:
        """Why the engine failed, or None while it is healthy."""
        return None if self._dead is None else f"{type(self._dead).__name__}: {self._dead}"

    @property
    def num_unfinished(self) -> int:
        """Requests accepted by the front end and not yet finished."""
        return len(self._streams)

    def abort_all(self) -> None:
        """Abort every request in flight (finish reason "abort"); new requests are still taken."""
        self._cmds.put(_AbortAll())

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Abort what is in flight, stop the engine thread and release the model's resources."""
        self._stopping = True
        thread = self._thread
        if thread is None:
            return
        self._cmds.put(_Stop())
        await asyncio.to_thread(thread.join, timeout)
        self._thread = None

    # ------------------------------------------------------------------ requests
    def check_alive(self) -> None:
        """Raise EngineDeadError if the engine failed or is shutting down."""
        if self._dead is not None:
            raise EngineDeadError(self.dead_reason or "unknown")
        if self._stopping or self._thread is None:
            raise EngineDeadError("the engine is shutting down")

    def _check_capacity(self) -> None:
        limit = self.max_queued_requests
        if limit is None:
            return
        queued = len(self._streams) - self.snapshot.num_running
        if queued >= limit:
            raise ServerOverloadedError(queued, limit)

    async def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                          prompt: str | None = None, arrival_time: float | None = None, priority: int = 0,
                          cache_salt: str | None = None) -> "RequestStream":
        """Queue a request on the engine thread; its stream, or the engine's typed error."""
        self.check_alive()
        self._check_capacity()
        if request_id in self._streams:
            raise TwinserveError(f"request id {request_id!r} is already in use")
        out_queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = out_queue
        stream = RequestStream(self, request_id, out_queue)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self._cmds.put(_Add(request_id, {"prompt_token_ids": prompt_token_ids, "prompt": prompt},
                            params, arrival, done, priority, cache_salt))
        if self._dead is not None:  # failed after the check: the engine thread may never see the add
            try:
                done.set_exception(EngineDeadError(self.dead_reason or "unknown"))
            except concurrent.futures.InvalidStateError:
                pass
        try:
            await asyncio.wrap_future(done)
        except BaseException as exc:
            # Rejected: nothing to abort. Cancelled while queued: the add may still land, so abort.
            stream.finished = not isinstance(exc, asyncio.CancelledError)
            stream.close()
            raise
        return stream

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       prompt: str | None = None, arrival_time: float | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs until it finishes; leaving early aborts it."""
        stream = await self.add_request(request_id, prompt_token_ids, params, prompt, arrival_time)
        async for out in stream:
            yield out

    def abort(self, request_ids: str | list[str]) -> None:
        """Abort requests (non-blocking): their KV blocks are freed before the next step."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._cmds.put(_Abort(ids))

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                idle = not engine.has_unfinished_requests()
                if not idle:
                    self._wait_for_loop()
                cmds = [self._cmds.get()] if idle else []
                while True:
                    try:
                        cmds.append(self._cmds.get_nowait())
                    except queue.Empty:
                        break
                outputs: list[RequestOutput] = []
                for cmd in cmds:
                    if isinstance(cmd, _Stop):
                        outputs.extend(engine.abort_request(list(self._live)))
                        self._publish(outputs)
                        engine.shutdown()
                        return
                    outputs.extend(self._handle(cmd))
                if engine.has_unfinished_requests():
                    outputs.extend(engine.step())
                self._publish(outputs)
        except BaseException as exc:  # the engine is unusable: fail every stream, keep the reason
            # The whole story (a worker's traceback, paths) goes to the log; clients get a short reason.
            logger.error("the engine failed; every request in flight ends with a 503", exc_info=exc)
            self._dead = exc
            self._fail_all(EngineDeadError(f"{type(exc).__name__}: {exc}"))

    def _handle(self, cmd: Any) -> list[RequestOutput]:
        engine = self.engine
        if isinstance(cmd, _Add):
            # A client that left while the add was queued cancelled its future: add nothing. Once running,
            # the future cannot be cancelled, so setting it below never raises (that killed the engine);
            # a client leaving from here on aborts the request with a command after this one.
            if not cmd.done.set_running_or_notify_cancel():
                return []
            try:
                engine.add_request(cmd.request_id, cmd.prompt, cmd.params, arrival_time=cmd.arrival_time,
                                   output_kind="delta", priority=cmd.priority, cache_salt=cmd.cache_salt)
            except Exception as exc:  # a bad request never takes the engine down
                cmd.done.set_exception(exc)
            else:
                self._live.add(cmd.request_id)
                cmd.done.set_result(None)
            return []
        if isinstance(cmd, _Abort):
            return engine.abort_request(cmd.request_ids)
        if isinstance(cmd, _AbortAll):
            return engine.abort_request(list(self._live))
        raise TypeError(f"unknown engine command {cmd!r}")

    def _publish(self, outputs: list[RequestOutput]) -> None:
        engine = self.engine
        s = engine.core.stats()
        last = engine.last_stats
        step_tokens = last.num_scheduled_tokens if last is not None and s.num_steps > self.snapshot.num_steps else 0
        snap = EngineSnapshot(s.num_running, s.num_waiting, engine.get_num_unfinished_requests(),
                              s.kv_usage, s.num_free_blocks, s.num_blocks, s.prefix_queries, s.prefix_hits,
                              s.num_preemptions, s.num_steps, s.spec_num_drafts, s.spec_num_draft_tokens,
                              s.spec_num_accepted_tokens, tuple(s.spec_accepted_per_pos), step_tokens,
                              s.external_queries, s.external_hits, s.offload_bytes_stored, s.offload_bytes_loaded)
        self.snapshot = snap
        for out in outputs:
            if out.finished:
                self._live.discard(out.request_id)
        if self.observer is not None:
            self.observer.on_iteration(snap, outputs, time.monotonic())
        if outputs:
            with self._dispatched:
                self._undispatched += 1
            if not self._call_in_loop(self._dispatch, outputs):
                self._mark_dispatched()

    def _wait_for_loop(self) -> None:
        """Block until the event loop has caught up to within MAX_UNDISPATCHED_BATCHES."""
        with self._dispatched:
            while self._undispatched >= MAX_UNDISPATCHED_BATCHES:
                loop = self._loop
                if self._stopping or loop is None or loop.is_closed():
                    return
                self._dispatched.wait(0.1)

    def _mark_dispatched(self) -> None:
        with self._dispatched:
            self._undispatched -= 1
            self._dispatched.notify()

    def _call_in_loop(self, fn: Any, arg: Any) -> bool:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, arg)
                return True
            except RuntimeError:  # the loop closed between the check and the call
                pass
        return False

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        streams = self._streams
        for out in outputs:
            q = streams.get(out.request_id) if not out.finished else streams.pop(out.request_id, None)
            if q is not None:
                q.put_nowait(out)
        self._mark_dispatched()

    def _fail_all(self, exc: EngineDeadError) -> None:
        while True:  # adds still queued get the error too
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                try:
                    cmd.done.set_exception(exc)
                except concurrent.futures.InvalidStateError:
                    pass

        def fail(e: BaseException) -> None:
            for q in list(self._streams.values()):
                q.put_nowait(e)

        self._call_in_loop(fail, exc)



class RequestStream:
    """One request's outputs as an async iterator; close() (or leaving the loop early) aborts it."""

    def __init__(self, engine: AsyncLLMEngine, request_id: str,
                 out_queue: asyncio.Queue[RequestOutput | BaseException]) -> None:
        self.engine = engine
        self.request_id = request_id
        self.finished = False
        self._queue = out_queue
        self._closed = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True  # the engine already dropped it
                    raise item
                if item.finished:
                    self.finished = True
                yield item
                if self.finished:
                    return
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening; a request that has not finished is aborted and its KV blocks freed."""
        if self._closed:
            return
        self._closed = True
        self.engine._streams.pop(self.request_id, None)
        if not self.finished:
            self.engine.abort(self.request_id)
