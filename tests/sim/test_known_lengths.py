"""Fast-forward windows and join steps advance the simulated executor's known sequence lengths
(SimExecutor.state) inside their own pass over the batch (core.sched.fast_forward's known=), not in
a pass of the executor's: every request's known length when it ends, and every figure of the run,
must be plain stepping's (fast_forward off), on single engines, clusters and disaggregated ones."""

from __future__ import annotations

import dataclasses

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim.executor import SimExecutor
from twinserve.core import SchedulerConfig
from twinserve.core.sched.fast_forward import apply_decode_steps, decode_window, schedule_decode_half

from ..core.test_fast_forward import _build, _snapshot, _step
from .helpers import small_config


def _run(cfg, ff: bool, keep_token_times: bool) -> tuple:
    from twinserve.sim.build import build
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.study import is_cluster

    ended: list[tuple] = []  # (executor, request, its known lengths) as each request ends
    real = SimExecutor.forget

    def spy(self, rid):
        s = self.state.get(rid)
        ended.append((type(self).__name__, rid, None if s is None else tuple(s)))
        real(self, rid)

    cluster = is_cluster(cfg)
    sim = build_cluster(cfg, keep_steps=True).simulation if cluster else build(cfg).simulation
    sim.fast_forward = ff
    sim.keep_token_times = keep_token_times
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SimExecutor, "forget", spy)
        res = sim.run()
    total = res.total if cluster else res
    windows = total.num_ff_windows
    per = [tuple(dataclasses.astuple(r) for r in total.records)]
    if cluster:
        for rep, rr in zip(sim.replicas, res.replicas):
            per.append((dataclasses.astuple(rr.steps), rr.num_steps,
                        dataclasses.astuple(rep.executor.totals), rep.executor.last_features))
    else:
        per.append((dataclasses.astuple(res.steps), res.num_steps, dataclasses.astuple(sim.executor.totals)))
    return sorted(ended), per, windows


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 16), count=st.integers(2, 30), replicas=st.sampled_from([1, 1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 4), times=st.booleans(), blocks=st.sampled_from([0, 80]),
       budget=st.sampled_from([64, 2048]))
def test_known_lengths_at_each_end_are_steppings(n, count, replicas, disagg, seed, times, blocks, budget) -> None:
    fields = dict(concurrency=n, num_requests=count, warmup_requests=0, num_replicas=replicas,
                  num_prefill_replicas=1 if disagg and replicas > 1 else 0, seed=seed, max_model_len=1024,
                  max_num_batched_tokens=budget, enable_prefix_caching=False, prompt_dist="uniform",
                  prompt_min=16, prompt_max=300, output_dist="uniform", output_min=2, output_max=60)
    if blocks:
        fields["num_gpu_blocks"] = blocks  # full pools: preemptions, waits, short windows
    cfg = small_config(**fields)
    stepped_known, stepped, none = _run(cfg, False, times)
    known, skipped, windows = _run(cfg, True, times)
    assert none == 0
    assert any(s is not None for _, _, s in stepped_known)
    assert known == stepped_known
    assert skipped == stepped


def test_a_closed_loop_cluster_run_takes_windows_and_keeps_the_known_lengths() -> None:
    # Varied lengths, 2 decode replicas: windows of one and of several steps, join steps between.
    cfg = small_config(concurrency=24, num_requests=120, warmup_requests=0, num_replicas=3,
                       num_prefill_replicas=1, seed=2, max_num_batched_tokens=2048, enable_prefix_caching=False,
                       prompt_dist="uniform", prompt_min=16, prompt_max=300, output_dist="uniform",
                       output_min=2, output_max=80)
    stepped_known, stepped, _ = _run(cfg, False, False)
    known, skipped, windows = _run(cfg, True, False)
    assert windows > 20
    assert known == stepped_known
    assert skipped == stepped


def _known(s) -> dict:
    """A model runner's known length per request, as SimExecutor keeps it: every token so far."""
    return {rid: [req.num_tokens, req.num_prompt_tokens] for rid, req in s.requests.items()}


@settings(max_examples=150, deadline=None)
@given(block_size=st.sampled_from([1, 2, 4, 16]), caching=st.booleans(), n=st.integers(1, 6),
       times=st.booleans(), data=st.data())
