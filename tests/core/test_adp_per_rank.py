"""Attention DP with per-rank caps (SchedulerConfig.adp_per_rank, TensorRT-LLM's per-rank scheduler): a new
request is placed on one rank and takes that rank's seats and step tokens, never the pooled ones."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import Request, SamplingParams, Scheduler, SchedulerConfig

from .helpers import assert_like_reference_and_freed, drive
from .test_batch_policy import _step
from .test_scheduler_properties import _fields, workloads


def _sched(per_rank: bool, ranks: int, seats: int, tokens: int, chunked: bool = True) -> Scheduler:
    """A prefill worker of `ranks` attention-DP ranks, each `seats` requests and `tokens` a step (pooled
    as sim/build.py pools them: ranks x a rank's)."""
    return Scheduler(SchedulerConfig(max_num_batched_tokens=ranks * tokens, max_num_seqs=ranks * seats,
                                     max_model_len=9216 if chunked else 1024, block_size=16, num_blocks=8192,
                                     adp_ranks=ranks, enable_prefix_caching=False,
                                     adp_per_rank=per_rank, enable_chunked_prefill=chunked))


def _first_step(sched: Scheduler, prompts: list[int]) -> dict[str, int]:
    for i, n in enumerate(prompts):
        sched.add_request(Request(f"r{i}", list(range(1, n + 1)), SamplingParams(max_tokens=1)))
    return _step(sched, 0.0)


def test_eight_ranks_of_one_prompt_run_eight_and_the_ninth_waits_a_step() -> None:
    # B200 FP8 8k/1k's ctx worker: max_batch_size 1, max_num_tokens 8,320 a rank, 8 ranks.
    sched = _sched(True, 8, 1, 8320)
    assert _first_step(sched, [8000] * 9) == {f"r{i}": 8000 for i in range(8)}
    assert _step(sched, 1.0) == {"r8": 8000}


def test_a_prompt_takes_only_its_ranks_tokens_not_the_pooled_budget() -> None:
    # 2 ranks of 2 seats and 1,000 tokens: 600-token prompts go one a rank (a second would need 1,200 of the
    # rank's 1,000); pooled, three whole prompts fit 2,000 tokens.
    assert _first_step(_sched(True, 2, 2, 1000, chunked=False), [600] * 4) == {"r0": 600, "r1": 600}
    assert _first_step(_sched(False, 2, 2, 1000, chunked=False), [600] * 4) == {"r0": 600, "r1": 600,
                                                                                 "r2": 600}
    # Chunked: a 1,500-token prompt runs 1,000 on its rank; the next prompt goes to the other rank.
    assert _first_step(_sched(True, 2, 2, 1000), [1500, 1500]) == {"r0": 1000, "r1": 1000}
    assert _first_step(_sched(False, 2, 2, 1000), [1500, 1500]) == {"r0": 1500, "r1": 500}


def test_new_prompts_go_to_the_rank_with_the_fewest_active_prompt_tokens() -> None:
    # TensorRT-LLM's _balance_requests_across_ranks heap: (active tokens, active requests, rank).
    sched = _sched(True, 2, 4, 4000)
    assert _first_step(sched, [3000, 500, 500, 500]) == {"r0": 3000, "r1": 500, "r2": 500, "r3": 500}
    assert [sched._adp_rank[f"r{i}"] for i in range(4)] == [0, 1, 1, 1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([2, 3, 8]))
def test_per_rank_caps_hold_every_step_and_every_request_ends_exactly(w, ranks) -> None:
    cfg, arrivals = w
    seats = max(1, cfg.max_num_seqs // ranks)
    room = max(cfg.max_model_len if not cfg.enable_chunked_prefill else 1, cfg.max_num_batched_tokens // ranks)
    cfg = SchedulerConfig(**{**_fields(cfg), "adp_ranks": ranks, "adp_per_rank": True,
                             "max_num_seqs": seats * ranks, "max_num_batched_tokens": room * ranks})

    def check(core, so, waiting_before):
        sched = core.scheduler
        per = [0] * ranks
        for r in sched.running:
            per[sched._adp_rank[r.request_id]] += 1
        assert max(per) <= seats
        for rid in so.scheduled_new_reqs and [n.req_id for n in so.scheduled_new_reqs]:
            assert so.num_scheduled_tokens[rid] <= room

    core, log = drive(cfg, arrivals, check=check)
    assert_like_reference_and_freed(core, log, cfg, arrivals)
