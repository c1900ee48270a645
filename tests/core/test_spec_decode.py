"""Speculative decoding in the scheduler and KV manager, through the KV-modelling fake executor.

The fake executor proposes the toy model's own continuation with planted misses and
verifies drafts greedily, so every run's outputs must equal the plain reference, while
each step's KV reads are checked slot by slot (a registered block holding a rejected
draft, or a stale slot after a rollback, fails the run).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import EngineCore, RequestStatus, SchedulerConfig
from twinserve.core.errors import InvalidConfigError
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.spec_decode import SpecDecodeStats, SpeculativeConfig

from .helpers import Arrival, drive, make_request, reference_output
from .test_scheduler_properties import _clone, _fields, workloads


def _spec_check(cfg: SchedulerConfig, spec: SpeculativeConfig, done: set[str], seen: list[int]):
    """Per-step invariants: budget (drafts included), draft caps, nothing unverified cached."""
    def check(core, so, waiting_before):
        sched = core.scheduler
        kv = sched.kv
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert sum(so.num_scheduled_tokens.values()) == so.total_num_scheduled_tokens
        assert not done.intersection(so.num_scheduled_tokens), "scheduled after it ended"
        for rid, drafts in so.scheduled_spec_decode_tokens.items():
            req = sched.requests[rid]
            assert 1 <= len(drafts) <= spec.num_speculative_tokens
            assert so.num_scheduled_tokens[rid] == len(drafts) + 1
            # Drafts that could only land past the length limit are never scheduled.
            assert len(req.all_token_ids) + len(drafts) < req.stop_check_len
            # Decided on the running batch as the step began (before admissions and preemptions).
            assert spec.active(len(sched.running) - len(so.scheduled_new_reqs) + len(so.preempted_req_ids))
            seen.append(len(drafts))
        for req in sched.running:
            rid = req.request_id
            # The prefix cache holds verified tokens only.
            assert kv.num_cached_blocks[rid] * cfg.block_size <= len(req.all_token_ids)
            # Lookahead never reaches past the longest sequence's blocks.
            assert len(kv.req_to_blocks[rid]) <= -(-cfg.max_model_len // cfg.block_size)
        done.update(so.finished_req_ids)
    return check


@st.composite
def spec_configs(draw):
    """A speculative config, and how often the fake's drafts miss."""
    # draft_model also reserves lookahead slots for the draft model's own KV.
    method = draw(st.sampled_from(["ngram", "draft_model"]))
    spec = SpeculativeConfig(method=method, model="draft" if method == "draft_model" else None,
                             num_speculative_tokens=draw(st.integers(1, 6)),
                             disable_by_batch_size=draw(st.sampled_from([0, 0, 2, 5])))
    return spec, draw(st.sampled_from([2, 3, 5, 10_000]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), spec_configs())
def test_speculative_runs_produce_exact_outputs_within_the_budget(w, s):
    cfg, arrivals = w
    spec, miss = s
    done: set[str] = set()
    seen: list[int] = []
    core, log = drive(cfg, arrivals, check=_spec_check(cfg, spec, done, seen), spec=spec,
                      draft_miss=miss)
    ex = FakeExecutor(block_size=cfg.block_size)
    sched = core.scheduler
    for a in arrivals:
        req = a.request
        expected = reference_output(ex, req, cfg.max_model_len)
        assert log.outputs[req.request_id] == expected
        assert req.output_token_ids == expected
        assert req.status.is_finished and req.status != RequestStatus.FINISHED_ABORTED
        assert len(req.token_times) == len(expected)
        assert 0 <= req.num_accepted_tokens <= req.num_draft_tokens
    stats = sched.spec_stats
    assert stats.num_draft_tokens == sum(seen) == sum(a.request.num_draft_tokens for a in arrivals)
    assert stats.num_accepted_tokens == sum(a.request.num_accepted_tokens for a in arrivals)
    assert stats.num_drafts == len(seen)
    kv = sched.kv
    assert kv.num_free_blocks == cfg.num_blocks
    assert not kv.req_to_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), spec_configs())
def test_speculation_under_a_tiny_pool_preempts_and_matches_plain_decoding(w, s):
    cfg, arrivals = w
    spec, miss = s
    small_blocks = -(-cfg.max_model_len // cfg.block_size)
    small = SchedulerConfig(**{**_fields(cfg), "num_blocks": small_blocks})
    _, plain = drive(cfg, _clone(arrivals))
    core, log = drive(small, _clone(arrivals), spec=spec, draft_miss=miss)
    assert log.outputs == plain.outputs
    assert core.scheduler.kv.num_free_blocks == small_blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), spec_configs(), st.data())
