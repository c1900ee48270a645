"""The plain decode step's shortcuts, at the edges where they hand back to the general code.

schedule()'s first loop checks no budget per request (it covers at most `budget` requests
and tracks only the tokens taken past one each); update_from_output walks self.running
when the step took all of it, and checks a quick form of the stop rule before the full
one. Each test pins what a user sees (who runs with how many tokens, which tokens come
back, why a request ends) against the rule written out plainly.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import (FinishReason, ModelRunnerOutput, Request, SamplingParams, Scheduler,
                            SchedulerConfig)


def _sched(**kw) -> Scheduler:
    return Scheduler(SchedulerConfig(**{"max_num_batched_tokens": 64, "max_model_len": 64,
                                        "block_size": 4, "num_blocks": 256, **kw}))


def _expected_batch(sched: Scheduler) -> dict[str, int]:
    """What the step must schedule among running requests: in order, each what it has left
    (capped by the long-prefill threshold) out of what the budget still holds."""
    cfg = sched.config
    budget = cfg.max_num_batched_tokens
    out = {}
    for req in sched.running:
        if budget <= 0:
            break
        n = req.num_tokens - req.num_computed_tokens
        if 0 < cfg.long_prefill_token_threshold < n:
            n = cfg.long_prefill_token_threshold
        n = min(n, budget)
        if n > 0:
            out[req.request_id] = n
            budget -= n
    return out


def _sample_all(sched: Scheduler, so, token: int = 9) -> ModelRunnerOutput:
    sampled = {}
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        if req.num_computed_tokens == req.num_tokens:
            sampled[rid] = [token]
    return ModelRunnerOutput(sampled)


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(1, 40), threshold=st.sampled_from([0, 3, 7]),
       prompts=st.lists(st.integers(1, 30), min_size=1, max_size=12),
       arrive=st.lists(st.integers(0, 6), min_size=12, max_size=12),
       skip=st.lists(st.booleans(), min_size=12, max_size=12),
       several=st.lists(st.integers(1, 4), min_size=12, max_size=12))
def test_running_requests_get_what_the_budget_holds_in_order(budget, threshold, prompts, arrive,
                                                             skip, several):
    """Decodes, prefill chunks, requests with several tokens to compute (after an executor
    returned several) and requests with nothing to compute, mixed in any order, with budgets
    below and above the number running: the batch is the plain greedy rule's, and a request
    with nothing to compute is ended with an error (no step could ever advance it)."""
    sched = _sched(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
                   max_num_seqs=12)
    pending = [(arrive[i], Request(f"r{i}", [1 + i] * n, SamplingParams(max_tokens=30)))
               for i, n in enumerate(prompts)]
    for step in range(25):
        for at, req in pending:
            if at == step:
                sched.add_request(req)
        expected = _expected_batch(sched)
        stalled = [r.request_id for r in sched.running if r.num_tokens <= r.num_computed_tokens]
        so = sched.schedule(float(step))
        got = {rid: n for rid, n in so.num_scheduled_tokens.items()
               if rid not in {r.req_id for r in so.scheduled_new_reqs}}
        assert got == expected
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        assert so.total_num_scheduled_tokens <= budget
        mro = _sample_all(sched, so)
        for rid in mro.sampled_token_ids:
            if step % 2:
                mro.sampled_token_ids[rid] = [9] * several[int(rid[1:])]
        # Some requests that reached the end of their input get no token back (as after an
        # executor hiccup): next step they have nothing to compute, are passed over and fail.
        for i, rid in enumerate(list(mro.sampled_token_ids)):
            if skip[int(rid[1:])] and step % 3 == i % 3:
                del mro.sampled_token_ids[rid]
        outs = sched.update_from_output(so, mro, float(step))
        # Failed once the step reaches them (a budget spent before them defers it, as their turn).
        failed = [o.req_id for o in outs if o.error]
        assert failed == [rid for rid in stalled if rid in failed]
        assert all(o.error.startswith("ComputedTokensError") for o in outs if o.error)
        assert [o.req_id for o in outs if not o.error] == list(mro.sampled_token_ids)


def test_abort_between_schedule_and_update_drops_only_that_request():
    sched = _sched()
    for i in range(4):
        sched.add_request(Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=10)))
    so = sched.schedule(0.0)
    sched.update_from_output(so, _sample_all(sched, so), 0.5)
    so = sched.schedule(1.0)  # every running request decodes: the whole batch
    assert list(so.num_scheduled_tokens) == ["r0", "r1", "r2", "r3"]
    sched.abort_requests(["r1"], now=1.2)
    # The executor still returns a token for it (the step ran before the abort landed).
    outs = sched.update_from_output(so, ModelRunnerOutput({f"r{i}": [5] for i in range(4)}), 1.5)
    assert [(o.req_id, o.new_token_ids) for o in outs] == [("r0", [5]), ("r2", [5]), ("r3", [5])]
    assert [r.request_id for r in sched.running] == ["r0", "r2", "r3"]
    assert all(sched.requests[r].output_token_ids == [9, 5] for r in ("r0", "r2", "r3"))


def test_update_with_an_older_output_looks_requests_up():
    """An output applied twice (the second time it is not the last schedule()'s) still
    applies to exactly the requests that sampled."""
    sched = _sched()
    for i in range(3):
        sched.add_request(Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=10)))
    so = sched.schedule(0.0)
    sched.update_from_output(so, _sample_all(sched, so), 0.5)
    so = sched.schedule(1.0)
    outs = sched.update_from_output(so, ModelRunnerOutput({"r1": [4]}), 1.5)
    assert [(o.req_id, o.new_token_ids) for o in outs] == [("r1", [4])]
    # The same output again, now stale: the scheduler must not assume it covers the batch.
    outs = sched.update_from_output(so, ModelRunnerOutput({"r2": [6]}), 2.0)
    assert [(o.req_id, o.new_token_ids) for o in outs] == [("r2", [6])]
    assert sched.requests["r0"].output_token_ids == [9]


def _full_rule(sp: SamplingParams, eos: int | None, max_tokens: int, max_model_len: int,
               prompt_len: int, tokens: list[int]) -> tuple[list[int], FinishReason | None, int | None]:
    """The stop rule written out: the tokens kept, the finish reason and the stop token."""
    kept = []
    for t in tokens:
        kept.append(t)
        n = len(kept)
        if n > sp.min_tokens:
            if t == eos and not sp.ignore_eos:
                return kept, FinishReason.STOP, None
            if t in sp.stop_token_ids:
                return kept, FinishReason.STOP, t
        if n >= max_tokens or prompt_len + n >= max_model_len:
            return kept, FinishReason.LENGTH, None
    return kept, None, None


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=8),
       per_step=st.integers(1, 3),
       eos=st.sampled_from([None, 0, 1]), ignore_eos=st.booleans(),
       stop_ids=st.lists(st.integers(0, 5), max_size=3), min_tokens=st.integers(0, 3),
       max_tokens=st.integers(3, 9), prompt_len=st.integers(1, 6))
def test_stop_rule_on_one_and_several_tokens_a_step(tokens, per_step, eos, ignore_eos, stop_ids,
                                                    min_tokens, max_tokens, prompt_len):
    """EOS (ignored or not, also listed as a stop id), stop ids, min_tokens and both length
    limits, with one token a step or several (the stop cuts the step's tokens short)."""
    max_model_len = 12
    sp = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                        stop_token_ids=stop_ids, ignore_eos=ignore_eos)
    sched = _sched(max_model_len=max_model_len)
    sched.add_request(Request("a", [7] * prompt_len, sp, eos_token_id=eos))
    so = sched.schedule(0.0)  # the prompt
    got: list[int] = []
    reason = stop = None
    feed = list(tokens)
    step = 0
    while feed:
        chunk, feed = feed[:per_step], feed[per_step:]
        outs = sched.update_from_output(so, ModelRunnerOutput({"a": chunk}), float(step))
        (out,) = outs
        got += out.new_token_ids
        if out.finish_reason is not None:
            reason, stop = out.finish_reason, out.stop_reason
            break
        step += 1
        so = sched.schedule(float(step))
        assert list(so.num_scheduled_tokens) == ["a"]
    assert (got, reason, stop) == _full_rule(sp, eos, max_tokens, max_model_len, prompt_len, tokens)
    if reason is not None:
        req = sched.requests.get("a")
        assert req is None and "a" in sched.finished_req_ids


def test_a_fast_forward_window_leaves_plain_decodes_on_the_fast_path(monkeypatch):
    """After a window (which takes blocks without the scheduler), a decode whose slot is in a
    held block and fills none still skips allocate_slots, and the step is the same as one
    whose KV manager is asked for every request."""
    from twinserve.core.sched.fast_forward import apply_decode_steps, decode_window

    def build() -> Scheduler:
        sched = _sched(block_size=16, num_blocks=64, max_model_len=256)
        for i in range(3):
            sched.add_request(Request(f"r{i}", [1 + i] * (5 + i), SamplingParams(max_tokens=100)))
        so = sched.schedule(0.0)
        sched.update_from_output(so, _sample_all(sched, so), 0.5)
        return sched

    sched, plain = build(), build()
    for s in (sched, plain):
        k = decode_window(s, 20)
        assert k == 20
        apply_decode_steps(s, [1.0 + j for j in range(k)], lambda req, n: [9] * n)
    # Computed tokens now 25..27 (a second block holds 32..), no block fills next step.
    assert [r.num_computed_tokens for r in sched.running] == [25, 26, 27]
    calls = []
    real = sched.kv.allocate_slots
    monkeypatch.setattr(sched.kv, "allocate_slots", lambda req, *a, **kw: (
        calls.append(req.request_id), real(req, *a, **kw))[1])
    so = sched.schedule(30.0)
    assert calls == []
    for req in plain.running:
        req.fast_decode_limit = 0  # no bound: every request asks the KV manager
    expected = plain.schedule(30.0)
    assert (so.num_scheduled_tokens, so.scheduled_cached_reqs) == (
        expected.num_scheduled_tokens, expected.scheduled_cached_reqs)


def test_priority_victim_passed_over_in_the_same_step_is_preempted_without_a_rollback():
    """The victim is a running request the step passed over (its last step returned no token,
    so it had nothing to compute): it is preempted, with no tokens to hand back (was a KeyError),
    and its recompute heals it (it is not failed)."""
    sched = _sched(policy="priority", num_blocks=3, max_model_len=12)
    low = Request("low", [1] * 4, SamplingParams(max_tokens=5), priority=5)
    sched.add_request(low)
    so = sched.schedule(0.0)
    sched.update_from_output(so, _sample_all(sched, so), 0.5)
    high = Request("high", [2] * 4, SamplingParams(max_tokens=5), priority=0)
    sched.add_request(high)
    so = sched.schedule(1.0)  # low decodes into its second block; high takes the last one
    assert so.num_scheduled_tokens == {"low": 1, "high": 4}
    sched.update_from_output(so, ModelRunnerOutput({"high": [9]}), 1.5)  # no token back for low
    so = sched.schedule(2.0)  # high's decode needs a block: low, passed over, gives its two
    assert so.preempted_req_ids == ["low"]
    assert so.num_scheduled_tokens == {"high": 1}
    assert so.total_num_scheduled_tokens == 1
    assert low.status.name == "PREEMPTED" and list(sched.waiting) == [low]
    assert sched.kv.num_free_blocks == 1  # one of low's blocks went to high
    assert not sched.update_from_output(so, ModelRunnerOutput({}), 2.5)  # low was not failed
