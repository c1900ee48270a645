"""core.sched.lazy_decodes against core.sched.fast_forward's passes, request by request: the same
plans (window and context, tight pools included), the same KV usage and finishes per window or
decode half, and after a flush the same tokens, computed counts, fast_decode_limits, known lengths,
block tables (ids) and free-queue order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import SchedulerConfig
from twinserve.core.sched.fast_forward import apply_decode_steps, decode_plan, schedule_decode_half
from twinserve.core.sched.lazy_decodes import LazyDecodes

from .test_fast_forward import _build

TOKENS = {"r0": 7, "r3": 9}  # the rest sample the default token


def _state(s, known) -> tuple:
    kv = s.kv
    return ([(r.request_id, list(r.all_token_ids), list(r.output_token_ids), r.num_computed_tokens,
              r.fast_decode_limit, r.status, r.finish_reason, r.finish_time) for r in s.requests.values()],
            [r.request_id for r in s.running],
            {rid: [b.block_id for b in bl] for rid, bl in kv.req_to_blocks.items()},
            [b.block_id for b in kv.pool.free_queue], kv.num_free_blocks,
            {rid: list(v) for rid, v in known.items()})


def _known(s) -> dict[str, list[int]]:
    return {r.request_id: [r.num_computed_tokens + 1, r.num_prompt_tokens] for r in s.running}


@settings(max_examples=100, deadline=None)
@given(prompts=st.lists(st.integers(1, 70), min_size=1, max_size=12),
       outs=st.lists(st.integers(2, 300), min_size=12, max_size=12),
       spare=st.integers(0, 30), bs=st.sampled_from([4, 16]),
       moves=st.lists(st.tuples(st.sampled_from(["window", "half", "flush"]), st.integers(1, 300),
                                st.floats(0.0, 1.0)), min_size=3, max_size=25))
def test_lazy_windows_and_halves_match_the_passes(prompts, outs, spare, bs, moves) -> None:
    need = sum(-(-(p + m) // bs) for p, m in zip(prompts, outs))
    each = max(-(-(p + m) // bs) for p, m in zip(prompts, outs))
    blocks = max(sum(-(-p // bs) + 1 for p in prompts), need * 2 // 3, each) + spare  # tight: windows cut by room
    cfg = SchedulerConfig(num_blocks=blocks, block_size=bs, max_num_batched_tokens=4096, max_num_seqs=64,
                          max_model_len=4096, enable_prefix_caching=False)
    toks = [[5] * p for p in prompts]
    a = _build(cfg, toks, outs[:len(prompts)])
    b = _build(cfg, toks, outs[:len(prompts)])
    if a.waiting or b.waiting:
        return  # the pool held fewer prompts than given: not a batch of decodes
    known_a, known_b = _known(a), _known(b)
    lazy = LazyDecodes(b, known_b, TOKENS, 1)
    t = 100.0
    for move, cap, frac in moves:
        if not lazy.active and not lazy.enter():
            assert decode_plan(a, 1) == (0, 0) or not a.running
            break
        if move == "flush":
            lazy.flush()
            assert _state(a, known_a) == _state(b, known_b)
            continue
        if move == "half":
            got_a = schedule_decode_half(a, TOKENS.get, 1, known_a)
            got_b = lazy.decode_half()
            assert (got_a is None) == (got_b is None)
            if got_a is None:
                continue
            assert got_a[0] == got_b[0] and got_a[2] == got_b[2]
            assert [r.request_id for r in got_a[1]] == [r.request_id for r in got_b[1]]
            t += 1.0
            from twinserve.core.sched.fast_forward import finish_decode_half
            assert finish_decode_half(a, (), got_a[1], t, False) == finish_decode_half(b, (), got_b[1], t, False)
            continue
        k_a, ctx_a = decode_plan(a, cap)
        assert lazy.plan(cap) == (k_a, ctx_a)
        if k_a == 0:
            continue
        m = max(1, int(frac * k_a))  # an arrival may cut the window
        ends = [t + 0.01 * (j + 1) for j in range(m)]
        t = ends[-1]
        assert apply_decode_steps(a, ends, repeat=TOKENS, default=1, times=False, known=known_a) == lazy.apply(ends)
        if not a.running:
            break
    lazy.flush()
    assert _state(a, known_a) == _state(b, known_b)