def test_aborts_with_speculation_free_everything(w, s, data):
    cfg, arrivals = w
    spec, miss = s
    ids = [a.request.request_id for a in arrivals]
    aborts: dict[int, list[str]] = {}
    for rid in data.draw(st.lists(st.sampled_from(ids), max_size=len(ids), unique=True)):
        aborts.setdefault(data.draw(st.integers(0, 60)), []).append(rid)
    core, log = drive(cfg, arrivals, aborts=aborts, spec=spec, draft_miss=miss)
    ex = FakeExecutor(block_size=cfg.block_size)
    for a in arrivals:
        expected = reference_output(ex, a.request, cfg.max_model_len)
        got = log.outputs[a.request.request_id]
        assert got == expected[: len(got)]
        if a.request.status != RequestStatus.FINISHED_ABORTED:
            assert got == expected
    assert core.scheduler.kv.num_free_blocks == cfg.num_blocks


def _core(spec: SpeculativeConfig, miss: int = 10_000, **cfg_kw) -> tuple[EngineCore, FakeExecutor]:
    cfg = SchedulerConfig(**{"max_num_batched_tokens": 64, "max_model_len": 256, "block_size": 4,
                             "num_blocks": 128, **cfg_kw})
    ex = FakeExecutor(block_size=cfg.block_size, model_kv=True,
                      num_speculative_tokens=spec.num_speculative_tokens, draft_miss=miss)
    return EngineCore(cfg, ex, speculative_config=spec), ex


def _run(core: EngineCore, max_steps: int = 500) -> list:
    outs = []
    for step in range(max_steps):
        if not core.has_unfinished_requests():
            return outs
        o, _ = core.step(float(step))
        outs.extend(o)
    raise AssertionError("did not finish")


def test_several_tokens_are_accepted_per_step_and_counted_per_step_and_request():
    core, ex = _core(SpeculativeConfig(num_speculative_tokens=4))
    req = make_request("a", [1, 2, 3, 4, 5], 21)
    core.add_request(req)
    stats = []
    for step in range(100):
        if not core.has_unfinished_requests():
            break
        outs, st_ = core.step(float(step))
        stats.append(st_)
    # Drafts never miss: a prefill step, then 5 tokens per step (4 drafts + the bonus).
    assert req.output_token_ids == reference_output(FakeExecutor(block_size=4), req, 256)
    assert len(stats) == 1 + 4  # 1 + 4 * 5 = 21 tokens
    assert [s.num_accepted_tokens for s in stats] == [0, 4, 4, 4, 4]
    assert req.num_draft_tokens == req.num_accepted_tokens == 16
    assert core.scheduler.spec_stats.accepted_per_pos == [4, 4, 4, 4]


def test_rejections_roll_back_and_give_blocks_back():
    # Every draft misses at some position; after each step the request holds exactly the
    # blocks its verified tokens need, as without speculation.
    core, ex = _core(SpeculativeConfig(num_speculative_tokens=6), miss=2)
    req = make_request("a", [9, 8, 7], 60)
    core.add_request(req)
    sched = core.scheduler
    dropped = 0
    for step in range(200):
        if not core.has_unfinished_requests():
            break
        core.step(float(step))
        dropped += sum(core.last_scheduler_output.num_dropped_blocks.values())
        if req.status == RequestStatus.RUNNING:
            held = len(sched.kv.req_to_blocks["a"])
            assert held == -(-req.num_computed_tokens // 4)
            assert req.num_computed_tokens == len(req.all_token_ids) - 1
    assert req.output_token_ids == reference_output(FakeExecutor(block_size=4), req, 256)
    assert req.num_accepted_tokens < req.num_draft_tokens
    assert dropped > 0  # some rejected drafts did take a block of their own
    assert sched.kv.num_free_blocks == 128


def test_a_stop_inside_an_accepted_run_ends_the_request_there():
    ex = FakeExecutor(block_size=4)
    prompt = [1, 2, 3]
    ref = reference_output(ex, make_request("x", prompt, 30), 256)
    eos = ref[6]  # the 7th token: inside the second step's accepted run
    first = ref.index(eos)
    for min_tokens in (0, first + 1):
        core, _ = _core(SpeculativeConfig(num_speculative_tokens=4))
        req = make_request("a", prompt, 30, eos_token_id=eos, min_tokens=min_tokens)
        core.add_request(req)
        outs = _run(core)
        expected = reference_output(ex, req, 256)
        assert req.output_token_ids == expected
        assert sum(len(o.new_token_ids) for o in outs) == len(expected)
        if min_tokens == 0:
            assert expected[-1] == eos and req.finish_reason.value == "stop"
        else:
            assert len(expected) > first + 1  # min_tokens held the first EOS back


def test_max_tokens_caps_the_drafts_and_the_output():
    core, _ = _core(SpeculativeConfig(num_speculative_tokens=8))
    req = make_request("a", [4, 5], 7)
    core.add_request(req)
    _run(core)
    assert len(req.output_token_ids) == 7 and req.finish_reason.value == "length"
    # After the first token 6 are left: drafts are capped at 5 so the bonus is the 7th.
    assert req.num_draft_tokens == 5


def test_disable_by_batch_size_switches_drafts_off():
    core, _ = _core(SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=2))
    for i in range(2):
        core.add_request(make_request(f"r{i}", [i + 1, 7, 7], 12))
    _run(core)
    assert core.scheduler.spec_stats.num_drafts == 0
    core, _ = _core(SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=3))
    for i in range(2):
        core.add_request(make_request(f"r{i}", [i + 1, 7, 7], 12))
    _run(core)
    assert core.scheduler.spec_stats.num_drafts > 0


