"""Batch policies: `prefill_first` (SGLang's lock step) never puts a decode beside a prefill.

The exact schedules of a small scenario pin the policy; random workloads (the KV-modelling
executor of tests/core/helpers.drive) hold its invariants: a step is all prefill or all decode,
the budget holds, outputs are exact, every block comes back.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.errors import InvalidConfigError
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.sched.batch_policy import BATCH_POLICIES, PrefillFirst
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import Arrival, assert_like_reference_and_freed, drive, make_request, reference_output
from .test_scheduler_budget import _sampled, edge_workloads
from .test_scheduler_properties import _fields, _limits_check, workloads
from .test_spec_decode import spec_configs


def _step(sched: Scheduler, t: float) -> dict[str, int]:
    """One step with one sampled token for every request that reached its end."""
    so = sched.schedule(t)
    tokens = {rid: [5] for rid in so.num_scheduled_tokens
              if sched.requests[rid].num_computed_tokens == sched.requests[rid].num_tokens}
    sched.update_from_output(so, ModelRunnerOutput(tokens), t + 0.5)
    return dict(so.num_scheduled_tokens)


def _scenario(policy: str) -> list[dict[str, int]]:
    """r0 decodes; r1 (12 tokens, budget 8) arrives at step 2; both decode after."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64,
                                      block_size=4, num_blocks=64, batch_policy=policy))
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=10)))
    steps = [_step(sched, 0.0), _step(sched, 1.0)]
    sched.add_request(Request("r1", list(range(10, 22)), SamplingParams(max_tokens=10)))
    steps += [_step(sched, float(t)) for t in range(2, 5)]
    return steps


def test_prefill_first_runs_a_chunked_prompt_alone_then_decodes_resume() -> None:
    assert _scenario("prefill_first") == [
        {"r0": 4}, {"r0": 1},
        {"r1": 8},  # the new prompt's first chunk: r0's decode waits
        {"r1": 4},  # its last chunk, still alone
        {"r0": 1, "r1": 1},  # nothing left to prefill: every running request decodes
    ]
    # The old (and default) policy mixes the same requests in the same budget.
    assert _scenario("mixed") == [{"r0": 4}, {"r0": 1}, {"r0": 1, "r1": 7}, {"r0": 1, "r1": 5},
                                  {"r0": 1, "r1": 1}]


def test_waiting_requests_fill_the_rest_of_a_continued_chunk_within_the_budget() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=64,
                                      block_size=4, num_blocks=64, batch_policy="prefill_first"))
    sched.add_request(Request("a", list(range(1, 11)), SamplingParams(max_tokens=4)))
    sched.add_request(Request("b", list(range(20, 25)), SamplingParams(max_tokens=4)))
    sched.add_request(Request("c", list(range(30, 33)), SamplingParams(max_tokens=4)))
    # a's 10 tokens: 8 now; then its last 2 and b's 5, c's first 1 (SGLang: chunked request first).
    assert [_step(sched, float(t)) for t in range(4)] == [
        {"a": 8}, {"a": 2, "b": 5, "c": 1}, {"c": 2}, {"a": 1, "b": 1, "c": 1}]


def _capped(cap: int) -> list[dict[str, int]]:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64, block_size=4,
                                      num_blocks=64, batch_policy="prefill_first", max_prefill_tokens=cap))
    sched.add_request(Request("a", list(range(1, 11)), SamplingParams(max_tokens=3)))
    sched.add_request(Request("b", list(range(20, 28)), SamplingParams(max_tokens=3)))
    sched.add_request(Request("c", [1, 2], SamplingParams(max_tokens=3)))
    return [_step(sched, float(t)) for t in range(3)]


def test_max_prefill_tokens_keeps_a_prompt_that_does_not_fit_whole_for_the_next_step() -> None:
    # SGLang on B200: chunked_prefill_size = max_prefill_tokens = 16384; here 16 and 16.
    assert _capped(16) == [{"a": 10}, {"b": 8, "c": 2}, {"a": 1, "b": 1, "c": 1}]  # b's 8 >= 16 - 10
    assert _capped(0) == [{"a": 10, "b": 6}, {"b": 2, "c": 2}, {"a": 1, "b": 1, "c": 1}]  # chunked instead
    assert _capped(24) == _capped(0)  # b's 8 < 24 - 10: it joins, chunked by the budget


