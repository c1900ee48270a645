"""A worker process that dies (killed for memory, a segfault) fails its own job only: the pool is
rebuilt, the queued jobs run, and the job it was running is retried once alone, then reported with
the reason (sim.runner). Before, one dead worker failed every job still queued (BrokenProcessPool):
the full `simulate validate` run lost 2,935 of its 3,712 studies to one OOM kill."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from twinserve.sim.runner import PointFailure, run_jobs

# Read by the jobs in the workers (forked or spawned: the environment travels either way).
PLANT = "TWINSERVE_TEST_KILL"
ONCE = "TWINSERVE_TEST_KILL_ONCE"


def _square(x: int) -> int:
    """Squares x; SIGKILLs its own process on the planted x (every time, or only while the marker
    file ONCE names does not exist yet: it is made before the kill)."""
    if str(x) == os.environ.get(PLANT):
        once = os.environ.get(ONCE)
        if not once or not Path(once).exists():
            if once:
                Path(once).touch()
            os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def _pid(_: int) -> int:
    return os.getpid()


def test_a_killed_worker_fails_only_its_own_job_after_one_retry(monkeypatch) -> None:
    monkeypatch.setenv(PLANT, "3")
    got: dict[int, object] = {}
    out = run_jobs(_square, list(range(10)), [{"x": x} for x in range(10)], workers=2, progress=False,
                   on_result=lambda i, r: got.setdefault(i, r))
    assert [out[i] for i in range(10) if i != 3] == [x * x for x in range(10) if x != 3]
    bad = out[3]
    assert isinstance(bad, PointFailure) and bad.point == {"x": 3}
    assert "worker died" in bad.error and "signal 9" in bad.error and "SIGKILL" in bad.error
    assert "twice" in bad.error  # retried once before it is reported
    assert sorted(got) == list(range(10)) and got[3] is not None  # on_result saw every job, once


def test_a_job_whose_worker_died_once_is_retried_and_kept(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(PLANT, "5")
    monkeypatch.setenv(ONCE, str(tmp_path / "killed"))
    out = run_jobs(_square, list(range(8)), [{"x": x} for x in range(8)], workers=2, progress=False)
    assert out == [x * x for x in range(8)]
    assert (tmp_path / "killed").exists()  # it did die the first time


def test_a_worker_past_its_memory_limit_is_replaced() -> None:
    # A limit of 1 byte: every worker retires after its first job, so each job gets a new process.
    pids = run_jobs(_pid, list(range(6)), [{"x": x} for x in range(6)], workers=2, progress=False,
                    max_worker_rss=1)
    assert len(set(pids)) == 6 and os.getpid() not in pids
    kept = run_jobs(_pid, list(range(6)), [{"x": x} for x in range(6)], workers=2, progress=False)
    assert len(set(kept)) <= 2  # without a limit passed, workers keep going


def _pid_and_memory(_: int) -> tuple[int, int, int]:
    from twinserve.sim.runner import _private_bytes, _rss_bytes
    return os.getpid(), _rss_bytes(), _private_bytes()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists() or multiprocessing.get_start_method() != "fork",
                    reason="private memory is read from Linux's smaps_rollup, shared pages come from fork")
def test_pages_a_worker_shares_with_its_parent_do_not_retire_it() -> None:
    # What a parent loaded before the fork (validate's aic tables) is shared: counting it in each worker's
    # memory retired every worker after every job, and each new one paid the load again.
    base = max(p for _, _, p in run_jobs(_pid_and_memory, [0, 1], [{}, {}], workers=2, progress=False))
    held = b"\x01" * (512 << 20)  # resident in this process, shared with the workers forked below
    limit = base + (128 << 20)
    got = run_jobs(_pid_and_memory, list(range(6)), [{"x": x} for x in range(6)], workers=2, progress=False,
                   max_worker_rss=limit)
    assert all(rss > limit for _, rss, _ in got)  # by resident memory every worker would have retired ...
    assert len({pid for pid, _, _ in got}) <= 2  # ... by its private memory none did
    assert held[-1] == 1


FLAGS = ["validate", "--silicon", "--model", "Llama-3.1-8B", "--system", "h100_sxm", "--backend", "trtllm",
         "--limit", "4", "--workers", "2"]


def _killing_row(job):
    """sim.validate.simulate_row, but the planted row's study SIGKILLs its worker."""
    from twinserve.sim.validate import simulate_row

    if job[0]["id"] == os.environ.get(PLANT):
        os.kill(os.getpid(), signal.SIGKILL)
    return simulate_row(job)


def test_validate_reports_the_killed_study_and_keeps_the_rest(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")
    import twinserve.sim.validate_cli as vc
    from twinserve.sim.cli import main
    from twinserve.sim.validate_rows import load_rows

    ids = list(vc.select_rows(load_rows(), "trtllm", "h100_sxm", "Llama-3.1-8B", limit=4)["id"])
    planted = ids[1]
    monkeypatch.setenv(PLANT, planted)
    monkeypatch.setattr(vc, "simulate_row", _killing_row)
    out = tmp_path / "v"
    assert main([*FLAGS, "--out", str(out)]) == 0
    assert "--resume" in capsys.readouterr().err
    frame = pd.read_csv(out / "validation.csv").set_index("row_id")
    err = frame["sim_error"].fillna("").astype(str)
    assert "worker died" in err[planted] and "signal 9" in err[planted]
    others = [i for i in ids if i != planted]
    assert (err[others] == "").all() and frame.loc[others, "pred_tpot_ms"].notna().all()
    # The killed study is not journaled: --resume runs it alone.
    monkeypatch.delenv(PLANT)
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 0
    assert "resuming: 3 of 4" in capsys.readouterr().err
    assert pd.read_csv(out / "validation.csv")["sim_error"].isna().all()


@pytest.mark.parametrize("spare", [True, False])  # blocks kept for the next run, or none kept
@pytest.mark.parametrize("replicas, prefill", [(1, 0), (2, 1)])  # one engine; a disaggregated cluster
def test_a_validate_run_leaves_no_kv_blocks_to_the_collector(monkeypatch, spare, replicas, prefill) -> None:
    # Each study's blocks, linked in their free queue, were cycles that only a full collection
    # frees (put off by sim.gc_policy): a worker grew to 12.8 GB over the head studies.
    import gc

    import twinserve.core.kv.block_pool as bp
    from twinserve.sim.validate import run_to_window

    from .helpers import small_config

    if not spare:
        monkeypatch.setattr(bp, "_SPARE_MAX", 0)
    cfg = small_config(concurrency=4, num_requests=12, warmup_requests=0, num_replicas=replicas,
                       num_prefill_replicas=prefill, prompt_dist="fixed", prompt_mean=200, prompt_min=200,
                       prompt_max=200, output_dist="fixed", output_mean=20, output_min=20, output_max=20)
    gc.collect()
    run_to_window(cfg, 8)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        # The free queue's two sentinels (ids -1, -2) may stay a cycle: a pool's, not a block per token.
        left = [o for o in gc.garbage if isinstance(o, bp.KVCacheBlock) and o.block_id >= 0]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
