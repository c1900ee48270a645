"""Exact decode fast-forward (core/sched/fast_forward.py) against step-by-step scheduling."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.sched.fast_forward import apply_decode_steps, decode_window
from ..limits import bounded


def _token(req: Request, position: int) -> int:
    # Requests with equal prompts sample equal tokens, so their blocks collide in the cache.
    return (sum(req.prompt_token_ids) * 7 + position * 13) % 50 + 1


def _build(cfg: SchedulerConfig, prompts: list[list[int]], max_tokens: list[int], **sp) -> Scheduler:
    """A scheduler whose requests have all finished their prompts (stepped until then)."""
    s = Scheduler(cfg)
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        s.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=m, **sp)))
    t = 0.0
    for _ in bounded():
        if not (s.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in s.running)):
            break
        _step(s, t)
        t += 1.0
    return s


def _step(s: Scheduler, t: float) -> list[str]:
    so = s.schedule(t)
    sampled = {}
    for rid in so.num_scheduled_tokens:
        req = s.requests[rid]
        if req.num_computed_tokens == req.num_tokens:
            sampled[rid] = [_token(req, req.num_tokens)]
    # A host tier's loads land within their step.
    outs = s.update_from_output(so, ModelRunnerOutput(sampled, finished_loads=list(so.kv_loads)), t + 0.5)
    return [o.req_id for o in outs if o.finished]


def _snapshot(s: Scheduler, reqs: list[Request]) -> dict:
    kv = s.kv
    if not kv.enable_caching:
        # Without a prefix cache fast-forward takes a window's blocks in one call per
        # request (no result depends on which ids a request gets): compare counts.
        return {"requests": [(r.request_id, list(r.all_token_ids), r.num_computed_tokens, r.status,
                              r.finish_reason, list(r.token_times), r.finish_time) for r in reqs],
                "tables": {rid: len(bl) for rid, bl in kv.req_to_blocks.items()},
                "free": kv.num_free_blocks, "running": [r.request_id for r in s.running]}
    return {
        "requests": [(r.request_id, list(r.all_token_ids), r.num_computed_tokens, r.status,
                      r.finish_reason, list(r.token_times), r.finish_time,
                      [h.value for h in r.block_hashes]) for r in reqs],
        "tables": {rid: [b.block_id for b in bl] for rid, bl in kv.req_to_blocks.items()},
        "num_cached": dict(kv.num_cached_blocks),
        "cached": {v: b.block_id for v, b in kv.pool.cached.items()},
        "keys": [None if b.block_hash is None else b.block_hash.value for b in kv.pool.blocks],
        "free": [b.block_id for b in kv.pool.free_queue],
        "running": [r.request_id for r in s.running],
        "evictions": kv.pool.num_evictions,
    }


def _compare(cfg: SchedulerConfig, prompts, max_tokens, steps_cap: int = 10_000) -> int:
    """Step one copy and fast-forward another over the same window; returns the window."""
    a = _build(cfg, prompts, max_tokens)
    b = _build(cfg, prompts, max_tokens)
    t0 = 1000.0
    k = decode_window(b, steps_cap)
    if k == 0:
        return 0
    usage_a, finished_a = [], []
    for i in range(k):
        before = a.num_preemptions
        finished_a = _step(a, t0 + i)
        assert a.num_preemptions == before, f"stepping preempted in step {i} of a {k}-step window"
        usage_a.append(a.kv.usage)
    assert a.num_preemptions == b.num_preemptions
    ends = [t0 + i + 0.5 for i in range(k)]
    usage_b, finished_b = apply_decode_steps(
        b, ends, lambda req, m: [_token(req, req.num_tokens + j) for j in range(m)])
    assert finished_b == finished_a
    assert usage_b == usage_a
    reqs_a = sorted(a.requests.values(), key=lambda r: r.request_id)
    reqs_b = sorted(b.requests.values(), key=lambda r: r.request_id)
    assert _snapshot(a, reqs_a) == _snapshot(b, reqs_b)
    return k


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4, 16]), caching=st.booleans(),
       shared=st.booleans(), n=st.integers(1, 6), data=st.data())
def test_fast_forward_matches_stepping(block_size, caching, shared, n, data):
    # shared: several requests with one prompt decode in lockstep, so each step computes
    # the same block twice and the latest copy must take the key in the same order.
    prompts = [[3] * data.draw(st.integers(1, 20)) if shared and i % 2 else
               list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    needs = [-(-(len(p) + m) // block_size) for p, m in zip(prompts, max_tokens)]
    num_blocks = data.draw(st.integers(max(max(needs), sum(needs) // 2), sum(needs) + 8))
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=caching)
    _compare(cfg, prompts, max_tokens)


def test_window_is_limited_by_free_blocks_and_one_more_step_would_preempt():
    # Two requests with 7 computed tokens each hold 2 blocks of 4 in a pool of 6: the 2 free
    # blocks carry both through positions 7-11 (5 steps); position 12 needs 2 more blocks.
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=6)
    prompts = [list(range(1, 8)), list(range(20, 27))]
    k = _compare(cfg, prompts, [12, 12])
    assert k == 5  # below the length limit (11 more tokens)
    probe = _build(cfg, prompts, [12, 12])
    for i in range(k):
        _step(probe, float(i))
    assert probe.num_preemptions == 0
    _step(probe, float(k))
    assert probe.num_preemptions == 1
    s = _build(cfg, prompts, [12, 12])
    assert decode_window(s, 3) == 3  # the caller's cap


def test_window_ends_on_the_first_length_finish():
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=64)
    assert _compare(cfg, [[1, 2, 3], [4, 5, 6, 7, 8]], [5, 9]) == 4  # r0 ends on its 5th token


def test_no_window_when_a_sampled_token_could_stop_the_request():
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=64)
    prompts = [[1, 2, 3], [4, 5, 6]]
    assert decode_window(_build(cfg, prompts, [20, 20]), 100) == 19
    assert decode_window(_build(cfg, prompts, [20, 20], stop_token_ids=[9]), 100) == 0
    s = _build(cfg, prompts, [20, 20])
    s.running[1].eos_token_id = 0
    assert decode_window(s, 100) == 0  # EOS could end it: step normally
    s.running[1].sampling_params = SamplingParams(max_tokens=20, ignore_eos=True)
    assert decode_window(s, 100) == 19
    s.add_request(Request("late", [1], SamplingParams(max_tokens=2)))
    assert decode_window(s, 100) == 0  # someone waits: the next step admits it


def test_a_window_where_one_request_takes_over_another_ones_pending_chain():
    # Equal prompts decode in lockstep with one-token blocks: each step the later request
    # registers the key the earlier one's pending chain starts from, so the chain must
    # register mid-window, up to that step only (found at 1,500 examples above).
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=1, num_blocks=12, enable_prefix_caching=True)
    prompts = [[1], [3, 3, 3], [21], [3, 3, 3, 3], [41]]
    assert _compare(cfg, prompts, [2, 2, 2, 2, 2]) >= 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 4, 16]), caching=st.booleans(), n=st.integers(1, 5),
       data=st.data())
def test_repeat_ids_apply_the_same_window_as_token_ids(block_size, caching, n, data):
    # The mapping form (one id per request, repeated; absent ids sample the default) is the
    # simulator's fast path: it must give what the callable form gives for the same ids.
    prompts = [list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=block_size, num_blocks=64, enable_prefix_caching=caching)
    ids = {f"r{i}": data.draw(st.integers(2, 60)) for i in range(n) if data.draw(st.booleans())}
    default = data.draw(st.integers(2, 60))
    a, b = _build(cfg, prompts, max_tokens), _build(cfg, prompts, max_tokens)
    k = decode_window(a, 10_000)
    if k == 0:
        return
    ends = [1000.0 + i for i in range(k)]
    got_a = apply_decode_steps(a, ends, lambda req, m: [ids.get(req.request_id, default)] * m)
    got_b = apply_decode_steps(b, ends, repeat=ids, default=default)
    assert got_a == got_b
    reqs_a = sorted(a.requests.values(), key=lambda r: r.request_id)
    reqs_b = sorted(b.requests.values(), key=lambda r: r.request_id)
    assert _snapshot(a, reqs_a) == _snapshot(b, reqs_b)
    assert [r.output_token_ids[-1] for r in reqs_b] == [ids.get(r.request_id, default)
                                                         for r in reqs_b]


def _window_snapshot(s: Scheduler) -> dict:
    """Every group's table by block id (-1: out of the window), the free queue's order, drops."""
    kv = s.kv
    tables = kv.req_tables if kv.num_groups > 1 else {r: [bl] for r, bl in kv.req_to_blocks.items()}
    return {"tables": {rid: [[b.block_id for b in t] for t in ts] for rid, ts in tables.items()},
            "free": [b.block_id for b in kv.pool.free_queue], "dropped": kv.num_window_freed,
            "requests": sorted((r.request_id, list(r.all_token_ids), r.num_computed_tokens, r.finish_time)
                               for r in s.requests.values())}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4]), window=st.integers(1, 12), groups=st.booleans(),
       n=st.integers(1, 5), data=st.data())
def test_fast_forward_with_sliding_windows_matches_stepping_block_for_block(block_size, window, groups, n, data):
    # Without a prefix cache, a window's k decode steps replay allocate_slots where stepping calls
    # it: the same blocks dropped and taken, in the same order (compared by id, not only counts).
    prompts = [list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    per_req = [(2 if groups else 1) * -(-(len(p) + m) // block_size) for p, m in zip(prompts, max_tokens)]
    num_blocks = data.draw(st.integers(max(per_req), sum(per_req) + 8))
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64, block_size=block_size,
                          num_blocks=num_blocks, enable_prefix_caching=False,
                          **({"kv_groups": (0, window)} if groups else {"sliding_window": window}))
    a, b = _build(cfg, prompts, max_tokens), _build(cfg, prompts, max_tokens)
    k = decode_window(b, 10_000)
    if k == 0:
        return
    usage_a, finished_a = [], []
    for i in range(k):
        before = a.num_preemptions
        finished_a = _step(a, 1000.0 + i)
        assert a.num_preemptions == before, f"stepping preempted in step {i} of a {k}-step window"
        usage_a.append(a.kv.usage)
    usage_b, finished_b = apply_decode_steps(
        b, [1000.0 + i + 0.5 for i in range(k)], lambda req, m: [_token(req, req.num_tokens + j) for j in range(m)])
    assert (usage_b, finished_b) == (usage_a, finished_a)
    assert _window_snapshot(b) == _window_snapshot(a)


def test_a_sliding_window_model_decodes_in_fast_forward_windows():
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=64,
                          enable_prefix_caching=False, kv_groups=(0, 8))
    s = _build(cfg, [[1, 2, 3], [4, 5, 6, 7, 8]], [30, 30])
    assert decode_window(s, 100) == 29
    cached = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=64,
                             enable_prefix_caching=True, kv_groups=(0, 8))
    assert decode_window(_build(cached, [[1, 2, 3], [4, 5, 6, 7, 8]], [30, 30]), 100) == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4]), shared=st.booleans(), n=st.integers(1, 6),
       tier=st.sampled_from([0, 1, 3, 40]), algo=st.sampled_from(["xxhash", "builtin"]), data=st.data())
def test_fast_forward_with_eager_registration_matches_stepping(block_size, shared, n, tier, algo, data):
    # Eager registration (a weak hash turns lazy registration off): a window registers its blocks
    # after taking its new ones in one call, unless a key it registers is cached already (shared
    # prompts decode equal blocks): then it steps through. Either way the evictions (the host tier's
    # stores, in order) and the keys are stepping's. With xxhash and a tier, lazy registration: a
    # window's evictions register pending chains as they go, as stepping's do.
    prompts = [[3] * data.draw(st.integers(1, 20)) if shared and i % 2 else
               list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    # One-token requests finish in _build: their cached blocks wait in the free queue, to be evicted.
    prompts += [list(range(500 + 10 * i, 500 + 10 * i + data.draw(st.integers(1, 12)))) for i in range(2)]
    max_tokens += [1, 1]
    needs = [-(-(len(p) + m) // block_size) for p, m in zip(prompts, max_tokens)]
    num_blocks = data.draw(st.integers(max(max(needs), sum(needs) // 2), sum(needs) + 8))
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=True,
                          prefix_caching_hash_algo=algo if tier else "builtin", kv_offloading_blocks=tier)
    a, b = _build(cfg, prompts, max_tokens), _build(cfg, prompts, max_tokens)
    assert b.kv.lazy == (tier > 0 and algo == "xxhash")
    k = decode_window(b, 10_000)
    if k == 0:
        return
    assert list(a.kv.take_transfers()[0]) == list(b.kv.take_transfers()[0])
    stores_a, usage_a = [], []
    for i in range(k):
        so = a.schedule(1000.0 + i)
        stores_a += so.kv_stores  # the step's stores (schedule() takes them)
        sampled = {rid: [_token(a.requests[rid], a.requests[rid].num_tokens)] for rid in so.num_scheduled_tokens}
        a.update_from_output(so, ModelRunnerOutput(sampled), 1000.5 + i)
        usage_a.append(a.kv.usage)
    usage_b, _ = apply_decode_steps(
        b, [1000.5 + i for i in range(k)], lambda req, m: [_token(req, req.num_tokens + j) for j in range(m)])
    assert usage_b == usage_a
    assert list(b.kv.take_transfers()[0]) == stores_a  # the same stores, in order
    reqs_a = sorted(a.requests.values(), key=lambda r: r.request_id)
    reqs_b = sorted(b.requests.values(), key=lambda r: r.request_id)
    assert _snapshot(a, reqs_a) == _snapshot(b, reqs_b)
    if tier:
        ha, hb = a.kv.host, b.kv.host
        assert list(ha.entries.items()) == list(hb.entries.items()) and ha.stats == hb.stats


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4, 16]), n=st.integers(1, 6), times=st.booleans(), data=st.data())
def test_uncached_windows_then_steps_match_stepping_to_the_end(block_size, n, times, data):
    # Without a prefix cache a window takes its blocks in one pool call and leaves each request's
    # fast_decode_limit set: the steps after it (and later windows) must still be stepping's.
    # times=False leaves token_times alone and nothing else.
    prompts = [list(range(10 * i + 1, 10 * i + 1 + data.draw(st.integers(1, 20)))) for i in range(n)]
    max_tokens = [data.draw(st.integers(2, 40)) for _ in range(n)]
    needs = [-(-(len(p) + m) // block_size) for p, m in zip(prompts, max_tokens)]
    num_blocks = data.draw(st.integers(max(max(needs), sum(needs) // 2), sum(needs) + 8))
    cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=64,
                          block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=False)
    a, b = _build(cfg, prompts, max_tokens), _build(cfg, prompts, max_tokens)
    reqs_a = sorted(a.requests.values(), key=lambda r: r.request_id)
    reqs_b = sorted(b.requests.values(), key=lambda r: r.request_id)
    skipped = {r.request_id: 0 for r in reqs_b}  # window steps per request
    t = 1000.0
    for _ in bounded():
        if not a.requests:
            break
        k = decode_window(b, data.draw(st.integers(1, 12)))
        if k:  # a window on b, k steps on a
            for req in b.running:
                skipped[req.request_id] += k
            for i in range(k):
                _step(a, t + i)
            apply_decode_steps(b, [t + i + 0.5 for i in range(k)],
                               lambda req, m: [_token(req, req.num_tokens + j) for j in range(m)], times=times)
            t += k
        else:
            assert _step(a, t) == _step(b, t)
            t += 1.0
        assert [len(bl) for bl in a.kv.req_to_blocks.values()] == [len(bl) for bl in b.kv.req_to_blocks.values()]
    assert a.num_preemptions == b.num_preemptions
    if not times:
        for ra, rb in zip(reqs_a, reqs_b):  # only the stepped steps' times were appended
            assert len(rb.token_times) == len(ra.token_times) - skipped[rb.request_id]
            assert set(rb.token_times) <= set(ra.token_times)
        for r in reqs_a + reqs_b:
            r.token_times = []
    assert _snapshot(a, reqs_a) == _snapshot(b, reqs_b)


def test_an_uncached_window_hands_out_the_blocks_per_request_calls_would():
    # One pool call for the window, split in running order: each request gets exactly the ids that
    # allocate_slots(request, k) per request, in running order, would give it.
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=2, num_blocks=40,
                          enable_prefix_caching=False)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
    a, b = _build(cfg, prompts, [20] * 4), _build(cfg, prompts, [20] * 4)
    k = decode_window(b, 7)
    assert k == 7
    for req in a.running:  # the reference
        assert a.kv.allocate_slots(req, k) is not None
    apply_decode_steps(b, [float(i) for i in range(k)], repeat={}, default=5)
    ids = lambda s: {rid: [blk.block_id for blk in bl] for rid, bl in s.kv.req_to_blocks.items()}  # noqa: E731
    assert ids(b) == ids(a)
