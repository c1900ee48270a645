"""The scheduler's decode fast paths, at the steps they hand back to the general code.

A decode step that crosses a block boundary, one that fills a block (prefix-cache
registration), and stops, eos and length limits landing on those same steps: what a
user sees (tokens, finish reasons, block tables, prefix hits) is pinned down here.
"""

from __future__ import annotations

import pytest

from twinserve.core import (EngineCoreOutput, FinishReason, ModelRunnerOutput, Request,
                            SamplingParams, Scheduler, SchedulerConfig)

BS = 4


def _sched(**kw) -> Scheduler:
    return Scheduler(SchedulerConfig(**{"max_num_batched_tokens": 64, "max_model_len": 64,
                                        "block_size": BS, "num_blocks": 32, **kw}))


def _step(sched: Scheduler, tokens: dict[str, list[int]], now: float):
    """One step; requests not in tokens sample token 9 when they reach the end of their input."""
    so = sched.schedule(now)
    sampled = {}
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        if req.num_computed_tokens == req.num_tokens:
            sampled[rid] = tokens.get(rid, [9])
    return so, sched.update_from_output(so, ModelRunnerOutput(sampled), now + 0.5)


def _block_table(sched: Scheduler, rid: str) -> list[int]:
    return sched.kv.get_block_ids(rid)


@pytest.mark.parametrize("caching", [True, False])
def test_stop_token_on_the_step_that_takes_a_new_block(caching):
    sched = _sched(enable_prefix_caching=caching)
    sched.add_request(Request("a", [1, 2, 3, 4, 5, 6, 7], SamplingParams(stop_token_ids=[42])))
    sched.add_request(Request("b", [1, 2, 3], SamplingParams(max_tokens=20)))
    so, outs = _step(sched, {}, 0.0)  # prefill both: a holds 7 tokens + 1 sampled
    assert [o.new_token_ids for o in outs] == [[9], [9]]
    table = _block_table(sched, "a")
    assert len(table) == 2
    # a: 8 tokens in KV after this step, two full blocks; b fills its first block.
    so, outs = _step(sched, {"a": [9]}, 1.0)
    assert so.scheduled_cached_reqs.new_block_ids == [(), ()]
    # a's next token is the 9th and b's the 5th: a new block each, and a's sampled token
    # stops it.
    so, outs = _step(sched, {"a": [42]}, 2.0)
    new_blocks = dict(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.new_block_ids))
    assert len(new_blocks["a"]) == 1 and new_blocks["a"][0] not in table
    assert len(new_blocks["b"]) == 1
    assert so.scheduled_cached_reqs.num_computed_tokens == [8, 4]
    by_id = {o.req_id: o for o in outs}
    assert by_id["a"].new_token_ids == [42]
    assert by_id["a"].finish_reason is FinishReason.STOP and by_id["a"].stop_reason == 42
    assert by_id["b"].finish_reason is None
    a = sched.kv.req_to_blocks.get("a")
    assert a is None  # freed
    so, _ = _step(sched, {}, 3.0)
    assert so.finished_req_ids == {"a"}
    assert list(so.num_scheduled_tokens) == ["b"]


def test_eos_on_the_step_that_fills_a_block_still_caches_it():
    sched = _sched()
    prompt = [1, 2, 3, 4, 5, 6]
    sched.add_request(Request("a", prompt, SamplingParams(), eos_token_id=0))
    _step(sched, {"a": [7]}, 0.0)  # 6 in KV
    _, outs = _step(sched, {"a": [8]}, 1.0)  # 7 in KV
    assert outs[0].finish_reason is None
    _, outs = _step(sched, {"a": [0]}, 2.0)  # 8 in KV (block 2 full, registered); samples eos
    assert outs[0].new_token_ids == [0] and outs[0].finish_reason is FinishReason.STOP
    assert outs[0].stop_reason is None
    # The block filled by that last step is in the prefix cache: a request with the same
    # first 8 tokens hits both blocks.
    sched.add_request(Request("b", prompt + [7, 8, 11], SamplingParams(max_tokens=1)))
    so, _ = _step(sched, {}, 3.0)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 8


