"""schedule_decode_half (a join step's decodes, sim/cluster.py) and request length limits
(Request.stop_check_len: prompt + max_tokens, or max_model_len): a decode whose token reaches the
limit is handed back to be ended in that step, as core.step ends it; a request already at its limit
is not a plain decode, so the pass declines (rolling back what it did) and nothing decodes past it.

Each test was checked against a planted bug in core/sched/fast_forward.py: the `done` branch
removed or inverted, and the `stop_check_len <= n` check removed or inverted, each fails one here.
"""

from __future__ import annotations

from twinserve.core import EngineCore, FinishReason, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.sched.fast_forward import decode_plan, finish_decode_half, schedule_decode_half

from .helpers import make_request

TOKEN = 7


def _decoding() -> EngineCore:
    """Three plain decodes after two steps: a has 2 of its 3 tokens, b and c 2 of 10."""
    cfg = SchedulerConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_model_len=128,
                          enable_prefix_caching=False)
    core = EngineCore(cfg, FakeExecutor(block_size=4))
    for rid, max_tokens in (("b", 10), ("a", 3), ("c", 10)):
        core.add_request(make_request(rid, [10 + len(rid) + j for j in range(5)], max_tokens, ignore_eos=True))
    for step in range(2):
        core.step(float(step))
    sched = core.scheduler
    assert [r.request_id for r in sched.running] == ["b", "a", "c"]
    assert all(len(r.output_token_ids) == 2 and r.num_tokens - r.num_computed_tokens == 1 for r in sched.running)
    return core


def _state(core: EngineCore) -> tuple:
    sched = core.scheduler
    kv = sched.kv
    return (tuple((r.request_id, tuple(r.all_token_ids), tuple(r.output_token_ids), r.num_computed_tokens,
                   r.fast_decode_limit, tuple(b.block_id for b in kv.req_to_blocks[r.request_id]))
                  for r in sched.running), kv.num_free_blocks)


def test_a_decode_that_reaches_its_length_limit_ends_in_that_step_as_core_step_ends_it() -> None:
    ref = _decoding()
    outs, _ = ref.step(2.0)
    ended = {o.req_id: o.finish_reason for o in outs if o.finish_reason is not None}
    assert ended == {"a": FinishReason.LENGTH}

    core = _decoding()
    sched = core.scheduler
    half = schedule_decode_half(sched, lambda rid, default: TOKEN, 0)
    assert half is not None
    n, done, context = half
    assert n == 3  # every running request decodes this step, "a" among them
    assert [r.request_id for r in done] == ["a"]  # only the one at its limit after this token
    assert finish_decode_half(sched, sched.running[:], done, 3.0, False) == ["a"]
    assert "a" not in sched.requests and [r.request_id for r in sched.running] == ["b", "c"]
    assert sched.requests.get("a") is None and len(done[0].output_token_ids) == 3
    assert done[0].finish_reason is FinishReason.LENGTH
    for rid in ("b", "c"):
        assert len(sched.requests[rid].output_token_ids) == 3 and sched.requests[rid].finish_reason is None
    # The same blocks free as after core.step.
    assert sched.kv.num_free_blocks == ref.scheduler.kv.num_free_blocks


def test_a_request_at_its_length_limit_is_not_decoded_and_the_pass_rolls_back() -> None:
    core = _decoding()
    sched = core.scheduler
    a = sched.requests["a"]
    # At its limit while running (no path leaves one there today: this is the check that keeps a
    # later one from decoding past max_tokens). b, before it, was already advanced by the pass.
    a.stop_check_len = len(a.all_token_ids)
    before = _state(core)
    assert decode_plan(sched, 1) == (0, 0)  # decode_plan declines it too
    assert schedule_decode_half(sched, lambda rid, default: TOKEN, 0) is None
    assert _state(core) == before
