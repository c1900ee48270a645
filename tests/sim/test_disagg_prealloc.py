"""SGLang's disaggregated admission (disagg_admission "prealloc", sim/disagg.py): a request is prefilled only
once its decode replica has pre-allocated KV for its prompt, keeping disagg_reserved_decode_tokens free per
request it holds; a decode replica short of KV makes the later requests' first tokens wait."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim.cluster_study import simulate_cluster
from twinserve.sim.disagg import DisaggregatedSimulation

from .helpers import small_config

PROMPT, OUTPUT, BLOCK, DECODE_BLOCKS = 96, 64, 16, 64  # the decode replica holds 1,024 tokens


def _run(admission: str, reserve: int = 512, decode_blocks: int = DECODE_BLOCKS, clients: int = 12):
    """clients closed-loop clients, fixed lengths, 1 prefill and 1 decode replica of decode_blocks blocks."""
    cfg = small_config(concurrency=clients, num_requests=4 * clients, warmup_requests=0, num_replicas=2,
                       num_prefill_replicas=1, seed=5, max_model_len=1024, block_size=BLOCK,
                       prompt_dist="fixed", prompt_mean=PROMPT, output_dist="fixed", output_mean=OUTPUT,
                       disagg_first_token="decode", disagg_admission=admission,
                       disagg_reserved_decode_tokens=reserve)
    cfg.cluster.replicas = [{}, {"engine.num_gpu_blocks": decode_blocks}]
    built, res = simulate_cluster(cfg)
    assert len(res.total.records) == 4 * clients
    assert all(r.finish_reason != "refused" for r in res.total.records)
    return built, res


def _ttft(res) -> float:
    return float(pd.Series([r.first_token_time - r.arrival_time for r in res.total.records]).mean())


def _prefill_wait(res) -> float:
    """Mean time from arrival to the prefill replica's first step for the request."""
    return float(pd.Series([r.first_scheduled_time - r.arrival_time for r in res.total.records]).mean())


def test_a_decode_replica_short_of_kv_holds_prefills_back_and_first_tokens_wait() -> None:
    # 12 clients, each request 160 tokens at its end: 1,920 tokens wanted, 1,024 held. Without the gate the
    # prefill runs at once and the request waits on the decode side; with it, the request waits before its
    # prefill (the bootstrap queue) until the decode replica has room for its prompt plus the reserve.
    _, free_run = _run("transfer", decode_blocks=4096)
    _, short = _run("prealloc", reserve=128)
    _, loose = _run("prealloc", reserve=128, decode_blocks=4096)
    assert _prefill_wait(short) > 5 * _prefill_wait(free_run)
    assert _ttft(short) > 2 * _ttft(loose)
    # With KV to spare the gate only waits for the decode replica's loop: first tokens as without it, near enough.
    assert _ttft(loose) < 1.5 * _ttft(free_run)


def test_no_request_is_pre_allocated_past_the_reserve() -> None:
    # Each request admitted needs its prompt plus the reserve free after the reserve of every request held:
    # n held requests of >= 96 tokens each leave room for another only while (n + 1) x (96 + R) <= 1,024.
    for reserve, most in ((200, 1024 // (PROMPT + 200)), (64, 1024 // (PROMPT + 64))):
        built, _ = _run("prealloc", reserve=reserve)
        running = max(built.simulation.replicas[1].steps.running)
        assert 1 <= running <= most, (reserve, running)
    built, _ = _run("transfer")  # the decode replica alone takes as many as its blocks allow
    assert max(built.simulation.replicas[1].steps.running) > 1024 // (PROMPT + 64)


def test_pre_allocation_is_first_come_first_served_and_released() -> None:
    built, res = _run("prealloc", reserve=128)
    sim: DisaggregatedSimulation = built.simulation
    # Everything held was given back, and the router saw every request end.
    assert sim._held == [0] and sim._in_flight == [0] and not sim._decode_of
    assert [r.load.outstanding for r in sim.replicas] == [0, 0]
    # The prefill replica took them in arrival order (the blocked head blocks those behind it).
    recs = res.total.records
    assert any(a.first_scheduled_time > a.arrival_time for a in recs)  # some did wait
    assert all(a.first_scheduled_time <= b.first_scheduled_time
               for a in recs for b in recs if a.arrival_time < b.arrival_time)


def test_a_negative_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="prealloc_reserve"):
        DisaggregatedSimulation([], None, None, 0, 1.0, 0.0, 1, prealloc_reserve=-1)
