"""Run study points in parallel: a local process pool or Ray tasks, with one progress bar.

Both back ends run the same pickled job through the same function, so results are identical.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import signal
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait as mp_wait
from typing import Any, Callable, Sequence

from twinserve.sim.errors import SimError

LOCAL_RAY = "local"


def workers_arg(text: str) -> int:
    """argparse type of --workers: an integer >= 1 (a bad count is a usage error, exit 2, never ignored)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give a number of processes >= 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give a number of processes >= 1 (leave --workers out for one per CPU)")
    return n


class RayUnavailableError(SimError, RuntimeError):
    """--ray was asked for but Ray is not installed or the cluster cannot be reached."""


class PointError(SimError, RuntimeError):
    """Some points of a sweep or search failed (each named with its config)."""

    def __init__(self, failures: Sequence["PointFailure"]) -> None:
        self.failures = list(failures)
        super().__init__("; ".join(f.describe() for f in self.failures))


@dataclass(slots=True)
class PointFailure:
    """One point that raised: its grid values, the error and where it came from."""

    point: dict[str, Any]
    error: str
    traceback: str = ""

    def describe(self) -> str:
        """One line for the user: the point's config and what went wrong."""
        where = ", ".join(f"{k}={v}" for k, v in self.point.items()) or "(base config)"
        return f"point {where} failed: {self.error}"


def _guarded(fn: Callable[[Any], Any], job: Any) -> Any:
    """Run fn(job) and hand back the exception instead of raising (kept picklable)."""
    try:
        return fn(job)
    except Exception as e:  # noqa: BLE001 - the caller reports it with the point's config
        return _Raised(f"{type(e).__name__}: {e}", traceback.format_exc())


@dataclass(slots=True)
class _Raised:
    error: str
    traceback: str


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="pt")


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], points: Sequence[dict[str, Any]],
             workers: int | None = None, ray_address: str | None = None,
             desc: str = "sweep", progress: bool = True,
             pool: ProcessPoolExecutor | None = None,
             on_result: Callable[[int, Any], None] | None = None,
             max_worker_rss: int | None = None) -> list[Any]:
    """fn over jobs, in job order; a job that raised becomes a PointFailure for its point.

    pool: a process pool to reuse across calls (a search runs many small rounds).
    on_result(i, result): called in this process as each job ends, in the order they end (a
    long study journals its finished points, so an interrupted run keeps them).
    Without a pool, several workers run in _Workers: a worker that dies fails only its own job
    (after one retry alone), and max_worker_rss (bytes) replaces a worker whose private resident
    memory passes it after a job (None: never). Ray retries its own tasks.
    """
    bar = _bar(len(jobs), desc, progress)

    def done(i: int, r: Any) -> None:
        if on_result is not None:
            on_result(i, _as_failure(points[i], r))
        if bar is not None:
            bar.update()
    try:
        if ray_address is not None:
            raw = _run_ray(fn, jobs, ray_address, workers, done)
        else:
            raw = _run_local(fn, jobs, workers, done, pool, max_worker_rss)
    finally:
        if bar is not None:
            bar.close()
    return [_as_failure(p, r) for p, r in zip(points, raw)]


def _as_failure(point: dict[str, Any], r: Any) -> Any:
    return PointFailure(point, r.error, r.traceback) if isinstance(r, _Raised) else r


def _run_local(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None,
               done: Callable[[int, Any], None], pool: ProcessPoolExecutor | None = None,
               max_worker_rss: int | None = None) -> list[Any]:
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    out: list[Any] = [None] * len(jobs)
    if pool is None and (workers <= 1 or len(jobs) <= 1):
        for i, job in enumerate(jobs):
            out[i] = _guarded(fn, job)
            done(i, out[i])
        return out
    if pool is None:
        return _Workers(fn, min(workers, len(jobs)), max_worker_rss).run(jobs, done)
    futures = {pool.submit(_guarded, fn, job): i for i, job in enumerate(jobs)}
    for fut in as_completed(futures):
        i = futures[fut]
        try:
            out[i] = fut.result()
        except Exception as e:  # noqa: BLE001 - a worker process died
            out[i] = _Raised(f"{type(e).__name__}: {e}", "")
        done(i, out[i])
    return out


def _rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none: never retired)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _private_bytes() -> int:
    """The resident memory this process alone holds: its private pages (Linux smaps_rollup), the
    resident memory where the kernel has no rollup.

    A worker forked from a parent that loaded shared tables first (sim.validate.preload_aic) maps
    those pages too; they count in its RSS, but retiring the worker would give none of them back.
    """
    try:
        with open("/proc/self/smaps_rollup") as f:
            kb = sum(int(line.split()[1]) for line in f
                     if line.startswith(("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:")))
        return kb * 1024
    except (OSError, ValueError, IndexError):
        return _rss_bytes()


def _worker_loop(fn: Callable[[Any], Any], conn: Connection, max_rss: int | None) -> None:
    """A worker: run each (i, job) it is sent; answer (i, result, retiring). It retires (exits after
    answering) once its private resident memory passes max_rss: what a big study leaves allocated
    (freed objects whose arenas the allocator keeps) is given back to the system only by the process's
    end. Pages it shares with the parent it was forked from are not its to give back, so not counted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the workers
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if msg is None:
            return
        i, job = msg
        r = _guarded(fn, job)
        retiring = max_rss is not None and _private_bytes() > max_rss
        try:
            conn.send((i, r, retiring))
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            conn.send((i, _Raised(f"{type(e).__name__}: the result cannot be sent back: {e}", ""), retiring))
        if retiring:
            return


def _death(exitcode: int | None) -> str:
    """How a worker process ended, in words: 'signal 9, SIGKILL: killed, out of memory?'."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "?"
        why = {"SIGKILL": ": killed, out of memory?", "SIGSEGV": ": a crash"}.get(name, "")
        return f"signal {-exitcode}, {name}{why}"
    return f"exit status {exitcode}"


