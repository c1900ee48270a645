"""bench_simulator --baseline: the revision's code really is what the baseline child runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "bench_simulator.py"


def test_baseline_child_imports_the_revision_not_the_working_tree(tmp_path, experiment) -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=SCRIPT.parent,
                      capture_output=True).returncode != 0:
        pytest.skip("--baseline extracts a git revision: this copy is not a git checkout")
    bench = experiment("bench_simulator")
    pkg = bench.baseline_tree("HEAD")
    probe = tmp_path / "probe.py"
    probe.write_text("import twinserve.core.kv.block_pool as m, twinserve.sim.world as w\n"
                     "print(m.__file__); print(w.__file__)\n")
    for pkg_dir, inside in ((pkg, True), ("", False)):
        out = subprocess.run([sys.executable, "-c", bench._CHILD, pkg_dir, str(probe)],
                             capture_output=True, text=True, check=True).stdout.split()
        assert len(out) == 2
        assert all(path.startswith(pkg) == inside for path in out), out
    # A whole (small) benchmark run on the extracted revision, with its results digest.
    rate, digest = bench.run_child(pkg, ["--requests", "40", "--repeat", "1"])
    assert rate > 0 and len(digest) == 16


def test_without_shared_the_bench_runs_the_whole_bundled_excerpt(experiment, monkeypatch, capsys) -> None:
    """Issue 53 item 15: a fresh clone has no ../shared; the fallback asks the excerpt for its rows, not 5,000."""
    bench = experiment("bench_simulator")
    monkeypatch.setattr(bench, "TRACE", Path("/nonexistent/shared/traces/conv.csv"))
    rows = bench.bundled_rows()
    assert 100 < rows < 5000
    bench.main(["--repeat", "1"])
    out = capsys.readouterr().out
    assert f"first {rows} rows; ../shared is absent" in out and f"simulated {rows} requests" in out


def test_bench_scheduler_baseline_runs_the_revisions_core_not_the_working_trees(experiment) -> None:
    """Issue 53 item 13: the extracted core imported twinserve.core, so --baseline timed the tree twice."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=SCRIPT.parent, capture_output=True).returncode != 0:
        pytest.skip("--baseline extracts a git revision: this copy is not a git checkout")
    import inspect
    import sys as _sys

    import twinserve.core as current

    bench = experiment("bench_scheduler")
    base = bench.load_baseline("HEAD")
    folder = str(Path(base.__file__).parent)
    assert base.Scheduler is not current.Scheduler
    assert inspect.getfile(base.Scheduler).startswith(folder)
    sched_mod = _sys.modules[base.Scheduler.__module__]
    assert sched_mod.__name__.startswith("baseline_core.") and all(
        not getattr(v, "__module__", "").startswith("twinserve.core") for v in vars(sched_mod).values()
        if isinstance(getattr(v, "__module__", None), str))
    # A planted module of the working tree inside the baseline package is refused by name.
    _sys.modules["baseline_core.planted"] = current
    try:
        with pytest.raises(RuntimeError, match="baseline module baseline_core.planted"):
            bench.check_baseline(base, str(Path(folder).parent))
    finally:
        del _sys.modules["baseline_core.planted"]
    # One short A/A timing through the baseline's own classes.
    times, _ = bench.decode_step_times(8, 5, core=base)
    assert len(times) == 5


