"""`simulate search`'s one process pool for every stage (sim.search_driver.search_pool)."""

from __future__ import annotations

import os
from typing import Any

import pytest

import twinserve.sim.search as search_mod
from twinserve.sim import search_driver
from twinserve.sim.config import set_field
from twinserve.sim.convergence import converged_search
from twinserve.sim.search_band import search_seeds
from twinserve.sim.search_driver import search_pool
from twinserve.sim.search_run import run_search_point

from .helpers import small_config

SLOS = {"p99_ttft_s": 2.0, "p99_tpot_s": 0.1}


def _with_pid(job: Any) -> dict[str, Any]:
    """run_search_point, and which process ran it (module level: pickled by name)."""
    return dict(run_search_point(job), worker_pid=os.getpid())


def _study() -> Any:
    # One configuration: one run in flight at a time, so the runs do not depend on which
    # worker finishes first, and any two ways of running them must agree exactly.
    cfg = small_config(num_requests=80)
    set_field(cfg, "search.requests_per_run", 80)
    set_field(cfg, "search.max_requests_per_run", 160)
    set_field(cfg, "search.band_seeds", 2)
    return cfg


def _search(shared: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], set[int], int]:
    monkeypatch.setattr(search_mod, "run_search_point", _with_pid)
    pids: set[int] = set()
    record = search_mod.RateSearch.record

    def noted(self: Any, rate: float, row: dict[str, Any], ok: bool) -> None:
        pids.add(row["worker_pid"])  # every run of every stage
        record(self, rate, row, ok)

    monkeypatch.setattr(search_mod.RateSearch, "record", noted)
    cfg = _study()

    def stages() -> list[Any]:
        found = converged_search(cfg, {}, SLOS, workers=2, progress=False)
        search_seeds(found, SLOS, 2, None, False)
        return found

    if shared:
        with search_pool(2):
            found = stages()
    else:
        found = stages()
    return found, pids, sum(s.runs_total for s in found)


def _answers(found: list[Any]) -> list[tuple]:
    return [(s.lo, s.hi, s.lengths, s.seeds, sorted(s.runs), s.runs_total, s.simulated, s.error)
            for s in found]


def test_one_pool_for_every_stage_gives_the_answers_of_fresh_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fresh, fresh_pids, _ = _search(False, monkeypatch)
    shared, pids, runs = _search(True, monkeypatch)
    (s,) = shared
    assert s.status == "ok" and len(s.lengths) == 2 and len(s.seeds) == 3  # three stages ran
    assert _answers(shared) == _answers(fresh)
    # Every stage's runs went to the same two workers (fresh pools fork new ones each stage),
    # none inline in this process.
    assert len(fresh_pids) > 2
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert runs > len(s.runs)
    assert search_driver._SHARED is None  # shut down on leaving


def test_the_shared_pool_serves_every_drive_inside_and_only_inside(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = search_driver.ProcessPoolExecutor

    def counting(*a: Any, **k: Any) -> Any:
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(search_driver, "ProcessPoolExecutor", counting)
    with search_pool(2):
        with search_pool(2):  # nested: the outer pool stays the one
            pass
        assert search_driver._SHARED is made[0]
        for _ in range(3):
            search_driver._Local(2).close()  # a stage's close leaves the shared pool open
        assert search_driver._SHARED.submit(os.getpid).result() != os.getpid()
    assert len(made) == 1 and search_driver._SHARED is None
    with search_pool(1):  # one worker runs inline: no pool at all
        assert search_driver._SHARED is None and search_driver._Local(1).pool is None
    with search_pool(2, ray_address="local"):  # Ray schedules its own workers
        assert search_driver._SHARED is None
    assert len(made) == 1
