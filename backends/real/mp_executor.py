"""The multiprocess executor: one worker process per tensor-parallel rank.

Each step's SchedulerOutput is serialized once and sent to every rank; rank 0 alone answers. The
executor also waits on every worker's sentinel, so a dead worker raises EngineDeadError, not a hang.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

from twinserve.core.errors import EngineDeadError
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.models.registry import ModelSource
from twinserve.backends.real.procs import EngineStartupError, die_with_parent, exit_description, spawn_context, stop_process
from twinserve.backends.real.model_runner import StepShape

# A worker has this long to load its model and join the process group.
WORKER_STARTUP_TIMEOUT_S = 600.0
_PICKLE = pickle.HIGHEST_PROTOCOL


def run_worker(rank: int, world_size: int, conn: Connection, args: EngineArgs, max_model_len: int,
               eos_ids: list[int], source: ModelSource | None, dist_file: str, parent_pid: int,
               num_threads: int) -> None:
    """Entry point of one worker process: join the group, build the Worker, serve commands."""
    die_with_parent(parent_pid)
    try:
        import torch

        torch.set_num_threads(num_threads)
        from twinserve.backends.real.models.parallel import TensorParallel
        from twinserve.backends.real.worker import Worker

        tp = None
        if world_size > 1:
            import torch.distributed as dist

            device = args.resolve_device()
            if device.type == "cuda":
                torch.cuda.set_device(rank)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    init_method=f"file://{dist_file}", rank=rank, world_size=world_size)
            tp = TensorParallel(rank, world_size)
        if args.device in ("auto", "cuda") and torch.cuda.is_available():
            args.device = f"cuda:{rank}"
        worker = Worker(args, max_model_len, eos_ids, source=source, tp=tp)
        conn.send_bytes(pickle.dumps(("ready", (os.getpid(), worker.kv_bytes_per_token)), _PICKLE))
    except BaseException:
        _send_error(conn, rank, "while starting")
        raise SystemExit(1)
    try:
        _serve(rank, worker, conn)
    except BaseException:
        _send_error(conn, rank, "while running")
        raise SystemExit(1)


def _serve(rank: int, worker: Any, conn: Connection) -> None:
    while True:
        kind, payload = pickle.loads(conn.recv_bytes())
        if kind == "execute":
            out = worker.execute_model(payload)
            if rank == 0:
                conn.send_bytes(pickle.dumps(("ok", (out, worker.last_step_shape, worker.last_step_timing,
                                                     worker.last_comm_time)), _PICKLE))
        elif kind == "call":
            name, call_args = payload
            conn.send_bytes(pickle.dumps(("ok", getattr(worker, name)(*call_args)), _PICKLE))
        elif kind == "shutdown":
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            return


def _send_error(conn: Connection, rank: int, when: str) -> None:
    try:
        conn.send_bytes(pickle.dumps(("error", f"worker rank {rank} failed {when}:\n{traceback.format_exc()}"),
                                     _PICKLE))
    except Exception:
        pass


class MultiprocExecutor:
    """Drives tensor_parallel_size worker processes; satisfies core.Executor."""

    def __init__(self, args: EngineArgs, max_model_len: int, eos_ids: list[int],
                 source: ModelSource | None) -> None:
        import torch

        self.world_size = args.tensor_parallel_size
        self.num_steps = 0
        self.last_step_shape = StepShape()
        self.last_step_timing = (0.0, 0.0, 0.0)
        # Rank 0's seconds in collectives in the step just run.
        self.last_comm_time = 0.0
        self._dir = tempfile.mkdtemp(prefix="twinserve-tp-")
        self._dead: str | None = None
        self._closed = False
        ctx = spawn_context()
        self.procs = []
        self.conns: list[Connection] = []
        self._inbox: list[deque[Any]] = [deque() for _ in range(self.world_size)]
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(target=run_worker, name=f"twinserve-worker-{rank}", daemon=True,
                            args=(rank, self.world_size, child_end, args, max_model_len, eos_ids, source,
                                  os.path.join(self._dir, "dist_init"), os.getpid(),
                                  torch.get_num_threads()))
            p.start()
            child_end.close()
            self.procs.append(p)
            self.conns.append(parent_end)
        try:
            ready = [self._recv(rank, WORKER_STARTUP_TIMEOUT_S, "starting") for rank in range(self.world_size)]
        except EngineDeadError as e:
            self.shutdown()
            raise EngineStartupError(str(e)) from None
        self.worker_pids = [pid for pid, _ in ready]
        self.kv_bytes_per_token = max(b for _, b in ready)

    # ------------------------------------------------------------------ plumbing
    def _check_dead(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)

    def _fail(self, reason: str) -> None:
        time.sleep(0.2)  # a peer's collective error usually means a worker just died: name it
        gone = [f"worker rank {r} (pid {p.pid}) {exit_description(p.exitcode)}"
                for r, p in enumerate(self.procs) if not p.is_alive()]
        if gone:
            reason = f"{'; '.join(gone)}. {reason}"
        self._dead = reason
        self.shutdown()
        raise EngineDeadError(reason)

    def _recv(self, rank: int, timeout: float | None, doing: str) -> Any:
        """Rank's next reply; an error from any rank, or any rank's death, raises EngineDeadError."""
        watch: list[Any] = list(self.conns) + [p.sentinel for p in self.procs]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._inbox[rank]:
                return self._inbox[rank].popleft()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(watch, left)
            if not ready:
                self._fail(f"worker rank {rank} did not answer within {timeout:.0f} s while {doing}")
            for r, conn in enumerate(self.conns):  # any rank's error counts, not only the awaited one's
                if conn in ready:
                    kind, payload = self._read(r, conn, doing)
                    if kind == "error":
                        self._fail(payload)
                    self._inbox[r].append(payload)
            if self._inbox[rank]:
                continue
            for r, p in enumerate(self.procs):
                if p.sentinel in ready:
                    p.join(0.1)
                    self._fail(f"worker rank {r} (pid {p.pid}) died while {doing} "
                               f"({exit_description(p.exitcode)})")

    def _read(self, rank: int, conn: Connection, doing: str) -> tuple[str, Any]:
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            p = self.procs[rank]
            p.join(1.0)
            self._fail(f"worker rank {rank} (pid {p.pid}) died while {doing} ({exit_description(p.exitcode)})")
            raise AssertionError("unreachable")

    def _broadcast(self, blob: bytes) -> None:
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(blob)
            except (BrokenPipeError, OSError):
                p = self.procs[rank]
                p.join(1.0)
                self._fail(f"worker rank {rank} (pid {p.pid}) is gone ({exit_description(p.exitcode)})")

    def _call_all(self, name: str, *call_args: Any) -> list[Any]:
        self._check_dead()
        self._broadcast(pickle.dumps(("call", (name, call_args)), _PICKLE))
        return [self._recv(rank, None, f"running {name}") for rank in range(self.world_size)]

    # ------------------------------------------------------------------ Executor
    def initialize_kv_cache(self) -> int:
        """Every rank sizes its KV cache; all allocate the smallest count (still start-up)."""
        try:
            num_blocks = min(self._call_all("determine_num_blocks"))
            self._call_all("init_kv_cache", num_blocks)
        except EngineDeadError as e:
            raise EngineStartupError(str(e)) from None
        return num_blocks

    def host_tier(self) -> tuple[int, int]:
        """(host-tier blocks every rank holds, rank 0's bytes per block)."""
        tiers = self._call_all("host_tier")
        return min(n for n, _ in tiers), tiers[0][1]

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Broadcast the step, wait for rank 0's output, log shape, time and communication."""
        self._check_dead()
        self._broadcast(pickle.dumps(("execute", scheduler_output), _PICKLE))
        out, self.last_step_shape, self.last_step_timing, self.last_comm_time = self._recv(
            0, None, "executing a step")
        self.num_steps += 1
        return out

    def set_timing(self, on: bool) -> None:
        """Time each step's phases on every rank."""
        self._call_all("set_timing", on)

    def shutdown(self) -> None:
        """Stop every worker (politely, then by force) and reap them; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._dead is None:
            blob = pickle.dumps(("shutdown", None), _PICKLE)
            for conn in self.conns:
                try:
                    conn.send_bytes(blob)
                except OSError:
                    pass
        for p in self.procs:
            stop_process(p, timeout=5.0 if self._dead is None else 0.5)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)