def test_bench_scheduler_aa_times_two_copies_of_one_revision(experiment, capsys) -> None:
    """Issue 53 item 13: --aa REF times REF against a second copy of itself and prints the A/A verdict;
    --nano-vllm adds nano-vllm's re-created decode step on the same workload."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=SCRIPT.parent, capture_output=True).returncode != 0:
        pytest.skip("--aa extracts a git revision: this copy is not a git checkout")
    import sys as _sys

    bench = experiment("bench_scheduler")
    bench.main(["--aa", "HEAD", "--sizes", "8", "--steps", "20", "--repeats", "1", "--nano-vllm"])
    out = capsys.readouterr().out
    a, b = _sys.modules["baseline_core"], _sys.modules["baseline_core_aa"]
    assert a.Scheduler is not b.Scheduler and Path(a.__file__).parent != Path(b.__file__).parent
    assert f"HEAD: {Path(a.__file__).parent}" in out and f"HEAD (A/A): {Path(b.__file__).parent}" in out
    assert "A/A: the largest ratio is" in out and "nano-vllm" in out and "vs nano" in out
    # The A/A copy is checked under its own name: a working-tree module planted in it is refused.
    _sys.modules["baseline_core_aa.planted"] = _sys.modules["twinserve.core"]
    try:
        with pytest.raises(RuntimeError, match="baseline module baseline_core_aa.planted"):
            bench.check_baseline(b, str(Path(b.__file__).parents[1]), "baseline_core_aa")
    finally:
        del _sys.modules["baseline_core_aa.planted"]


def test_nano_vllm_recreation_takes_and_registers_blocks_as_nano_vllm(experiment) -> None:
    """The re-created nano-vllm step gives each sequence a block per 16 tokens and hashes each full one."""
    nano = experiment("nano_vllm_sched")
    sched = nano.NanoScheduler(64, 16, 4)
    seqs = []
    for i in range(3):
        seq = nano.NanoSeq([1] * 16 + [i + 2] * 8, 100)
        sched.block_manager.allocate(seq)
        seq.append_token(5)
        sched.running.append(seq)
        seqs.append(seq)
    assert seqs[0].block_table[0] == seqs[1].block_table[0]  # the shared first block is a prefix hit
    for _ in range(30):
        sched.step([7, 7, 7])
    blocks = sched.block_manager.blocks
    for seq in seqs:
        assert len(seq) == 55 and len(seq.block_table) == seq.num_blocks == 4
        assert [blocks[b].hash != -1 for b in seq.block_table] == [True, True, True, False]
    assert sched.step([7, 7, 7]) == [] and len(nano.nano_step_times(4, 20)) == 20


def test_bench_scheduler_times_several_baselines_each_from_its_own_copy(experiment, capsys) -> None:
    """--baseline given twice: both revisions timed in one run, each imported from its own extracted
    folder under its own package name, each with a row of ratios against the working tree."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=SCRIPT.parent, capture_output=True).returncode != 0:
        pytest.skip("--baseline extracts a git revision: this copy is not a git checkout")
    import sys as _sys

    import twinserve.core as current

    bench = experiment("bench_scheduler")
    bench.main(["--baseline", "HEAD", "--baseline", "HEAD", "--sizes", "8", "--steps", "20", "--repeats", "2"])
    out = capsys.readouterr().out
    a, b = _sys.modules["baseline_core"], _sys.modules["baseline_core_2"]
    folders = [Path(m.__file__).parent for m in (a, b)]
    assert folders[0] != folders[1] and a.Scheduler is not b.Scheduler
    assert current.Scheduler not in (a.Scheduler, b.Scheduler)
    for pkg, folder in (("baseline_core", folders[0]), ("baseline_core_2", folders[1])):
        bench.check_baseline(_sys.modules[pkg], str(folder.parent), pkg)
        mods = [m for name, m in _sys.modules.items() if name.startswith(pkg + ".")]
        assert mods and all(Path(m.__file__).resolve().is_relative_to(folder.resolve()) for m in mods)
    assert f"  HEAD: {folders[0]}" in out and f"  HEAD#2: {folders[1]}" in out
    # One row of ratios (mean, p99, median) per baseline.
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["8", "/HEAD"], ["8", "/HEAD#2"])]
    assert [r[1] for r in rows] == ["/HEAD", "/HEAD#2"]
    assert all(len(r) == 5 and all(float(x) > 0 for x in r[2:]) for r in rows)
