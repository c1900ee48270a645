"""The simulator with a host KV tier: loads and stores priced on the host link, requests wait for
their loads, nothing changes when the tier is off, and stepping equals fast-forward."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim.host_link import HostLink, HostTierExecutor
from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig
from twinserve.sim.study import run_point

from .helpers import fingerprint, small_config, time_limit


def sessions(**fields: Any) -> StudyConfig:
    """Multi-turn sessions whose contexts overflow a 512-block device pool (Llama-2-7B on A100)."""
    base = {"num_gpu_blocks": 512, "turns": 4, "num_requests": 30, "rate": 3.0, "prompt_mean": 900.0,
            "prompt_std": 200.0, "output_mean": 60.0, "output_std": 20.0, "followup_tokens": 100,
            "think_time": 4.0, "max_model_len": 4096, "seed": 3}
    base.update(fields)
    return small_config(**base)


def _run(cfg: StudyConfig):
    built = build(cfg)
    with time_limit(120):
        return built, built.simulation.run()


def test_tier_off_builds_the_plain_executor() -> None:
    built = build(sessions())
    assert built.simulation.core.executor is built.simulation.executor
    assert built.simulation.core.scheduler.kv.host is None


def test_a_host_tier_cuts_ttft_and_keeps_every_output() -> None:
    _, off = _run(sessions())
    built, on = _run(sessions(**{"kv_offload.host_blocks": 8192}))
    kv = built.simulation.core.scheduler.kv
    assert kv.host.stats.hits > 0 and kv.host.stats.blocks_stored > 0
    assert sorted((r.request_id, r.num_output_tokens) for r in on.records) == \
        sorted((r.request_id, r.num_output_tokens) for r in off.records)
    ttft = lambda res: sorted(r.first_token_time - r.arrival_time for r in res.records)  # noqa: E731
    assert ttft(on)[len(on.records) // 2] < ttft(off)[len(off.records) // 2]


class _Recording(HostLink):
    """A HostLink that remembers each load's completion time, in issue order."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.done: list[float] = []

    def load(self, num_blocks: int, now: float) -> float:
        t = super().load(num_blocks, now)
        self.done.append(t)
        return t


def test_no_request_computes_before_its_load_lands() -> None:
    # A slow link (20 MB/s: ~0.1 s a Llama-2-7B block) makes every load outlast many steps.
    built = build(sessions(**{"kv_offload.host_blocks": 8192, "kv_offload.bandwidth": 2e7}))
    tier = built.simulation.core.executor
    assert isinstance(tier, HostTierExecutor)
    old = tier.link
    tier.link = link = _Recording(old.bandwidth, old.latency_s, old.block_bytes)
    sched = built.simulation.core.scheduler
    waiting_on: dict[str, int] = {}  # request -> index of the load its admission queued
    original = sched._admit_loading
    loads = 0  # admissions seen: the k-th queues the link's k-th load

    def admit(req, *a):
        nonlocal loads
        ok = original(req, *a)
        if ok:
            waiting_on[req.request_id] = loads
            loads += 1
        return ok

    sched._admit_loading = admit
    checked = []
    original_execute = tier.execute

    def execute(so):
        for new in so.scheduled_new_reqs:
            i = waiting_on.pop(new.req_id, None)
            if i is not None:
                # Admitted again only once its copy has completed.
                assert tier.now >= link.done[i] - 1e-12, (new.req_id, tier.now, link.done[i])
                checked.append(new.req_id)
        return original_execute(so)

    tier.execute = execute
    with time_limit(120):
        built.simulation.run()
    assert len(checked) > 5, "too few requests waited for a load"
    assert tier.wait_s > 0.0  # some steps had nothing to compute but loads in flight


def test_a_slower_link_costs_ttft() -> None:
    def p50(bandwidth: float) -> float:
        row = run_point(sessions(**{"kv_offload.host_blocks": 8192, "kv_offload.bandwidth": bandwidth})).row
        return row["p50_ttft_s"]

    assert p50(2e7) > p50(64e9)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["lru", "lrfu"]), st.sampled_from([64, 700, 4096]))
def test_fast_forward_equals_stepping_with_a_tier(seed: int, policy: str, blocks: int) -> None:
    cfg = sessions(**{"seed": seed, "kv_offload.host_blocks": blocks, "kv_offload.eviction": policy,
                      "num_requests": 12})
    b_ff, ff = _run(cfg)
    cfg.run.fast_forward = False
    b_step, step = _run(cfg)
    assert fingerprint(ff) == fingerprint(step)
    # The same copies at the same times: windows price their steps' stores as stepping does.
    t_ff, t_step = b_ff.simulation.core.executor, b_step.simulation.core.executor
    assert (t_ff.link.stores, t_ff.link.loads, t_ff.link.store_free) == \
        (t_step.link.stores, t_step.link.loads, t_step.link.store_free)
    assert b_ff.simulation.core.scheduler.kv.host.stats == b_step.simulation.core.scheduler.kv.host.stats
    assert ff.num_ff_windows > 0


def test_summary_row_has_the_tier_columns_only_when_on() -> None:
    off = run_point(sessions(num_requests=8)).row
    assert "host_hit_rate" not in off
    on = run_point(sessions(num_requests=8, **{"kv_offload.host_blocks": 4096})).row
    assert on["host_tier_blocks"] == 4096 and on["eviction"] == "lru"
    assert 0.0 <= on["link_load_busy"] < 1.0 and on["host_blocks_stored"] > 0


@pytest.mark.parametrize("cluster", [{"num_replicas": 2}, {"num_replicas": 2, "num_prefill_replicas": 1}])
def test_clusters_run_with_a_tier(cluster: dict) -> None:
    cfg = sessions(num_requests=10, **{"kv_offload.host_blocks": 4096}, **cluster)
    with time_limit(120):
        row = run_point(cfg).row
    assert row["completed"] == 40


@pytest.mark.parametrize("fields", [{"scheduler.sliding_window": 256}, {"scheduler.kv_groups": [0, 256]}],
                         ids=["one-window", "full+window"])
def test_a_windowed_model_runs_the_tier_and_prices_each_groups_pages(fields: dict) -> None:
    # Sliding windows and KV groups keep the tier: hits come back, outputs equal the tier-off run, and
    # every block moved is one group's page (the pool's block bytes: half a full block with 2 groups).
    _, off = _run(sessions(**fields))
    built, on = _run(sessions(**{"kv_offload.host_blocks": 8192}, **fields))
    kv = built.simulation.core.scheduler.kv
    assert kv.num_groups == len(fields.get("scheduler.kv_groups", [0]))
    assert kv.host.stats.hits > 0 and kv.host.stats.blocks_loaded > 0
    assert sorted((r.request_id, r.num_output_tokens) for r in on.records) == \
        sorted((r.request_id, r.num_output_tokens) for r in off.records)
    link = built.simulation.core.executor.link
    plain = build(sessions())
    assert link.block_bytes == built.capacity.block_bytes == plain.capacity.block_bytes / kv.num_groups
    assert link.loads.blocks == kv.host.stats.blocks_loaded
    assert link.loads.bytes == link.loads.blocks * link.block_bytes
    assert link.stores.bytes == link.stores.blocks * link.block_bytes > 0
