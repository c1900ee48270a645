"""Run-level properties: determinism, fast-forward == stepping, saturation, bounds, Little's law."""

from __future__ import annotations

import pytest

from twinserve.sim.build import build
from twinserve.sim.metrics import requests_frame, steps_frame, summarize
from twinserve.sim.study import run_point
from twinserve.sim.workload import Workload

from .helpers import fingerprint, run, small_config

FF_CASES = {
    "plain": {},
    "no_prefix_cache": {"enable_prefix_caching": False},
    "preemption": {"num_gpu_blocks": 350, "rate": 20.0},
    "preemption_no_cache": {"num_gpu_blocks": 350, "rate": 20.0, "enable_prefix_caching": False},
    "shared_prefix": {"num_system_prompts": 3, "system_prompt_len": 400, "num_gpu_blocks": 500,
                      "rate": 12.0},
    "multi_turn": {"turns": 3, "think_time": 0.5, "num_gpu_blocks": 600, "rate": 5.0,
                   "num_requests": 60},
    "last_chunk_one_token": {"prompt_dist": "fixed", "prompt_mean": 513,
                             "max_num_batched_tokens": 512, "rate": 3.0},
    "max_model_len_stop": {"max_model_len": 600, "prompt_mean": 500, "output_mean": 300},
    "block_size_1": {"block_size": 1, "num_requests": 40},
    "sjf_bursty": {"policy": "sjf", "arrival": "gamma", "burstiness": 0.3, "rate": 10.0},
    # SGLang's receive poll: fast-forwarded decode steps advance its counter as stepped ones do.
    "recv_poll": {"recv_interval": 7, "batch_policy": "prefill_first", "rate": 8.0},
    "recv_poll_no_cache": {"recv_interval": 7, "batch_policy": "prefill_first", "rate": 8.0,
                           "enable_prefix_caching": False},
    # TensorRT-LLM's overlap scheduler: a request reaching a busy engine is read a step late, windows or not.
    "overlap": {"overlap_scheduler": True, "rate": 8.0},
    "overlap_no_cache": {"overlap_scheduler": True, "rate": 8.0, "enable_prefix_caching": False},
    # TensorRT-LLM's capacity policy in a short pool: requests wait for blocks instead of preempting.
    "no_evict": {"capacity_policy": "guaranteed_no_evict", "num_gpu_blocks": 350, "rate": 20.0},
    "no_evict_no_cache": {"capacity_policy": "guaranteed_no_evict", "num_gpu_blocks": 350, "rate": 20.0,
                          "enable_prefix_caching": False},
}


@pytest.mark.parametrize("case", sorted(FF_CASES))
def test_fast_forward_equals_stepping(case: str) -> None:
    stepped = run(small_config(fast_forward=False, **FF_CASES[case]))
    skipped = run(small_config(fast_forward=True, **FF_CASES[case]))
    assert skipped.num_events < stepped.num_events or skipped.num_ff_windows == 0
    assert fingerprint(skipped) == fingerprint(stepped)
    if case.startswith("preemption"):
        assert stepped.num_preemptions > 0
    if case.startswith("no_evict"):  # the same short pool as preemption's: nothing preempted
        assert stepped.num_preemptions == 0
    if case == "multi_turn":
        assert max(r.turn for r in stepped.records) == 2


def test_same_seed_identical_other_seed_differs() -> None:
    a = run(small_config(seed=7, num_system_prompts=2, system_prompt_len=200))
    b = run(small_config(seed=7, num_system_prompts=2, system_prompt_len=200))
    c = run(small_config(seed=8, num_system_prompts=2, system_prompt_len=200))
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(c)


def test_one_simpy_event_per_step_at_most() -> None:
    res = run(small_config(fast_forward=False, rate=2.0))
    idle_waits = res.num_events - res.num_steps
    assert 0 <= idle_waits <= len(res.records)


def test_ttft_non_decreasing_past_saturation() -> None:
    rates = (6.0, 8.0, 11.0, 15.0, 20.0)
    rows = []
    for rate in rates:
        cfg = small_config(trace="builtin:azure_conv", prompt_dist="trace", output_dist="trace",
                           num_requests=250, rate=rate)
        rows.append(run_point(cfg).row)
    # Saturation: offered rate above what the engine sustains at the highest load.
    capacity = rows[-1]["request_throughput"]
    past = [r for r, rate in zip(rows, rates) if rate >= capacity]
    assert len(past) >= 2, f"sweep never saturated (capacity {capacity:.2f} req/s)"
    for key in ("mean_ttft_s", "p50_ttft_s"):
        values = [r[key] for r in past]
        assert values == sorted(values), (key, values)
    # Past saturation the achieved throughput stops following the offered rate.
    assert rows[-1]["request_throughput"] < 0.8 * 20.0


