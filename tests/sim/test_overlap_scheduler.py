"""TensorRT-LLM's overlap scheduler in the simulator (SchedulerConfig.overlap_scheduler; core/sched/scheduler.py
_fetched_late): a closed-loop study's first tokens leave about one step later, and the cluster's join steps
give what core.step gives with it on."""

from __future__ import annotations

import statistics

from .helpers import run, small_config
from .test_join_steps import _run as _cluster_run


def _study(overlap: bool, **extra):
    return small_config(concurrency=4, num_requests=80, warmup_requests=0, seed=3, overlap_scheduler=overlap,
                        enable_prefix_caching=False, prompt_dist="uniform", prompt_min=100, prompt_max=400,
                        output_dist="uniform", output_min=20, output_max=60, **extra)


def test_a_closed_loop_studys_first_tokens_leave_about_one_step_later() -> None:
    off, on = run(_study(False)), run(_study(True))
    ttft = [statistics.mean(x.first_token_time - x.arrival_time for x in r.records) for r in (off, on)]
    step = statistics.median(on.steps.duration)
    # Each client's next request reaches an engine that is running the other clients' decodes: it waits for
    # the step after the one that starts next, one decode step more (a prompt's step is longer; the mean
    # over 80 requests sits near one decode step).
    assert 0.6 * step < ttft[1] - ttft[0] < 1.5 * step
    assert all(x.finish_reason == y.finish_reason for x, y in zip(off.records, on.records))


def test_join_steps_give_what_core_step_gives_under_the_overlap() -> None:
    cfg = small_config(concurrency=16, num_requests=60, warmup_requests=0, num_replicas=2,
                       num_prefill_replicas=1, seed=1, max_num_batched_tokens=2048, overlap_scheduler=True,
                       enable_prefix_caching=False, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                       output_dist="uniform", output_min=2, output_max=60)
    stepped, _ = _cluster_run(cfg, False)
    joined, used = _cluster_run(cfg, True)
    assert used > 10
    assert joined == stepped
