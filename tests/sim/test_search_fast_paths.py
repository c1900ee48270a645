"""Speed paths `simulate search` leans on give the same runs as the plain ones."""

from __future__ import annotations

import dataclasses

import pytest

from twinserve.sim import disagg
from twinserve.sim.cluster_study import simulate_cluster

from .helpers import small_config


def _disagg_run(prefill: int, replicas: int, rate: float):
    cfg = small_config(num_requests=120, rate=rate, prompt_dist="uniform", prompt_min=200,
                       prompt_max=1500, output_dist="uniform", output_min=20, output_max=300,
                       **{"cluster.num_replicas": replicas,
                          "cluster.num_prefill_replicas": prefill})
    _, res = simulate_cluster(cfg)
    # Every request and every replica's steps, exactly.
    return ([dataclasses.astuple(r) for r in res.total.records],
            [dataclasses.astuple(r.steps) for r in res.replicas], res.busy_time)


@pytest.mark.parametrize("prefill,replicas,rate", [(1, 2, 4.0), (2, 3, 9.0)])
def test_decode_windows_of_a_disaggregated_run_match_stepping_them(
        monkeypatch: pytest.MonkeyPatch, prefill: int, replicas: int, rate: float) -> None:
    calls = []
    inner = disagg._Discounted._decode_step_times

    def counted(self, *a):
        calls.append(a)
        return inner(self, *a)

    monkeypatch.setattr(disagg._Discounted, "_decode_step_times", counted)
    fast = _disagg_run(prefill, replicas, rate)
    assert calls, "no decode window went through the cost model's own loop"
    # The plain path: a cost model without decode_step_times steps each window in Python.
    real_init = disagg._Discounted.__init__

    def plain_init(self, inner_model):
        real_init(self, inner_model)
        self.__dict__.pop("decode_step_times", None)

    monkeypatch.setattr(disagg._Discounted, "__init__", plain_init)
    calls.clear()
    slow = _disagg_run(prefill, replicas, rate)
    assert not calls
    assert fast == slow


def test_a_window_priced_inside_a_discounted_step_is_refused() -> None:
    from twinserve.sim.build import build_cost_models

    d = disagg._Discounted(build_cost_models(small_config())[2])
    d.minus = (10, 1, 0, 50.0)
    with pytest.raises(RuntimeError, match="discounted"):
        d.decode_step_times(4, 1000, 10, 0.0, 1.0)
