"""The suite's own guards: a per-test time limit, and Hypothesis profiles that CI selects."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_runs_under_a_time_limit(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert 0 < float(pytestconfig.getini("timeout")) <= 1800


def test_ci_draws_the_same_examples_every_run_and_random_runs_are_marked() -> None:
    ci, rnd = settings.get_profile("ci"), settings.get_profile("random")
    assert ci.derandomize and ci.database is None and ci.deadline is None
    assert not rnd.derandomize and rnd.database is not None
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "--hypothesis-profile=ci" in test_recipe  # what .ci/run runs
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_runs_on_workers_that_keep_each_file_together(pytestconfig: pytest.Config) -> None:
    # Module fixtures (a loaded SmolLM2, a server per core mode) must not be built on both workers.
    assert pytestconfig.pluginmanager.hasplugin("xdist"), "pytest-xdist is not installed"
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "-n $(TEST_WORKERS) --dist loadfile" in test_recipe


@pytest.mark.timeout(600)
def test_a_simulation_time_limit_leaves_the_per_test_limit_armed() -> None:
    import signal

    from .sim.helpers import time_limit

    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # pytest-timeout's, for this test
    with time_limit(30):
        pass
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 0 < left <= 600, "the block cancelled the test's own time limit"
