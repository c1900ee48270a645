"""The roofline's price of sliding-window attention, against the window arithmetic done by hand:
a Gemma-3-shaped model (5 of every 6 layers slide over 1024 tokens) at 8k context, with and
without its window, and a prefill that crosses the window's edge."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.backends.sim import get_hardware, get_model
from twinserve.backends.sim.cost_model import Efficiency, RooflineCostModel, sliding_pairs, windowed_features

GEMMA = get_model("Gemma-3-27B")
W = GEMMA.sliding_window
SHARE = GEMMA.num_sliding_layers / GEMMA.num_layers


def _pair(floor: bool = False) -> tuple[RooflineCostModel, RooflineCostModel]:
    """(windowed, the same spec with the window removed) on one H200."""
    h = get_hardware("H200")
    # No per-layer floor: the attention part is then exactly what the features cost.
    eff = lambda: Efficiency.for_hardware(h) if floor else Efficiency.for_hardware(h, layer_floor_s=0.0)  # noqa: E731
    full = replace(GEMMA, sliding_window=0, num_sliding_layers=0)
    return RooflineCostModel(GEMMA, h, efficiency=eff()), RooflineCostModel(full, h, efficiency=eff())


def test_the_gemma_shape_slides_five_of_six_layers() -> None:
    assert (W, GEMMA.num_sliding_layers, GEMMA.num_layers) == (1024, 52, 62)


def test_decode_at_8k_reads_the_full_layers_whole_and_the_sliding_layers_a_window() -> None:
    win, full = _pair()
    n, ctx = 16, 8192
    # The context's K/V read: the step at 8k less the same batch at no context (the linear
    # layers, the overheads and each sequence's own token are the same in both).
    read = lambda m: m.step_time(0, 0, 0, 0.0, n, n * ctx) - m.step_time(0, 0, 0, 0.0, n, 0)  # noqa: E731
    # Full layers read all 8192 cached tokens; sliding ones the window less the new token.
    expected = (1 - SHARE) + SHARE * (W - 1) / ctx
    assert read(win) / read(full) == pytest.approx(expected, rel=1e-9)
    assert read(win) / read(full) < 0.3  # 10/62 + 52/62 * 1023/8192 = 0.266
    # Past the window the step grows only by the full layers' share per token.
    grow = lambda m: m.step_time(0, 0, 0, 0.0, n, n * 2 * ctx) - m.step_time(0, 0, 0, 0.0, n, n * ctx)  # noqa: E731
    assert grow(win) / grow(full) == pytest.approx(1 - SHARE, rel=1e-9)


def test_inside_the_window_the_window_changes_nothing() -> None:
    win, full = _pair(floor=True)
    for step in ((0, 0, 0, 0.0, 8, 8 * 500), (600, 1, 300, 600 * (300 + 300.0), 4, 4 * 200)):
        assert win.step_time(*step) == full.step_time(*step)


@pytest.mark.parametrize("q, c", [(2048, 0), (1024, 512), (512, 4096)])
def test_a_prefill_across_the_window_edge_computes_the_window_pairs(q: int, c: int) -> None:
    win, full = _pair()
    pa = q * (c + q / 2)
    # Attention pairs by hand (continuous, as prefill_attn counts): a query at position x sees
    # min(x, W) keys; the integral over the chunk [c, c + q].
    inside = max(0, min(c + q, W) - c)
    by_hand = (c + inside / 2) * inside + (q - inside) * W
    assert sliding_pairs(q, 1, c, pa, W) == pytest.approx(by_hand)
    # The roofline's attention FLOP time: linear in the pairs, so twice the cost of half of them.
    attn_full = 2 * (full.step_time(q, 1, c, pa, 0, 0) - full.step_time(q, 1, c, pa / 2, 0, 0))
    saved = full.step_time(q, 1, c, pa, 0, 0) - win.step_time(q, 1, c, pa, 0, 0)
    assert (attn_full - saved) / attn_full == pytest.approx(1 - SHARE + SHARE * by_hand / pa, rel=1e-9)
    if (q, c) == (2048, 0):  # a 2048-token prompt: sliding layers compute 3/4 of the causal pairs
        assert by_hand / pa == pytest.approx(0.75, rel=1e-3)


@given(q=st.integers(1, 5000), c=st.integers(0, 9000), w=st.integers(1, 4096))
def test_window_pairs_equal_a_sum_over_the_chunks_queries(q: int, c: int, w: int) -> None:
    # The discrete count: query i of the chunk (position c + i, 0-based) sees min(c + i + 1, w)
    # keys. The continuous count is within a half pair per query of it.
    discrete = sum(min(c + i + 1, w) for i in range(q))
    pa = q * (c + q / 2)
    got = sliding_pairs(q, 1, c, pa, w)
    assert abs(got - discrete) <= q / 2 + 1e-6
    assert got <= pa


def test_windowed_features_cap_only_the_attention_terms() -> None:
    f = (300, 2, 2000, 300 * (1000 + 75.0), 5, 5 * 3000)
    got = windowed_features(100, 1.0, *f)
    assert got[:2] == f[:2] and got[4] == f[4]
    assert got[2] == 2 * 100 and got[5] == 5 * 100
    assert got[3] == pytest.approx(300 * 100)  # each chunk starts past the window: q·W pairs
    assert windowed_features(0, 0.0, *f) == f and windowed_features(100, 0.0, *f) == f


def test_counted_kv_bytes_are_the_bytes_step_time_priced() -> None:
    """Issue 53 item 17: a decode step at 8k counts the sliding layers' window, not the full context."""
    from twinserve.backends.sim.cost_model import WorkTotals
    from twinserve.backends.sim.executor import SimExecutor

    h = get_hardware("H200")
    win = RooflineCostModel(GEMMA, h, efficiency=Efficiency.for_hardware(h, layer_floor_s=0.0))
    ex = SimExecutor(win)
    n, ctx = 16, 8192
    ex._finish({}, 0, 0, 0, 0.0, n, n * ctx)
    tot = ex.totals
    assert tot.window == W and tot.window_read == n * W  # min(n * ctx + n, n * W)
    # By hand: 10 full layers read every cached token and the new one; 52 sliding layers a window each.
    per_layer = GEMMA.kv_bytes_per_token / GEMMA.num_layers
    kv = per_layer * (10 * (n * ctx + n) + 52 * n * W)
    bare = WorkTotals(num_steps=1)  # the same step's weights, no K/V read
    assert tot.bytes_moved(GEMMA) - bare.bytes_moved(GEMMA) == pytest.approx(kv, rel=1e-12)


