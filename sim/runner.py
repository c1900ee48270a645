"""Run study points in parallel: a local process pool or Ray tasks, with one progress bar.

Both back ends run the same pickled job through the same function, so results are identical.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
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
             on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
    """fn over jobs, in job order; a job that raised becomes a PointFailure for its point.

    pool: a process pool to reuse across calls (a search runs many small rounds).
    on_result(i, result): called in this process as each job ends, in the order they end (a
    long study journals its finished points, so an interrupted run keeps them).
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
            raw = _run_local(fn, jobs, workers, done, pool)
    finally:
        if bar is not None:
            bar.close()
    return [_as_failure(p, r) for p, r in zip(points, raw)]


def _as_failure(point: dict[str, Any], r: Any) -> Any:
    return PointFailure(point, r.error, r.traceback) if isinstance(r, _Raised) else r


def _run_local(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int | None,
               done: Callable[[int, Any], None], pool: ProcessPoolExecutor | None = None) -> list[Any]:
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    out: list[Any] = [None] * len(jobs)
    if pool is None and (workers <= 1 or len(jobs) <= 1):
        for i, job in enumerate(jobs):
            out[i] = _guarded(fn, job)
            done(i, out[i])
        return out
    with contextlib.nullcontext(pool) if pool is not None else \
            ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_guarded, fn, job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                out[i] = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker process died
                out[i] = _Raised(f"{type(e).__name__}: {e}", "")
            done(i, out[i])
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
