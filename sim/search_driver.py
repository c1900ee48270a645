"""Drive many rate searches at once: one run in flight per configuration, a run started the
moment a worker frees (no rounds), and configurations not yet started placed by the answers
of those that have (their estimate times the measured/estimated ratio so far).
"""

from __future__ import annotations

import contextlib
import math
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Protocol, Sequence

from twinserve.sim.runner import PointFailure, _guarded, _Raised, ray_init
from twinserve.sim.search_disagg import neighbour_splits


_STEP_ESTIMATED = 1.5
_STEP_CALIBRATED = 1.2
# A first run placed from the cost model is put this much above its calibrated estimate: such
# starts landed at 0.5-0.75 of the answer on the FP8 8x H200 question (the estimate's error
# drifts with TP and split, so neighbours calibrate it short), a pass there runs whole and two
# passes below the answer cost more than a miss above it, which stops early (1.0, 1.25, 1.4
# tried there: 1.25 simulated the fewest requests).
_START_UP = 1.25


class SearchLike(Protocol):
    """What the driver needs of a sim.search.RateSearch."""

    point: dict[str, Any]
    start: float
    estimate: float
    lo: float
    hi: float
    step: float
    error: str
    near_step: float

    def next_rate(self) -> float | None: ...
    def record(self, rate: float, row: dict[str, Any], ok: bool) -> None: ...


def calibration(searches: Sequence[SearchLike], near: SearchLike | None = None) -> float:
    """Geometric mean of found/estimated rate over the searches bracketed so far (1 if none);
    with near, only over its nearest neighbours (sim.search_driver.likeness)."""
    done = [s for s in searches if s.estimate > 0 and s.lo > 0 and math.isfinite(s.hi)]
    if near is not None and done:
        # The estimate errs differently for aggregated and disaggregated runs, and by TP.
        best = max(likeness(near, s) for s in done)
        done = [s for s in done if likeness(near, s) == best]
    logs = [math.log(math.sqrt(s.lo * s.hi) / s.estimate) for s in done]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def on_grid(ratio: float, grid: float) -> float:
    """ratio (of bracket midpoints to their estimates) taken to the nearest whole power of
    grid (ratio itself when grid <= 1).

    A search started on its grid at g^k settles in two runs when its answer lies in the grid
    bracket just under or just over g^k (a pass then a miss one step up, or a miss then a pass
    one step down): the start nearest the expected answer centres that two-bracket window on
    it. Taken down (the bottom of the bracket the midpoints lie in) the window sat up to one
    step low, and seeds landing one step above their start took three runs, two of them
    passes (FP8 8x H200 question: seed 1 lands ~8% above seed 0 on most configurations)."""
    if grid <= 1.0 or ratio <= 0.0:
        return ratio
    return grid ** math.floor(math.log(ratio) / math.log(grid) + 0.5)


def neighbour_answer(s: SearchLike, searches: Sequence[SearchLike]) -> float:
    """The highest answer of s's neighbouring prefill/decode splits bracketed so far (0: none).

    The estimate's error changes sign across the splits (prefill-bound ones are overrated,
    decode-bound ones underrated), while a neighbour's answer is near; starting above the
    answer costs less than below it (a run over its SLOs stops early, one under them runs
    whole), so the higher of the two starts. A neighbour still searching (two workers) counts
    with the highest rate it passed so far: its answer is at least that."""
    return max((o.lo for o in searches if o.lo > 0 and neighbour_splits(s.point, o.point)),
               default=0.0)


def likeness(a: SearchLike, b: SearchLike) -> int:
    """How alike two configurations are: same kind of mode (agg/disagg) first, then each
    other grid value they share."""
    kind = (str(a.point.get("mode", "agg")).split() or [""])[0] == \
        (str(b.point.get("mode", "agg")).split() or [""])[0]
    same = sum(1 for k, v in a.point.items() if k != "mode" and b.point.get(k) == v)
    return 100 * kind + same


# The pool every stage of one search shares (search_pool), else None: each drive makes its own.
_SHARED: ProcessPoolExecutor | None = None


@contextlib.contextmanager
def search_pool(workers: int | None, ray_address: str | None = None) -> Iterator[None]:
    """One process pool for every drive() inside (a search's first length, rechecks and seed
    stages), shut down on exit. Its workers are forked once, after the imports, and keep what
    a run leaves for the next (KV blocks, core.kv.block_pool.BlockPool.recycle), where a pool
    a stage forked workers four times a search and each began with no spare blocks. Nothing
    with Ray or one worker."""
    global _SHARED
    n = workers or os.cpu_count() or 1
    if ray_address is not None or n <= 1 or _SHARED is not None:
        yield
        return
    _SHARED = ProcessPoolExecutor(n)
    # Fork the workers now (a forking pool starts all of them at its first job), so that what the
    # main process loads from here on (sim.search_cli._load_report) is not copied into them.
    _SHARED.submit(int).result()
    try:
        yield
    finally:
        pool, _SHARED = _SHARED, None
        pool.shutdown()