@pytest.mark.parametrize("stop_at, min_tokens, expect", [
    (1, 0, 1),   # first decode token stops
    (2, 3, 5),   # stop token before min_tokens is not honoured: runs to max_tokens
    (4, 3, 4),   # stop past min_tokens
])
def test_stop_tokens_and_min_tokens_across_block_boundaries(stop_at, min_tokens, expect):
    sched = _sched()
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(
        max_tokens=5, min_tokens=min_tokens, stop_token_ids=[42])))
    outs_all = []
    for step in range(10):
        n_out = len(sched.requests["a"].output_token_ids) if "a" in sched.requests else None
        if n_out is None:
            break
        tok = 42 if n_out + 1 == stop_at else 9
        _, outs = _step(sched, {"a": [tok]}, float(step))
        outs_all += outs
    tokens = [t for o in outs_all for t in o.new_token_ids]
    assert len(tokens) == expect
    last = outs_all[-1]
    if expect == 5 and stop_at != 5:
        assert last.finish_reason is FinishReason.LENGTH and last.stop_reason is None
    else:
        assert last.finish_reason is FinishReason.STOP and last.stop_reason == 42


def test_length_limits_on_fast_decode_steps():
    sched = _sched(max_model_len=10)
    sched.add_request(Request("len", [1, 2, 3], SamplingParams(max_tokens=3)))
    sched.add_request(Request("ctx", [1, 2, 3, 4, 5], SamplingParams(max_tokens=100)))
    reasons, counts = {}, {"len": 0, "ctx": 0}
    for step in range(10):
        if not sched.has_unfinished_requests():
            break
        _, outs = _step(sched, {}, float(step))
        for o in outs:
            counts[o.req_id] += len(o.new_token_ids)
            if o.finish_reason is not None:
                reasons[o.req_id] = o.finish_reason
    assert counts == {"len": 3, "ctx": 5}  # ctx stops at max_model_len: 5 + 5 tokens
    assert reasons == {"len": FinishReason.LENGTH, "ctx": FinishReason.LENGTH}


def test_ignore_eos_and_timestamps_on_the_fast_path():
    sched = _sched()
    sched.add_request(Request("a", [1, 2], SamplingParams(max_tokens=4, ignore_eos=True),
                              eos_token_id=0))
    for step in range(4):
        _step(sched, {"a": [0]}, float(step))
    assert "a" not in sched.requests
    so, _ = _step(sched, {}, 9.0)
    assert so.finished_req_ids == {"a"}


def test_outputs_equal_those_built_by_the_constructor():
    sched = _sched()
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=2, stop_token_ids=[42])))
    sched.add_request(Request("b", [1, 2, 3, 4, 5], SamplingParams(max_tokens=4)))
    _, outs = _step(sched, {"a": [5]}, 0.0)
    assert outs == [EngineCoreOutput("a", [5]), EngineCoreOutput("b", [9])]
    _, outs = _step(sched, {"a": [42], "b": [8]}, 1.0)
    assert outs == [EngineCoreOutput("a", [42], FinishReason.STOP, 42), EngineCoreOutput("b", [8])]
    req = Request("c", [1, 2], SamplingParams(max_tokens=3))
    sched.add_request(req)
    _, outs = _step(sched, {"c": [4]}, 2.0)
    assert outs == [EngineCoreOutput("b", [9]), EngineCoreOutput("c", [4])]
    _, outs = _step(sched, {"b": [8], "c": [4, 5, 6]}, 3.0)  # several tokens: the general loop
    assert outs == [EngineCoreOutput("b", [8], FinishReason.LENGTH),
                    EngineCoreOutput("c", [4, 5], FinishReason.LENGTH)]
    assert req.token_times == [2.5, 3.5, 3.5]


def test_mixed_batch_decodes_fast_and_prefills_in_chunks():
    sched = _sched(max_num_batched_tokens=6)
    sched.add_request(Request("d", [1, 2, 3], SamplingParams(max_tokens=10)))
    _step(sched, {}, 0.0)
    sched.add_request(Request("p", list(range(10, 24)), SamplingParams(max_tokens=5)))
    seen = []
    for step in range(1, 5):
        so, _ = _step(sched, {}, float(step))
        seen.append(dict(so.num_scheduled_tokens))
    assert seen == [{"d": 1, "p": 5}, {"d": 1, "p": 5}, {"d": 1, "p": 4}, {"d": 1, "p": 1}]
    assert len(_block_table(sched, "d")) == 2 and len(_block_table(sched, "p")) == 4