@given(context=st.integers(0, 40000), n=st.integers(1, 64), k=st.integers(0, 300), w=st.integers(1, 4096))
def test_fast_forward_counts_the_window_read_of_each_step(context: int, n: int, k: int, w: int) -> None:
    from twinserve.backends.sim.cost_model import WorkTotals

    ff, stepped = WorkTotals(window=w), WorkTotals(window=w)
    ff.count_window_decode(context, n, k)
    for j in range(k):
        stepped.count_window_read(0, 0, 0, context + j * n, n)
    assert ff.window_read == stepped.window_read


def test_mbu_of_the_gemma_3_study_shape_is_at_most_one() -> None:
    """The KV-groups study (Gemma 3 at 8k, 24 of its 200 requests): MBU was 1.01 here, 1.15 on the study."""
    from pathlib import Path

    from twinserve.sim.build import simulate
    from twinserve.sim.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "experiments" / "kv_groups_study.toml")
    cfg.workload.num_requests = 24
    built, _ = simulate(cfg)
    mbu = built.simulation.executor.totals.mbu(built.model, built.hardware, 1)
    assert 0.3 < mbu <= 1.0


def _window_tokens(w: int, pt: float, ps: float, pc: float, ds: float, dc: float) -> float:
    """K/V tokens one sliding layer reads in a step, by the roofline's caps (step_time)."""
    return min(pc, ps * w) + pt + min(dc + ds, ds * w)


def test_a_decode_replica_counts_the_sliding_kv_its_discounted_steps_priced() -> None:
    """Disaggregated decode replicas of a sliding model: the K/V tokens counted for MBU are the ones its
    steps priced (the transferred prefill left out). They counted full context: no window at all."""
    from twinserve.sim.cluster_study import simulate_cluster
    from twinserve.sim.disagg import DecodeExecutor, _Discounted

    from .helpers import small_config

    cfg = small_config(model="Gemma-3-27B", hardware="H200", num_requests=8, rate=40.0, num_replicas=2,
                       num_prefill_replicas=1, max_model_len=4096, max_num_batched_tokens=1024,
                       prompt_dist="uniform", prompt_min=1100, prompt_max=3000, output_dist="uniform",
                       output_min=2, output_max=40, fast_forward=False)
    priced: dict[int, float] = {}
    step_time = _Discounted.step_time

    def record(self, pt, ps, pc, pa, ds, dc):
        a, b, c, _ = self.minus
        priced[id(self)] = priced.get(id(self), 0.0) + _window_tokens(W, pt - a, ps - b, pc - c, ds, dc)
        return step_time(self, pt, ps, pc, pa, ds, dc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Discounted, "step_time", record)
        built, _ = simulate_cluster(cfg)
    decode = [r.executor for r in built.simulation.replicas if isinstance(r.executor, DecodeExecutor)]
    assert decode and all(ex.totals.window == W for ex in decode)
    for ex in decode:
        assert ex.totals.num_prefill_tokens > 0  # some chunks ran past their transferred tokens, or joined
        assert ex.totals.window_read == pytest.approx(priced[id(ex.cost_model)], rel=1e-12)


def test_a_fitted_cost_model_counts_a_sliding_model_s_window() -> None:
    """A profile (not a roofline) prices the steps: MBU still counts what a sliding layer reads."""
    from twinserve.sim.build import build_engine

    from .helpers import small_config

    cfg = small_config(model="Gemma-3-27B", hardware="H200", cost_model="fitted",
                       profile="builtin:smollm2-135m-h200-bf16", allow_profile_mismatch=True)
    ex = build_engine(cfg).executor
    assert ex.totals.window == W
    ex._finish({}, 0, 0, 0, 0.0, 16, 16 * 8192)
    assert ex.totals.window_read == 16 * W