class _Local:
    """Jobs on a process pool (search_pool's, else one of its own), or inline with one worker."""

    def __init__(self, workers: int) -> None:
        self.own = workers > 1 and _SHARED is None
        self.pool = (ProcessPoolExecutor(workers) if self.own
                     else _SHARED if workers > 1 else None)
        self.done: list[tuple[Any, Any]] = []

    def submit(self, fn: Callable[[Any], Any], job: Any) -> Any:
        if self.pool is None:
            token = object()
            self.done.append((token, _guarded(fn, job)))
            return token
        return self.pool.submit(_guarded, fn, job)

    def wait(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        if self.pool is None:
            out, self.done = self.done, []
            return out
        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        out = []
        for f in done:
            try:
                out.append((f, f.result()))
            except Exception as e:  # noqa: BLE001 - a worker process died
                out.append((f, _Raised(f"{type(e).__name__}: {e}", "")))
        return out

    def close(self) -> None:
        if self.pool is not None and self.own:
            self.pool.shutdown()


class _Ray:
    """Jobs as Ray tasks."""

    def __init__(self, address: str, workers: int | None) -> None:
        self.ray = ray_init(address, workers)
        self.task = self.ray.remote(_guarded)
        self.fn_ref: Any = None

    def submit(self, fn: Callable[[Any], Any], job: Any) -> Any:
        if self.fn_ref is None:
            self.fn_ref = self.ray.put(fn)
        return self.task.remote(self.fn_ref, job)

    def wait(self, handles: list[Any]) -> list[tuple[Any, Any]]:
        done, _ = self.ray.wait(handles, num_returns=1)
        out = []
        for ref in done:
            try:
                out.append((ref, self.ray.get(ref)))
            except Exception as e:  # noqa: BLE001 - the task's worker died
                out.append((ref, _Raised(f"{type(e).__name__}: {e}", "")))
        return out

    def close(self) -> None:
        pass


def _calibrator_in_flight(s: SearchLike, searches: Sequence[SearchLike],
                          inflight: dict[Any, tuple[SearchLike, float]]) -> bool:
    """True while a search of s's group now running is more like s (likeness) than every one
    bracketed so far: its bracket is what s would calibrate its start by, once it lands.

    One worker starts each search with every earlier answer in hand; two started the next
    configuration beside the one running, from an older calibration (no answer at all for the
    second), and the starts landed further off: FP8 8x H200 question, two workers emulated
    (experiments/search_workers_emulated.py): 155 runs and 11.5 s virtual wall, 136 runs and
    10.5 s with the wait (one worker: 138), every answer within the one-worker search's bands."""
    group = getattr(s, "group", 0)
    done = [o for o in searches if getattr(o, "group", 0) == group and o.estimate > 0
            and o.lo > 0 and math.isfinite(o.hi)]
    best = max((likeness(s, o) for o in done), default=-1)
    return any(getattr(o, "group", 0) == group and o.estimate > 0 and likeness(s, o) > best
               for o, _ in inflight.values())


def drive(searches: Sequence[SearchLike], fn: Callable[[Any], dict[str, Any]],
          make_job: Callable[[SearchLike, float], Any], judge: Callable[[dict[str, Any]], bool],
          workers: int | None = None, ray_address: str | None = None, bar: Any = None,
          settled: Callable[[SearchLike, Sequence[SearchLike]], bool] | None = None) -> None:
    """Run every search to its end; fn(make_job(s, rate)) gives the row judge() passes or fails;
    settled(s, searches) True ends a search before its bracket is narrow (sim.search_screen)."""
    n = workers or min(len(searches), os.cpu_count() or 1) or 1
    backend: _Local | _Ray = _Ray(ray_address, workers) if ray_address is not None else _Local(n)
    slots = n if ray_address is None else (workers or len(searches))
    inflight: dict[Any, tuple[SearchLike, float]] = {}
    busy: set[int] = set()
    floor = getattr(settled, "floor", None)
    try:
        while True:
            # Started searches first: an unstarted one gains from every answer that lands before it.
            order = sorted((s for s in searches if id(s) not in busy), key=lambda s: s.lo == 0 and
                           math.isinf(s.hi))
            for s in order:
                if len(inflight) >= slots:
                    break
                if s.start == 0.0 and s.estimate > 0 and s.lo == 0.0 and math.isinf(s.hi):
                    near = s.near_step
                    # A nearby answer (the shorter runs') moves alike for every configuration:
                    # all such searches calibrate it; a cost-model estimate errs by kind.
                    group = getattr(s, "group", 0)
                    # A start from the cost model waits (its worker idle, at most half the
                    # slots) for the bracket of a more alike search in flight.
                    if not near and 2 * len(inflight) >= slots and _calibrator_in_flight(
                            s, searches, inflight):
                        continue
                    cal = calibration([o for o in searches if getattr(o, "group", 0) == group],
                                      None if near else s)
                    s.start = s.estimate * on_grid(cal, getattr(s, "grid", 0.0))
                    if not near:
                        s.start = max(s.start * _START_UP, neighbour_answer(s, searches))
                    # A start placed by other answers is near; a raw estimate may be far off.
                    s.step = near or (_STEP_CALIBRATED if cal != 1.0 else _STEP_ESTIMATED)
                if settled is not None and settled(s, searches):
                    continue
                rate = s.next_rate()
                if rate is None:
                    continue
                if floor is not None and s.lo == 0.0:
                    # With no pass yet, below this rate a miss shows it dearer than the cheapest
                    # (sim.search_screen.out_of_reach): run there instead of lower, a pass there
                    # is a higher first pass and a miss ends the search.
                    f = float(f"{floor(s, searches) * (1 - 1e-5):.6g}")  # at or under it
                    if rate < f < s.hi and f not in s.runs:
                        rate = f
                inflight[backend.submit(fn, make_job(s, rate))] = (s, rate)
                busy.add(id(s))
            if not inflight:
                return
            for h, res in backend.wait(list(inflight)):
                s, rate = inflight.pop(h)
                busy.discard(id(s))
                if isinstance(res, _Raised):
                    s.error = PointFailure(dict(s.point, rate=rate), res.error).describe()
                else:
                    s.record(rate, res, judge(res))
                if bar is not None:
                    bar.update(1)
    finally:
        backend.close()
