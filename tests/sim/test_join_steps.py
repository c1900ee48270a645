"""Join steps (sim.cluster.ClusterSimulation._join_step): a step of plain decodes that admits waiting
requests applies the decodes as a one-step window and takes only the newcomers through schedule and
update_from_output. Everything a run reports must be core.step's: records, step logs, executor
totals, the KV pool's free-queue order, on every replica."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st


from .helpers import run_counting_joins, small_config


def _run(cfg, join: bool, keep_token_times: bool = True) -> tuple:
    sim, res, joins = run_counting_joins(cfg, join_steps=join, keep_token_times=keep_token_times)
    per = []
    for rep, rr in zip(sim.replicas, res.replicas):
        kv = rep.core.scheduler.kv
        per.append((tuple(dataclasses.astuple(r) for r in rr.records), dataclasses.astuple(rr.steps),
                    rr.num_steps, rr.num_ff_windows, rr.num_preemptions, rr.end_time,
                    rep.busy_time, rep.area_in_system, rep.area_kv, rep.area_batch, rep.area_waiting,
                    dataclasses.astuple(rep.executor.totals), rep.executor.last_features,
                    [b.block_id for b in kv.pool.free_queue], kv.stats.queries, kv.stats.hits,
                    _prefix_cache(kv)))
    return (tuple(dataclasses.astuple(r) for r in res.total.records), per), joins


def _prefix_cache(kv) -> tuple:
    """The prefix cache as a lookup sees it: every key (pending chains registered) and its block."""
    if not kv.enable_caching:
        return ()
    kv.flush_pending()
    return (tuple(sorted((value, block.block_id, block.block_hash.token_ids)
                         for value, block in kv.pool.cached.items())),
            tuple(sorted(kv._contested)), kv.lazy)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), blocks=st.sampled_from([0, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), times=st.booleans(), turns=st.sampled_from([1, 1, 2]))
def test_join_steps_give_every_figure_core_step_gives(n, count, replicas, disagg, seed, blocks, budget, times,
                                                      turns) -> None:
    cfg = _cached_config(n, count, replicas, disagg, seed, blocks, budget, turns, 0, caching=False)
    stepped, none = _run(cfg, False, times)
    joined, used = _run(cfg, True, times)
    assert none == 0
    assert joined == stepped


def test_a_closed_loop_run_takes_join_steps() -> None:
    # 16 clients with varied lengths: requests join running batches (the case join steps are for).
    cfg = small_config(concurrency=16, num_requests=60, warmup_requests=0, num_replicas=2,
                       num_prefill_replicas=1, seed=1, max_num_batched_tokens=2048,
                       enable_prefix_caching=False, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                       output_dist="uniform", output_min=2, output_max=60)
    stepped, _ = _run(cfg, False)
    joined, used = _run(cfg, True)
    assert used > 10
    assert joined == stepped


def test_a_declined_join_step_leaves_the_batch_as_it_was(monkeypatch) -> None:
    # schedule_decode_half makes decode_plan's checks in its own pass: a request still in a chunk
    # (budget 64 against prompts up to 300; the last one is checked first) or no room for the
    # decodes' blocks (a small pool) is found after earlier requests were advanced, and those are
    # rolled back before core.step runs.
    from twinserve.core.sched import fast_forward

    undone = []
    real = fast_forward._undo_decode_half

    def spy(running, count, limits, *known):
        undone.append((count, len(limits)))
        return real(running, count, limits, *known)

    monkeypatch.setattr(fast_forward, "_undo_decode_half", spy)
    cfg = small_config(concurrency=16, num_requests=200, warmup_requests=0, num_replicas=2,
                       num_prefill_replicas=0, seed=3, max_num_batched_tokens=64, num_gpu_blocks=60,
                       enable_prefix_caching=False, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                       output_dist="uniform", output_min=2, output_max=60)
    stepped, _ = _run(cfg, False)
    joined, used = _run(cfg, True)
    assert used > 0
    assert sum(1 for count, _ in undone if count > 0) > 3  # rolled back after advancing requests
    assert any(limits for _, limits in undone)  # fast_decode_limit restored too
    assert joined == stepped


def _cached_config(n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts, caching=True):
    """A cluster study of n closed-loop clients (a prefix cache unless caching=False)."""
    fields = dict(concurrency=n, num_requests=count, warmup_requests=0, num_replicas=replicas,
                  num_prefill_replicas=1 if disagg and replicas > 1 else 0, seed=seed, turns=turns,
                  followup_tokens=8, max_model_len=1024, max_num_batched_tokens=budget,
                  enable_prefix_caching=caching, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                  output_dist="uniform", output_min=2, output_max=60)
    if system_prompts:
        # Shared prefixes (a few, Zipf-drawn): joiners hit blocks the running requests registered.
        fields.update(num_system_prompts=system_prompts, system_prompt_len=64, system_prompt_zipf=1.0)
    if blocks:
        fields["num_gpu_blocks"] = blocks  # a small pool: evictions, preemptions, readmitted requests' own hits
    return small_config(**fields)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 24), count=st.integers(4, 40), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), seed=st.integers(0, 5), blocks=st.sampled_from([0, 40, 60, 200]),
       budget=st.sampled_from([64, 256, 2048]), times=st.booleans(), turns=st.sampled_from([1, 1, 2]),
       system_prompts=st.sampled_from([0, 1, 3]))
def test_join_steps_with_a_prefix_cache_give_every_figure_core_step_gives(
        n, count, replicas, disagg, seed, blocks, budget, times, turns, system_prompts) -> None:
    # The decodes' half registers the blocks it fills as allocate_slots would (schedule_decode_half),
    # in schedule()'s order against the new blocks it takes (evictions); a joiner's hits are _admit's.
    cfg = _cached_config(n, count, replicas, disagg, seed, blocks, budget, turns, system_prompts)
    stepped, none = _run(cfg, False, times)
    joined, used = _run(cfg, True, times)
    assert none == 0
    assert joined == stepped


def test_cached_join_steps_run_with_hits_preemptions_and_evictions() -> None:
    # One study that takes join steps while joiners hit shared and their own (multi-turn) prefixes and
    # a small pool preempts: the figures the property test compares are not all trivially equal.
    cfg = _cached_config(16, 80, 2, True, 1, 60, 2048, 2, 3)
    stepped, _ = _run(cfg, False, False)
    joined, used = _run(cfg, True, False)
    assert used > 10
    records = stepped[0]
    per = stepped[1]
    assert sum(p[4] for p in per) > 0  # preemptions
    assert sum(p[15] for p in per) > 0  # prefix hits
    assert records and joined == stepped