def test_a_seat_cap_lets_decodes_run_while_requests_wait() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1, max_model_len=64,
                                      block_size=4, num_blocks=64, batch_policy="prefill_first"))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=2)))
    sched.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=2)))
    # b cannot be admitted (one seat), so a decodes to its end; then b prefills.
    assert [_step(sched, float(t)) for t in range(4)] == [{"a": 3}, {"a": 1}, {"b": 3}, {"b": 1}]


def test_an_unknown_policy_is_a_typed_error_naming_the_field_and_the_choices() -> None:
    try:
        SchedulerConfig(batch_policy="decode_first")
    except InvalidConfigError as e:
        assert "batch_policy" in str(e) and "'mixed', 'prefill_first'" in str(e)
    else:
        raise AssertionError("batch_policy='decode_first' was accepted")
    assert set(BATCH_POLICIES) == {"mixed", "prefill_first"}
    assert isinstance(Scheduler(SchedulerConfig(batch_policy="prefill_first")).batch_policy, PrefillFirst)


def _lock_step_check(cfg: SchedulerConfig, done: set[str] | None):
    """drive's check: the usual limits (done=None: none, drafts count as computed), and no step
    holds both a prompt chunk and a decode."""
    limits = _limits_check(cfg, done) if done is not None else None

    def check(core, so, waiting_before):
        if limits is not None:
            limits(core, so, waiting_before)
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        sched = core.scheduler
        cached = so.scheduled_cached_reqs
        kinds = {"prefill"} if so.scheduled_new_reqs else set()
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            req = sched.requests[rid]
            # As before the step: a decode had output and one token left to compute.
            decode = req.output_token_ids and len(req.all_token_ids) - computed == 1
            kinds.add("decode" if decode else "prefill")
        assert len(kinds) <= 1, f"a step mixed prefill and decode: {dict(so.num_scheduled_tokens)}"
    return check


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([0, 0, 8, 40]))
def test_prefill_first_never_mixes_and_outputs_are_exact(w, cap) -> None:
    cfg, arrivals = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "prefill_first", "max_prefill_tokens": cap})
    done: set[str] = set()
    core, log = drive(cfg, arrivals, check=_lock_step_check(cfg, done))
    assert_like_reference_and_freed(core, log, cfg, arrivals)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), spec_configs())
def test_prefill_first_with_speculation_never_mixes_and_outputs_are_exact(w, s) -> None:
    # Drafts ride the decode steps; a prompt's last chunk holds the draft model's lookahead slots.
    cfg, arrivals = w
    spec, miss = s
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "prefill_first"})
    core, log = drive(cfg, arrivals, check=_lock_step_check(cfg, None), spec=spec, draft_miss=miss)
    ex = FakeExecutor(block_size=cfg.block_size)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ex, a.request, cfg.max_model_len)
    assert core.scheduler.kv.num_free_blocks == cfg.num_blocks


def test_a_chunked_prompts_last_chunk_holds_the_draft_models_lookahead_slots() -> None:
    spec = SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=3)
    cfg = SchedulerConfig(max_num_batched_tokens=8, max_model_len=64, block_size=4, num_blocks=128,
                          batch_policy="prefill_first")
    checked: list[str] = []

    def check(core, so, waiting_before):
        sched = core.scheduler
        for rid in so.num_scheduled_tokens:
            req = sched.requests[rid]
            nd = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            end = len(req.all_token_ids)
            if req.num_computed_tokens == end + nd:  # this step samples: 3 slots past it for the draft
                assert len(sched.kv.req_to_blocks[rid]) * cfg.block_size >= min(end + nd + 3, 64)
                if not req.output_token_ids:
                    checked.append(rid)  # a prompt's last chunk

    # 11-13 token prompts in an 8-token budget: each ends in a running chunk, not at admission.
    arrivals = [Arrival(0, make_request(f"r{i}", list(range(1, 12 + i)), 20)) for i in range(3)]
    drive(cfg, arrivals, check=check, spec=spec, draft_miss=3)
    assert len(checked) == 3


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_workloads(), st.data())
def test_prefill_first_steps_never_exceed_the_budget(w, data) -> None:
    cfg, reqs = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "prefill_first"})
    sched = Scheduler(cfg)
    for step in range(40):
        for i, (at, n, m) in enumerate(reqs):
            if at == step:
                sched.add_request(Request(f"r{i}", [1 + i % 3] * n, SamplingParams(max_tokens=m)))
        so = sched.schedule(float(step))
        scheduled = sum(so.num_scheduled_tokens.values())
        assert scheduled <= cfg.max_num_batched_tokens, f"step {step}: {scheduled} tokens"
        assert so.total_num_scheduled_tokens == scheduled
        sched.update_from_output(so, _sampled(sched, so, data), float(step) + 0.5)


