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
