"""A cluster replica's drafting decodes held as counts (sim/spec_lazy.py) against the same run without them.

The counts draw the same acceptances in the same order, so every figure of a run is the run's without them,
random acceptances included."""

from __future__ import annotations

import pytest

from twinserve.sim import spec_window
from twinserve.sim.cluster_study import build_cluster
from twinserve.sim.config import set_field

from .helpers import record_answers, small_config


BLOCKS = 300


@pytest.fixture(autouse=True)
def _windows_for_any_batch(monkeypatch):
    """These small studies test the drafting windows and join steps: let every drafting batch take them."""
    monkeypatch.setattr(spec_window, "SPEC_WINDOW_MIN_BATCH", 1)


def _cfg(seed: int = 0, spread: float = 0.0, output_dist: str = "fixed", blocks: int = 0):
    cfg = small_config(concurrency=24, num_requests=240, warmup_requests=0, num_replicas=2, num_prefill_replicas=1,
                       output_dist=output_dist, output_mean=120)
    set_field(cfg, "run.seed", seed)
    set_field(cfg, "enable_prefix_caching", False)  # the counts' case (spec_window's no-cache replays)
    set_field(cfg, "speculative.method", "ngram")
    set_field(cfg, "speculative.num_speculative_tokens", 3)
    cfg.speculative.acceptance_rates = [0.8, 0.6, 0.5]
    cfg.speculative.acceptance_spread = spread
    if blocks:  # TensorRT-LLM's admission in a pool that holds back some joiners
        set_field(cfg, "capacity_policy", "guaranteed_no_evict")
        set_field(cfg, "engine.num_gpu_blocks", blocks)
    return cfg


def _run(cfg, lazy: bool):
    sim = build_cluster(cfg, keep_steps=True).simulation
    sim.keep_token_times = False
    sim.lazy_drafts = lazy
    calls = {"append_tokens": 0}
    real = spec_window.append_tokens

    def spy(*args, **kw):
        calls["append_tokens"] += 1
        return real(*args, **kw)

    import twinserve.sim.cluster as cluster
    orig = cluster.append_tokens, spec_window.append_tokens
    cluster.append_tokens = spec_window.append_tokens = spy
    try:
        res = sim.run()
    finally:
        cluster.append_tokens, spec_window.append_tokens = orig
    return sim, res, calls["append_tokens"]


def _figures(sim, res):
    recs = sorted((r.request_id, r.num_output_tokens, r.first_token_time, r.finish_time, r.num_preemptions,
                   r.finish_reason) for r in res.total.records)
    reps = []
    for rep in sim.replicas:
        sched = rep.core.scheduler
        st = sched.spec_stats
        log = rep.steps
        reps.append((rep.core.num_steps, list(log.start), list(log.duration), list(log.tokens), list(log.running),
                     st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, list(st.accepted_per_pos),
                     sched.kv.num_free_blocks, rep.executor.totals.busy_time, rep.busy_time, rep.area_kv))
    return recs, reps


@pytest.mark.parametrize("seed,spread,dist", [(0, 0.0, "fixed"), (1, 0.3, "fixed"), (2, 0.0, "lognormal")])
def test_drafting_decodes_held_as_counts_give_the_run_without_them(seed, spread, dist) -> None:
    cfg = _cfg(seed, spread, dist)
    sim_l, res_l, appends_l = _run(cfg, True)
    sim_p, res_p, appends_p = _run(cfg, False)
    decode = sim_l.replicas[-1]
    assert decode.drafts is not None and decode.drafts.num_flushed > 0
    assert all(rep.drafts is None for rep in sim_p.replicas)
    assert appends_p > 0 and appends_l == 0  # no pass over the batch a step: the tokens were kept as counts
    # Every request was read from its object far fewer times than there were drafting steps times the batch.
    assert decode.drafts.num_gathered < sum(decode.steps.running) / 4
    assert _figures(sim_l, res_l) == _figures(sim_p, res_p)
    for rep in sim_l.replicas:  # the requests still running, if any, up to date after the run
        assert not rep.drafts or not rep.drafts.reqs


def test_a_joiner_between_windows_is_read_once_and_its_tokens_reach_its_record() -> None:
    cfg = _cfg(3)
    sim, res, _ = _run(cfg, True)
    decode = sim.replicas[-1]
    # Every decoded request was read once when it joined the counts, plus once after each flush at most.
    assert decode.drafts.num_gathered >= 240
    out = {r.request_id: r.num_output_tokens for r in res.total.records}
    assert len(out) == 240 and set(out.values()) == {120}


def test_guaranteed_no_evict_admissions_read_the_decodes_owed_blocks_from_the_counts(monkeypatch) -> None:
    from twinserve.sim.spec_lazy import LazyDrafts
    answered = record_answers(monkeypatch, LazyDrafts, "owed")
    cfg = _cfg(4, blocks=BLOCKS)
    sim_l, res_l, _ = _run(cfg, True)
    sim_p, res_p, _ = _run(cfg, False)
    assert sum(answered) > 0
    assert max(sim_l.replicas[-1].steps.waiting) > 0  # joiners held back: the owed sum decided admissions
    assert _figures(sim_l, res_l) == _figures(sim_p, res_p)