def test_a_pool_too_small_for_two_prompts_still_finishes_under_prefill_first() -> None:
    # Two chunked prompts hold the pool between them and both need more: only preemption frees room.
    cfg = SchedulerConfig(max_num_batched_tokens=16, long_prefill_token_threshold=8, max_num_seqs=4,
                          max_model_len=40, block_size=4, num_blocks=10, batch_policy="prefill_first")
    arrivals = [Arrival(0, make_request(f"r{i}", list(range(10 * i, 10 * i + 30)), 8)) for i in range(2)]
    core, log = drive(cfg, arrivals, max_steps=500)
    ex = FakeExecutor(block_size=4)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ex, a.request, 40)
    assert core.scheduler.num_preemptions > 0


def test_a_prompt_waiting_for_kv_room_is_not_overtaken_by_a_newcomer() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, long_prefill_token_threshold=8,
                                      max_num_seqs=4, max_model_len=40, block_size=4, num_blocks=11,
                                      batch_policy="prefill_first"))
    for i in range(2):
        sched.add_request(Request(f"r{i}", list(range(10 * i, 10 * i + 30)), SamplingParams(max_tokens=8)))
    assert [_step(sched, float(t)) for t in range(2)] == [{"r0": 8, "r1": 8}, {"r0": 8, "r1": 8}]
    sched.add_request(Request("late", [1, 2, 3], SamplingParams(max_tokens=2)))
    # r0 takes 2 of the 3 free blocks; r1 needs 2 and waits; the one left is kept for it.
    assert _step(sched, 2.0) == {"r0": 8}
    assert "late" not in sched.requests or sched.requests["late"].num_computed_tokens == 0


def _wait_scenario(iters: int, ratio: float, prompt: int, chunked: bool = True) -> list[dict[str, int]]:
    """r0 decodes; r1 (`prompt` tokens) arrives at step 2; budget 16, TensorRT-LLM's batch wait set."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=16,
                                      block_size=4, num_blocks=64, enable_chunked_prefill=chunked,
                                      batch_wait_iters=iters, batch_wait_tokens_ratio=ratio))
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=12)))
    steps = [_step(sched, 0.0), _step(sched, 1.0)]
    sched.add_request(Request("r1", list(range(10, 10 + prompt)), SamplingParams(max_tokens=2)))
    steps += [_step(sched, float(t)) for t in range(2, 7)]
    return steps


def test_batch_wait_holds_a_new_prompt_while_requests_decode_for_its_iterations() -> None:
    # TensorRT-LLM's batch_wait_timeout_iters 3: the prompt (4 + 1 decode = 5 tokens < 0.9 x 16) is held
    # three steps, then joins the fourth; the decode never waits.
    assert _wait_scenario(3, 0.9, 4) == [{"r0": 4}, {"r0": 1}, {"r0": 1}, {"r0": 1}, {"r0": 1},
                                         {"r0": 1, "r1": 4}, {"r0": 1, "r1": 1}]
    # Enough tokens (14 + 1 decode >= 0.9 x 16 = 14.4) end the wait at once, as does a ratio of 0
    # (TensorRT-LLM's token test always passes) or no wait at all.
    admitted_at_once = [{"r0": 4}, {"r0": 1}, {"r0": 1, "r1": 14}, {"r0": 1, "r1": 1}]
    assert _wait_scenario(3, 0.9, 14, chunked=False)[:4] == admitted_at_once
    assert _wait_scenario(3, 0.0, 4)[:3] == [{"r0": 4}, {"r0": 1}, {"r0": 1, "r1": 4}]
    assert _wait_scenario(0, 0.0, 4)[:3] == [{"r0": 4}, {"r0": 1}, {"r0": 1, "r1": 4}]


def test_batch_wait_never_holds_a_prompt_when_nothing_decodes() -> None:
    # "if no generation requests, no need to wait" (py_executor.py _schedule): the first prompts run at once.
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=16,
                                      block_size=4, num_blocks=64, batch_wait_iters=20,
                                      batch_wait_tokens_ratio=0.9))
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3)))
    sched.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=3)))
    assert _step(sched, 0.0) == {"a": 3, "b": 3}


def test_batch_wait_is_the_mixed_policys_only() -> None:
    import pytest
    with pytest.raises(InvalidConfigError, match="batch_wait_iters"):
        SchedulerConfig(batch_policy="prefill_first", batch_wait_iters=20, batch_wait_tokens_ratio=0.9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([1, 3, 20]), st.sampled_from([0.3, 0.9, 1.0]))
def test_batch_wait_ends_every_request_with_exact_outputs_and_holds_at_most_its_iterations(w, iters, ratio) -> None:
    cfg, arrivals = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "mixed", "batch_wait_iters": iters,
                             "batch_wait_tokens_ratio": ratio})
    last = [0]  # the policy's count after the step before

    def check(core, so, waiting_before):
        count = core.scheduler.batch_policy.count
        assert count <= iters  # never more than batch_wait_iters held steps in a row
        if count > last[0]:  # a held step: nothing admitted
            assert count == last[0] + 1 and not so.scheduled_new_reqs
        last[0] = count
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens

    core, log = drive(cfg, arrivals, check=check)
    assert_like_reference_and_freed(core, log, cfg, arrivals)


def _balance(ranks: int = 2, iters: int = 3, wait: int = 0, seqs: int = 8) -> Scheduler:
    """r0 and r1 (4-token prompts) prefill at step 0 and decode after; TensorRT-LLM's attention-DP balance."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=seqs, max_model_len=32,
                                      block_size=4, num_blocks=64, adp_ranks=ranks, adp_balance_iters=iters,
                                      adp_batching_wait_iters=wait))
    for rid in ("r0", "r1"):
        sched.add_request(Request(rid, [1, 2, 3, 4], SamplingParams(max_tokens=20)))
    return sched