class _Workers:
    """A process pool that survives its workers: each worker runs one job at a time, so the job a
    dead worker (killed for memory, crashed) was running is known. That worker is replaced and the
    queue goes on; its job runs once more, alone (no other job runs beside it: a kill for memory may
    have been the two jobs' together), and if that worker dies too it is reported with how it died.
    A worker whose private resident memory passes max_rss after a job is replaced by a fresh one
    (_worker_loop). concurrent.futures' pool fails every queued job once one worker dies."""

    def __init__(self, fn: Callable[[Any], Any], n: int, max_rss: int | None) -> None:
        self.fn, self.n, self.max_rss = fn, n, max_rss
        self.ctx = multiprocessing.get_context()
        self.busy: dict[Any, tuple[Connection, int]] = {}  # process -> (its pipe, its job)
        self.idle: list[tuple[Any, Connection]] = []

    def _start(self) -> tuple[Any, Connection]:
        mine, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_loop, args=(self.fn, theirs, self.max_rss))
        proc.start()
        theirs.close()
        return proc, mine

    def _send(self, i: int, job: Any) -> Any:
        """Job i to an idle (or new) worker; a _Raised when the job cannot be sent (does not pickle)."""
        proc, conn = self.idle.pop() if self.idle else self._start()
        try:
            conn.send((i, job))
        except (OSError, EOFError):  # the idle worker died meanwhile: another one
            self._end(proc, conn)
            return self._send(i, job)
        except Exception as e:  # noqa: BLE001 - the job does not pickle
            self.idle.append((proc, conn))
            return _Raised(f"{type(e).__name__}: the job cannot be sent to a worker: {e}", "")
        self.busy[proc] = (conn, i)
        return None

    @staticmethod
    def _end(proc: Any, conn: Connection) -> None:
        conn.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()

    def run(self, jobs: Sequence[Any], done: Callable[[int, Any], None]) -> list[Any]:
        out: list[Any] = [None] * len(jobs)
        queue = list(range(len(jobs)))[::-1]  # popped from the end: job order
        again: list[int] = []  # jobs whose worker died: each runs once more, alone
        retried: set[int] = set()
        left = len(jobs)
        # Forked workers share this process's pages until they write to them; a collection in a worker
        # writes to every object it visits. Frozen, this process's objects are not visited there.
        frozen = self.ctx.get_start_method() == "fork"
        if frozen:
            gc.freeze()

        def finish(i: int, r: Any) -> None:
            nonlocal left
            out[i] = r
            left -= 1
            done(i, r)
        try:
            while left:
                alone = any(i in retried for _, i in self.busy.values())
                while not alone and len(self.busy) < self.n and (queue or again):
                    if again and not self.busy:
                        i = again.pop(0)
                        retried.add(i)
                        alone = True
                    elif queue:
                        i = queue.pop()
                    else:
                        break  # a retry waits for the running jobs to end
                    bad = self._send(i, jobs[i])
                    if bad is not None:
                        finish(i, bad)
                if not self.busy:
                    continue
                waits = {c: p for p, (c, _) in self.busy.items()} | {p.sentinel: p for p in self.busy}
                for ready in mp_wait(list(waits)):
                    proc = waits[ready]
                    if proc not in self.busy:
                        continue  # its pipe and its sentinel were both ready
                    conn, i = self.busy.pop(proc)
                    try:
                        got = conn.recv() if conn.poll() else None
                    except (EOFError, OSError):
                        got = None
                    if got is None:  # it died running job i
                        self._end(proc, conn)
                        if i in retried:
                            finish(i, _Raised(f"worker died ({_death(proc.exitcode)}) while running it, "
                                              "twice: the second time alone", ""))
                        else:
                            again.append(i)
                        continue
                    _, r, retiring = got
                    if retiring:
                        self._end(proc, conn)
                    else:
                        self.idle.append((proc, conn))
                    finish(i, r)
        finally:
            for proc, (conn, _) in list(self.busy.items()):
                proc.kill()
                self._end(proc, conn)
            for proc, conn in self.idle:
                try:
                    conn.send(None)
                except (OSError, EOFError):
                    pass
                self._end(proc, conn)
            if frozen:
                gc.unfreeze()
        return out


def ray_init(address: str, workers: int | None = None) -> Any:
    """Connect to the Ray cluster at address, or start a local one ('local'); returns ray."""
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("--ray needs Ray: pip install 'twinserve[ray]'") from None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
        try:
            if address == LOCAL_RAY:
                ray.init(num_cpus=workers or os.cpu_count() or 1, **kwargs)
            else:
                ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - connection errors have many types
            raise RayUnavailableError(f"cannot start or reach Ray at {address!r}: {e}") from None
    return ray


def _run_ray(fn: Callable[[Any], Any], jobs: Sequence[Any], address: str, workers: int | None,
             done_cb: Callable[[int, Any], None]) -> list[Any]:
    ray = ray_init(address, workers)
    task = ray.remote(_guarded)
    fn_ref = ray.put(fn)
    refs = {task.remote(fn_ref, job): i for i, job in enumerate(jobs)}
    out: list[Any] = [None] * len(jobs)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            try:
                out[refs[ref]] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - the task's worker died
                out[refs[ref]] = _Raised(f"{type(e).__name__}: {e}", "")
            done_cb(refs[ref], out[refs[ref]])
    return out