def test_drafts_share_the_budget_and_each_request_keeps_its_token():
    # Budget 6 with 4 decoding requests: 2 spare tokens go to drafts, every request runs.
    core, _ = _core(SpeculativeConfig(num_speculative_tokens=4), max_num_batched_tokens=6,
                    max_num_seqs=4, max_model_len=64)
    reqs = [make_request(f"r{i}", [i + 1], 20) for i in range(4)]
    for r in reqs:
        core.add_request(r)
    core.step(0.0)  # four one-token prefills
    for step in range(1, 4):
        core.step(float(step))
        so = core.last_scheduler_output
        assert len(so.num_scheduled_tokens) == 4
        assert so.total_num_scheduled_tokens <= 6
        assert sum(len(d) for d in so.scheduled_spec_decode_tokens.values()) == 2


def test_spec_config_rejects_bad_input_with_typed_errors():
    with pytest.raises(InvalidConfigError, match="method"):
        SpeculativeConfig.from_dict({"method": "eagle9"})
    for k in (0, -1, 33, 2.5, True):
        with pytest.raises(InvalidConfigError, match="num_speculative_tokens"):
            SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": k})
    with pytest.raises(InvalidConfigError, match="prompt_lookup_max"):
        SpeculativeConfig.from_dict({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2})
    with pytest.raises(InvalidConfigError, match="speculative_config"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_spec_tokens": 4})
    with pytest.raises(InvalidConfigError, match="JSON"):
        SpeculativeConfig.from_dict("{method: ngram")
    with pytest.raises(InvalidConfigError, match="model"):
        SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 2})
    cfg = SpeculativeConfig.from_dict('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}')
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_max) == ("ngram", 4, 4)


def test_stats_count_acceptance_by_position():
    s = SpecDecodeStats()
    s.observe(4, 2)
    s.observe(3, 3)
    s.observe(4, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 11, 5)
    assert s.accepted_per_pos == [2, 2, 1, 0]


def test_a_draft_model_step_holds_k_lookahead_slots_past_its_tokens_and_ngram_none():
    for method, k in (("draft_model", 3), ("ngram", 0)):
        spec = SpeculativeConfig(method=method, model="d" if method == "draft_model" else None,
                                 num_speculative_tokens=3)
        cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=128)
        checked: list[int] = []

        def check(core, so, waiting_before, k=k, checked=checked):
            sched = core.scheduler
            for rid, n in so.num_scheduled_tokens.items():
                req = sched.requests[rid]
                nd = len(so.scheduled_spec_decode_tokens.get(rid, ()))
                end = len(req.all_token_ids)
                if req.num_computed_tokens == end + nd:  # this step samples
                    held = len(sched.kv.req_to_blocks[rid]) * cfg.block_size
                    want = min(end + nd + k, cfg.max_model_len)
                    assert held >= want
                    if k == 0:
                        assert held - (end + nd) < cfg.block_size  # nothing beyond the last block
                    checked.append(rid)

        arrivals = [Arrival(0, make_request(f"r{i}", list(range(1, 6 + i)), 40)) for i in range(3)]
        drive(cfg, arrivals, check=check, spec=spec, draft_miss=3)
        assert len(checked) > 20


def test_a_stop_inside_an_accepted_run_cuts_the_logprobs_with_the_tokens():
    """Issue 53 item 14: one logprob per token returned, the stop's run cut after the stop token."""
    from twinserve.core.sched.output import Logprob

    ex0 = FakeExecutor(block_size=4)
    prompt = [1, 2, 3]
    eos = reference_output(ex0, make_request("x", prompt, 30), 256)[6]
    core, ex = _core(SpeculativeConfig(num_speculative_tokens=4))
    execute = ex.execute

    def with_logprobs(so):  # one record per sampled token, as the real sampler returns
        out = execute(so)
        out.logprobs = {rid: [Logprob(t, -0.5, 1) for t in ids] for rid, ids in out.sampled_token_ids.items()}
        return out

    ex.execute = with_logprobs
    req = make_request("a", prompt, 30, eos_token_id=eos)
    core.add_request(req)
    outs = _run(core)
    assert req.output_token_ids[-1] == eos and req.finish_reason.value == "stop"
    assert any(len(o.new_token_ids) > 1 for o in outs)  # runs of several accepted tokens
    for o in outs:
        assert [lp.token_id for lp in o.new_logprobs] == list(o.new_token_ids)