def _prompt(rid: str) -> Request:
    return Request(rid, [7, 8, 9, 10], SamplingParams(max_tokens=2))


def test_adp_balance_holds_a_lone_prompt_until_its_step_count_runs_out() -> None:
    # timeout_iters 3 over 2 ranks: nothing decodes at step 0 ("not all ranks have generation requests"), so
    # the first prompts go at once; the count then runs every step, prompts or not (py_executor.py
    # `_balance_adp_requests`): 1 after step 1, 2 after step 2, 3 = timeout at step 3.
    sched = _balance()
    assert _step(sched, 0.0) == {"r0": 4, "r1": 4}
    sched.add_request(_prompt("a"))  # one prompt, two ranks: held
    assert [_step(sched, float(t)) for t in (1, 2, 3)] == [{"r0": 1, "r1": 1}, {"r0": 1, "r1": 1},
                                                           {"r0": 1, "r1": 1, "a": 4}]
    # Arriving a step later it goes at the same step: the count is the balance's, not the prompt's.
    sched = _balance()
    _step(sched, 0.0)
    _step(sched, 1.0)
    sched.add_request(_prompt("a"))
    assert [_step(sched, float(t)) for t in (2, 3)] == [{"r0": 1, "r1": 1}, {"r0": 1, "r1": 1, "a": 4}]


def test_adp_balance_lets_prompts_go_at_once_when_every_rank_has_one() -> None:
    sched = _balance()
    _step(sched, 0.0)
    sched.add_request(_prompt("a"))
    sched.add_request(_prompt("b"))
    assert _step(sched, 1.0) == {"r0": 1, "r1": 1, "a": 4, "b": 4}
    # batching_wait_iters 2: with every rank holding a prompt and a decode, two steps more.
    sched = _balance(wait=2)
    _step(sched, 0.0)
    sched.add_request(_prompt("a"))
    sched.add_request(_prompt("b"))
    assert [_step(sched, float(t)) for t in (1, 2, 3)] == [{"r0": 1, "r1": 1}, {"r0": 1, "r1": 1},
                                                           {"r0": 1, "r1": 1, "a": 4, "b": 4}]


def test_adp_balance_never_holds_while_a_rank_may_have_no_decode() -> None:
    # 4 ranks, 2 requests: the prompt goes to an empty rank (the fewest active requests), which then has a
    # context request and no generation request (no dummy: it is not empty), so the prompt goes at once.
    sched = _balance(ranks=4)
    _step(sched, 0.0)
    sched.add_request(_prompt("a"))
    assert _step(sched, 1.0) == {"r0": 1, "r1": 1, "a": 4}