def test_throughput_never_exceeds_roofline_bound() -> None:
    cfg = small_config(arrival="all_at_once", num_requests=200, max_num_batched_tokens=8192,
                       eff_gemm=1.0, eff_attention=1.0, eff_memory=1.0, step_overhead_s=0.0,
                       per_seq_overhead_s=0.0)
    built = build(cfg)
    res = built.simulation.run()
    totals = built.simulation.executor.totals
    processed = totals.num_prefill_tokens + totals.num_decode_seqs
    bound = built.roofline.max_tokens_per_second()
    assert processed / totals.busy_time <= bound
    assert totals.busy_time <= res.end_time + 1e-9
    out_tokens = sum(r.num_output_tokens for r in res.records)
    assert out_tokens / res.end_time <= bound
    assert 0.0 < totals.mfu(built.model, built.hardware, 1) <= 1.0
    assert 0.0 < totals.mbu(built.model, built.hardware, 1) <= 1.0


def test_prefix_hit_rate_equals_workload_share() -> None:
    cfg = small_config(num_system_prompts=4, system_prompt_len=700, system_prompt_zipf=1.0,
                       num_requests=200, prompt_dist="uniform", prompt_min=300, prompt_max=2000,
                       max_num_batched_tokens=8192, rate=4.0, num_gpu_blocks=30000)
    # A pool larger than the whole workload: no eviction, so every repeat of a shared
    # prefix must hit all its full blocks.
    built = build(cfg)
    # The expected share is computed from the workload alone (a twin of the one simulated).
    twin = Workload(cfg.workload, cfg.run.seed, cfg.scheduler.max_model_len)
    seen: dict[int, int] = {}
    hits = queries = 0
    for item in twin.items():
        hits += twin.expected_prefix_hits(item, cfg.scheduler.block_size, seen)
        queries += item.num_prompt_tokens
    res = built.simulation.run()
    assert res.num_preemptions == 0
    assert res.prefix_queries == queries
    assert res.prefix_hits == hits
    assert hits > 0.2 * queries
    per_request = sum(r.prefix_hit_tokens for r in res.records)
    assert per_request == hits


def test_littles_law_holds_on_run_numbers() -> None:
    cfg = small_config(trace="builtin:azure_conv", prompt_dist="trace", output_dist="trace",
                       num_requests=400, rate=8.0)
    res = run(cfg)
    req, steps = requests_frame(res), steps_frame(res)
    s = summarize(res, req, steps, cfg.slo)
    assert s["littles_L"] > 1.0
    assert s["littles_L"] == pytest.approx(s["littles_lambdaW"], rel=0.05)


def test_a_run_leaves_the_collector_as_it_found_it_and_frees_its_cycles() -> None:
    import gc
    import weakref

    class Node:
        pass

    old = gc.get_threshold()
    before_frozen = gc.get_freeze_count()
    survivor = Node()
    survivor.self = survivor  # cyclic garbage once dropped: only a collection frees it
    ref = weakref.ref(survivor)
    cfg = small_config()
    built = build(cfg)
    del survivor
    result = built.simulation.run()
    assert result.records
    # Settings restored; what the run froze is back in the collector's view ...
    assert gc.get_threshold() == old
    assert gc.get_freeze_count() == before_frozen
    # ... so a cycle that was alive when the run began is collectable after it.
    gc.collect()
    assert ref() is None


def test_a_run_collects_only_its_youngest_generation(monkeypatch) -> None:
    # What outlives a young collection is the run's world (blocks, requests): walking it again in an
    # older generation frees nothing and cost 1-2 s a large validation row.
    import gc

    from twinserve.sim import gc_policy

    seen: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    old = gc.get_threshold()
    monkeypatch.setattr(gc_policy, "GEN0_THRESHOLD", 100)
    built = build(small_config())
    gc.set_threshold(100, 2, 2)  # without the policy: an older collection every other young one
    gc.callbacks.append(watch)
    try:
        built.simulation.run()
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*old)
    assert seen.count(0) >= 5  # the young generation was collected (the check below means something)
    assert set(seen) == {0}


def test_nested_and_overlapping_runs_restore_the_collector_once() -> None:
    import gc

    from twinserve.sim.gc_policy import simulation_gc

    old = gc.get_threshold()
    outer = simulation_gc()
    inner = simulation_gc()
    outer.__enter__()
    changed = gc.get_threshold()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first one ends while the second still runs
    assert gc.get_threshold() == changed != old
    inner.__exit__(None, None, None)
    assert gc.get_threshold() == old
    assert gc.get_freeze_count() == 0