def test_windows_with_known_lengths_match_stepping(block_size, caching, n, times, data) -> None:
    # apply_decode_steps(repeat=..., known=...) (the simulator's form; without a prefix cache and
    # times=False its own loop, one-step windows appending) window after window to the end, against
    # stepping (a) and against the same windows without known (c, the general loop): the same
    # requests as stepping's, the same block ids and free queue as the general loop's (stepping's
    # too with a prefix cache; without one a window takes its blocks per request, not per step), and
    # each known length advanced by its steps.
    prompts = [list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    needs = [-(-(len(p) + m) // block_size) for p, m in zip(prompts, max_tokens)]
    num_blocks = data.draw(st.integers(max(max(needs), sum(needs) // 2), sum(needs) + 8))
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=caching)
    tokens = {f"r{i}": 7 + i for i in range(n) if i % 3}  # the rest sample the default
    a, b, c = (_build(cfg, prompts, max_tokens) for _ in range(3))
    known = _known(b)
    reqs_a, reqs_b, reqs_c = (sorted(s.requests.values(), key=lambda r: r.request_id) for s in (a, b, c))
    ids = lambda s: {rid: [blk.block_id for blk in bl] for rid, bl in s.kv.req_to_blocks.items()}  # noqa: E731
    t = 1000.0
    while a.requests:
        k = decode_window(b, data.draw(st.integers(1, 6)))
        if k:
            for i in range(k):
                _step_with(a, t + i, tokens)
            ends = [t + i + 0.5 for i in range(k)]
            got = apply_decode_steps(b, ends, repeat=tokens, default=5, times=times, known=known)
            assert got == apply_decode_steps(c, ends, repeat=tokens, default=5, times=times)
            t += k
        else:
            assert _step_with(a, t, tokens) == _step_with(b, t, tokens) == _step_with(c, t, tokens)
            for req in reqs_b:  # stepping's executor: every token so far
                known[req.request_id][0] = req.num_tokens
            t += 1.0
        assert ids(b) == ids(c)
        if caching:
            assert ids(a) == ids(b)
        for req in reqs_b:
            assert known[req.request_id][0] == req.num_tokens, req.request_id
    assert [blk.block_id for blk in b.kv.pool.free_queue] == [blk.block_id for blk in c.kv.pool.free_queue]
    if not times:  # the windows left token_times alone
        for r in reqs_a + reqs_b + reqs_c:
            r.token_times = []
    assert _snapshot(a, reqs_a) == _snapshot(b, reqs_b) == _snapshot(c, reqs_c)
    # _snapshot compares all_token_ids; the windows' own loops append output_token_ids apart.
    outs = [[list(r.output_token_ids) for r in reqs] for reqs in (reqs_a, reqs_b, reqs_c)]
    assert outs[0] == outs[1] == outs[2]


def _step_with(s, t: float, tokens: dict[str, int]) -> list[str]:
    """_step, sampling each request's id from tokens (the mapping the windows repeat)."""
    from twinserve.core import ModelRunnerOutput

    so = s.schedule(t)
    sampled = {}
    for rid in so.num_scheduled_tokens:
        req = s.requests[rid]
        if req.num_computed_tokens == req.num_tokens:
            sampled[rid] = [tokens.get(rid, 5)]
    outs = s.update_from_output(so, ModelRunnerOutput(sampled), t + 0.5)
    return [o.req_id for o in outs if o.finished]


def test_a_declined_decode_half_puts_the_known_lengths_back() -> None:
    # The last running request still in its prompt: schedule_decode_half declines before its pass;
    # a request not plainly decoding in the middle: it declines after advancing those before it,
    # and must put their known lengths back as it puts back their tokens.
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_model_len=64, block_size=4, num_blocks=64,
                          enable_prefix_caching=False)
    s = _build(cfg, [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]], [20, 20, 20])
    known = _known(s)
    before = {rid: list(v) for rid, v in known.items()}
    tokens = [list(r.all_token_ids) for r in s.running]
    s.running[1].sampling_params.stop_token_ids = [3]  # could stop: not a plain decode
    assert schedule_decode_half(s, {}.get, 5, known) is None
    assert known == before
    assert [list(r.all_token_ids) for r in s.running] == tokens
    s.running[1].sampling_params.stop_token_ids = []
    out = schedule_decode_half(s, {}.get, 5, known)
    assert out is not None and out[0] == 3
    assert all(known[rid][0] == before[rid][0] + 1 == s.requests[rid].num_tokens for rid in known)