def test_adp_balance_counts_the_decode_steps_run_without_schedule() -> None:
    # A simulator's decode window (fast_forward.apply_decode_steps) runs steps without schedule():
    # Scheduler.advance_recv hands them to the count, so the prompt goes one step sooner than without.
    sched = _balance()
    _step(sched, 0.0)
    _step(sched, 1.0)  # count 1
    sched.advance_recv(1)  # count 2, as one more step would leave it
    sched.add_request(_prompt("a"))
    assert _step(sched, 2.0) == {"r0": 1, "r1": 1, "a": 4}


def test_adp_balance_needs_attention_dp_and_the_mixed_policy() -> None:
    import pytest

    from twinserve.core.sched.batch_policy import AdpBalance, MixedBatches, make_batch_policy
    assert type(make_batch_policy("mixed", adp_ranks=1, adp_balance_iters=60)) is MixedBatches
    p = make_batch_policy("mixed", adp_ranks=8, adp_balance_iters=60)
    assert isinstance(p, AdpBalance) and (p.ranks, p.timeout_iters, p.batching_wait_iters) == (8, 60, 0)
    with pytest.raises(InvalidConfigError, match="adp_balance_iters"):
        SchedulerConfig(batch_policy="prefill_first", adp_balance_iters=60)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([2, 3, 8]), st.sampled_from([1, 4, 60]), st.sampled_from([0, 2]))
def test_adp_balance_ends_every_request_with_exact_outputs_and_holds_at_most_its_iterations(w, ranks, iters,
                                                                                        wait) -> None:
    from twinserve.core.sched.batch_policy import AdpBalance
    cfg, arrivals = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "mixed", "adp_ranks": ranks,
                             "adp_balance_iters": iters, "adp_batching_wait_iters": wait})
    held = [0]  # steps in a row whose admissions the balance held while requests waited

    def check(core, so, waiting_before):
        policy = core.scheduler.batch_policy
        assert isinstance(policy, AdpBalance)
        if not hasattr(policy, "_held_log"):  # record each step's decision, as the policy made it
            holds = policy._holds

            def logged(sched, _holds=holds, _p=policy):
                _p._held_log = _holds(sched)
                return _p._held_log
            policy._holds = logged
            return
        if policy._held_log and waiting_before:
            assert not so.scheduled_new_reqs  # a held step admits nothing
            held[0] += 1
        else:
            held[0] = 0
        # TensorRT-LLM's bound: timeout_iters - 1 held steps, then batching_wait_iters more at most.
        assert held[0] <= iters - 1 + wait
        assert policy.count < iters and policy.batching_count <= wait
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens

    core, log = drive(cfg, arrivals, check=check)
    assert_like_reference_and_freed(core, log, cfg, arrivals)


def test_adp_balance_waits_for_a_prompt_on_every_rank_not_for_as_many_prompts_as_ranks() -> None:
    # Six requests on two ranks (placed 0, 1, 0, 1, 0, 1: the fewest active first); r0 and r2, both rank 0's,
    # finish after step 2. Their replacements go where they left (rank 0 is below the even share of 3, rank 1
    # at it), so two prompts wait but rank 1 has none: held until the count reaches timeout_iters 5.
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=32,
                                      block_size=4, num_blocks=64, adp_ranks=2, adp_balance_iters=5))
    for i in range(6):
        sched.add_request(Request(f"r{i}", [1, 2, 3, 4], SamplingParams(max_tokens=3 if i in (0, 2) else 20)))
    assert len(_step(sched, 0.0)) == 6  # nothing decodes yet: no wait
    assert [sorted(_step(sched, float(t))) for t in (1, 2)] == [[f"r{i}" for i in range(6)]] * 2
    assert sched.batch_policy.count == 2
    sched.add_request(_prompt("a"))
    sched.add_request(_prompt("b"))
    steps = [_step(sched, float(t)) for t in (3, 4, 5)]
    assert ["a" in s or "b" in s for s in steps] == [False, False, True]
    assert steps[2]["a"] == steps[2]["b"] == 4
    assert [sched.batch_policy.rank_of[r] for r in ("a", "b")] == [0, 0]
