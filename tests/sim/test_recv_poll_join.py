"""SGLang's receive poll (SchedulerConfig.recv_interval; core/sched/scheduler.py Scheduler._received) on the
cluster's fast paths: join steps (sim.cluster.ClusterSimulation._join_step, its prefill-first step included),
decode windows and lazy decodes must read new requests on the steps one-step-at-a-time stepping reads them."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st


from .helpers import run_counting_joins, small_config


def _config(n, count, replicas, disagg, seed, budget, interval, policy, rate, blocks=0):
    extra = {"num_gpu_blocks": blocks} if blocks else {}  # a small pool: preemptions, declined join steps
    return small_config(**extra, batch_policy=policy, concurrency=n, num_requests=count, warmup_requests=0,
                        num_replicas=replicas, num_prefill_replicas=1 if disagg and replicas > 1 else 0,
                        seed=seed, max_model_len=1024, max_num_batched_tokens=budget, recv_interval=interval,
                        enable_prefix_caching=False, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                        output_dist="uniform", output_min=2, output_max=60, **({"request_rate": rate} if rate else {}))


def _run(cfg, fast: bool, join: bool, times: bool) -> tuple:
    sim, res, joins = run_counting_joins(cfg, fast_forward=fast, join_steps=join, keep_token_times=times)
    per = [(tuple(dataclasses.astuple(r) for r in rr.records), rr.num_steps, rr.num_preemptions, rr.end_time,
            rep.core.scheduler.recv_counter)
           for rep, rr in zip(sim.replicas, res.replicas)]
    return (tuple(dataclasses.astuple(r) for r in res.total.records), per), joins


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), budget=st.sampled_from([64, 256, 2048]),
       interval=st.sampled_from([2, 3, 10, 40]), policy=st.sampled_from(["mixed", "prefill_first"]),
       times=st.booleans(), blocks=st.sampled_from([0, 40, 60]))
def test_fast_paths_read_requests_when_stepping_reads_them(n, count, replicas, disagg, seed, budget, interval,
                                                           policy, times, blocks) -> None:
    cfg = _config(n, count, replicas, disagg, seed, budget, interval, policy, 0, blocks)
    stepped, _ = _run(cfg, False, False, times)
    fast, _ = _run(cfg, True, True, times)
    assert fast == stepped


def test_a_polled_closed_loop_run_takes_join_steps_and_matches_stepping() -> None:
    # 16 clients, a poll every 10 decode steps: requests wait unread behind running batches, then join.
    for policy in ("mixed", "prefill_first"):
        cfg = _config(16, 60, 2, True, 1, 2048, 10, policy, 0)
        stepped, _ = _run(cfg, False, False, False)
        fast, used = _run(cfg, True, True, False)
        assert used > 10
        assert fast == stepped
