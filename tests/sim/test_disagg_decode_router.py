"""A disaggregated request's decode replica: the least loaded, or each in turn as Dynamo's frontend picks
(its default `--router-mode` round-robin), which can land a request on a full replica while another is free."""

from __future__ import annotations

import pytest

from twinserve.sim.cluster_study import simulate_cluster

from .helpers import small_config


def _decode_waiting(router: str) -> tuple[float, list[int]]:
    """Time-weighted waiting on the decode replicas, and how many requests each took, for 2 clients over
    2 decode replicas of one sequence slot each (outputs of uneven length, so turns and loads part)."""
    cfg = small_config(concurrency=2, num_requests=24, warmup_requests=0, num_replicas=3, num_prefill_replicas=1,
                       seed=3, max_model_len=1024, prompt_dist="uniform", prompt_min=16, prompt_max=64,
                       output_dist="uniform", output_min=2, output_max=120, disagg_decode_router=router)
    cfg.cluster.replicas = [{}] + [{"scheduler.max_num_seqs": 1}] * 2
    built, res = simulate_cluster(cfg)
    assert len(res.total.records) == 24
    decode = built.simulation.replicas[1:]
    return sum(r.area_waiting for r in decode), [r.load.routed for r in decode]


def test_least_outstanding_never_queues_two_clients_on_two_free_slots() -> None:
    waiting, _ = _decode_waiting("least_outstanding")
    assert waiting == 0.0


def test_round_robin_takes_turns_whatever_the_load_and_requests_wait() -> None:
    waiting, routed = _decode_waiting("round_robin")
    assert abs(routed[0] - routed[1]) <= 1
    assert waiting > 0.0


def test_an_unknown_decode_router_is_refused() -> None:
    from twinserve.sim.disagg import DisaggregatedSimulation
    with pytest.raises(ValueError, match="decode_router"):
        DisaggregatedSimulation([], None, None, 0, 1.0, 0.0, 1, decode_router="random")
