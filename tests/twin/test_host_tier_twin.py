"""The twin with a host KV tier: calibrate's copy timing and its fit, the forecast of a tiered run."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.backends.sim.host_link import host_link_from_profile
from twinserve.core.errors import InvalidConfigError
from twinserve.core.sched.config import SchedulerConfig
from twinserve.sim.build import build
from twinserve.sim.workload import Workload, WorkloadConfig
from twinserve.twin.forecast import simulate
from twinserve.twin.hostcopy import fit_line, time_host_copies

from ..sim.helpers import small_config, time_limit

PROFILE = FittedCostModel(intercept_s=0.004, per_token_s=2e-4, per_decode_seq_s=3e-4)
LINK = {"block_bytes": 4096.0, "load": {"bandwidth": 1e9, "latency_s": 1e-5},
        "store": {"bandwidth": 2e9, "latency_s": 2e-5}}


def _sched(host_blocks: int) -> SchedulerConfig:
    return SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=1024, num_blocks=48,
                           block_size=16, kv_offloading_blocks=host_blocks)


def _make() -> Workload:
    # Three turns a conversation whose contexts overflow a 48-block device pool.
    cfg = WorkloadConfig(num_requests=12, arrival="poisson", rate=3.0, prompt_dist="uniform", prompt_min=100,
                         prompt_max=200, output_dist="uniform", output_min=8, output_max=20, vocab_size=500,
                         turns=3, followup_tokens=40, think_time=1.0)
    return Workload(cfg, 5, 1024)


@given(st.floats(0.0, 1e-3), st.floats(1e-9, 1e-3))
def test_fit_line_recovers_a_line(intercept: float, slope: float) -> None:
    pts = [(n, intercept + slope * n) for n in (1, 2, 4, 8, 16)]
    a, b = fit_line(pts)
    assert a == pytest.approx(intercept, abs=1e-12 + 1e-9 * slope) and b == pytest.approx(slope, rel=1e-6)


def test_copies_are_timed_and_fitted_on_this_machine() -> None:
    link = time_host_copies(num_layers=2, page_elems=256, counts=(1, 4, 16), repeats=2)
    assert link["block_bytes"] == 2 * 2 * 256 * 4  # K and V pages of 2 layers, fp32
    for d in ("load", "store"):
        assert link[d]["bandwidth"] > 1e6 and link[d]["latency_s"] >= 0.0 and len(link[d]["seconds"]) == 3
    parsed = host_link_from_profile({"host_link": link})
    assert parsed["load_bandwidth"] == link["load"]["bandwidth"]


def test_a_profile_link_with_a_bad_field_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="host_link"):
        host_link_from_profile({"host_link": {"block_bytes": 10, "load": {"bandwidth": 0, "latency_s": 0},
                                              "store": {"bandwidth": 1, "latency_s": 0}}})
    with pytest.raises(InvalidConfigError, match="host_link"):
        host_link_from_profile({"host_link": {"load": {}}})
    assert host_link_from_profile({}) is None


def test_the_forecast_runs_a_tiered_engine_on_the_profiles_link() -> None:
    profile = dataclasses.replace(PROFILE, meta={"host_link": LINK})
    with time_limit(60):
        off = simulate(profile, _make, _sched(0))
        on = simulate(profile, _make, _sched(400))
        slow = simulate(dataclasses.replace(PROFILE, meta={"host_link": {
            **LINK, "load": {"bandwidth": 2e5, "latency_s": 1e-5}}}), _make, _sched(400))
    assert len(on.records) == len(off.records) == 36
    mean_ttft = lambda res: sum(r.first_token_time - r.arrival_time for r in res.records) / len(res.records)  # noqa: E731
    # The tier saves recomputing evicted contexts; a link 5000x slower gives the savings back.
    assert mean_ttft(on) < mean_ttft(off) < mean_ttft(slow)


def test_the_forecast_of_a_tiered_engine_needs_a_timed_link() -> None:
    with pytest.raises(InvalidConfigError, match="twinserve calibrate"):
        simulate(PROFILE, _make, _sched(400))


def test_a_study_prices_the_tier_on_its_profiles_measured_link(tmp_path) -> None:
    path = tmp_path / "p.json"
    dataclasses.replace(PROFILE, meta={"model": "Llama-2-7B", "host_link": LINK}).save(path)
    cfg = small_config(**{"cost_model": "fitted", "profile": str(path), "kv_offload.host_blocks": 100})
    link = build(cfg).simulation.core.executor.link
    assert (link.bandwidth, link.store_bandwidth, link.store_latency_s) == (1e9, 2e9, 2e-5)
    cfg = small_config(**{"cost_model": "fitted", "profile": str(path), "kv_offload.host_blocks": 100,
                          "kv_offload.bandwidth": 5e9})
    link = build(cfg).simulation.core.executor.link
    assert (link.bandwidth, link.store_bandwidth, link.latency_s) == (5e9, 5e9, 1e-5)


def test_a_cpu_timed_link_copies_synchronously_and_fast_forward_still_equals_stepping(tmp_path) -> None:
    from ..sim.helpers import fingerprint
    path = tmp_path / "p.json"
    dataclasses.replace(PROFILE, meta={"model": "Llama-2-7B", "host_link": {**LINK, "device": "cpu"}}).save(path)
    fields = {"cost_model": "fitted", "profile": str(path), "kv_offload.host_blocks": 4000, "num_gpu_blocks": 512,
              "turns": 3, "num_requests": 12, "prompt_mean": 900.0, "think_time": 3.0, "max_model_len": 4096}
    built = build(small_config(**fields))
    tier = built.simulation.core.executor
    assert tier.synchronous
    with time_limit(120):
        ff = built.simulation.run()
    step_cfg = small_config(**fields)
    step_cfg.run.fast_forward = False
    stepped = build(step_cfg)
    with time_limit(120):
        st_res = stepped.simulation.run()
    assert fingerprint(ff) == fingerprint(st_res)
    # Every copy's time went into a step (synchronous), and no request waited on a load in flight.
    assert tier.copy_stall_s > 0.0 and tier.wait_s == 0.0 and not tier.pending
    assert tier.copy_stall_s == pytest.approx(tier.link.loads.busy_s + tier.link.stores.busy_s)
    cuda = dataclasses.replace(PROFILE, meta={"model": "Llama-2-7B", "host_link": {**LINK, "device": "cuda:0"}})
    cuda.save(path)
    assert not build(small_config(**fields)).simulation.core.executor.synchronous
