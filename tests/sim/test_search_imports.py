"""`simulate search` imports its plotting (matplotlib, sim.search_report) behind the search: the
workers are forked without it and the main process loads it while they run (sim.search_cli)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from twinserve.sim import search_cli, search_driver
from twinserve.sim.search_driver import search_pool


def _loaded_after(code: str) -> list[str]:
    """Which of the plotting modules a fresh interpreter holds after code."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import sys
        print(",".join(m for m in ("matplotlib", "matplotlib.pyplot", "twinserve.sim.search_report",
                                   "twinserve.sim.plots") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_simulate_command_and_the_search_entry_load_no_plotting() -> None:
    assert _loaded_after("import twinserve.sim.cli, twinserve.sim.search_cli") == []
    # The run and sweep commands still write their figures: their report loads on use.
    assert "matplotlib" in _loaded_after("from twinserve.sim.report import write_study")


def test_the_pool_workers_are_forked_before_the_report_is_loaded_behind_them() -> None:
    with search_pool(2):
        pool = search_driver._SHARED
        assert pool is not None and len(pool._processes) == 2  # forked on entry, not at the first job
        loading = search_cli._load_report()
        assert loading is not None
        loading.join(60)
        assert not loading.is_alive() and "twinserve.sim.search_report" in sys.modules
    # One worker or Ray: no pool to hide it behind, nothing started (loaded where it is used).
    with search_pool(1):
        assert search_cli._load_report() is None
