"""The machine's speed sampled through a run, and a simulator that runs at that speed.

The "real" runs here are simulations whose machine speed is known at every instant (an
executor written here, apart from TracedExecutor), so the traced prediction can be held to
it, and a prediction at the run's mean speed shown to miss what the trace sees.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim.executor import SimExecutor
from twinserve.twin.compare import compare
from twinserve.twin.fidelity import simulate
from twinserve.twin.speedtrace import SampleClock, SpeedTrace, run_simulation
from twinserve.core.engine_core import EngineCore
from twinserve.sim.world import Simulation
from twinserve.sim.workload import Workload, WorkloadConfig

from .test_band import _make, _profile, _sched
from ..limits import bounded


def test_trace_smooths_over_its_window_and_holds_at_the_ends() -> None:
    # Samples of 2, 6 (ms) close together, then 3 and 3 far apart, against a 2 ms reference.
    tr = SpeedTrace.from_samples([(0.0, 0.002), (1.0, 0.006), (10.0, 0.003), (30.0, 0.003)], 0.002,
                                 window_s=4.0)
    assert tr.raw == pytest.approx([1.0, 3.0, 1.5, 1.5])
    # Each point is the median of the samples within 2 s of it (of two, their mean).
    assert tr.factors == pytest.approx([2.0, 2.0, 1.5, 1.5])
    assert tr.factor(0.5) == pytest.approx(2.0)
    assert tr.factor(5.5) == pytest.approx(1.75)  # halfway between 1.0 (2.0) and 10.0 (1.5)
    assert tr.factor(-3.0) == pytest.approx(2.0) and tr.factor(99.0) == pytest.approx(1.5)
    assert tr.pause_s == pytest.approx(0.003) and tr.num_samples == 4
    # Out of order samples are the same trace.
    same = SpeedTrace.from_samples([(30.0, 0.003), (1.0, 0.006), (10.0, 0.003), (0.0, 0.002)], 0.002,
                                   window_s=4.0)
    assert same.factors == tr.factors
    with pytest.raises(ValueError, match="at least one sample"):
        SpeedTrace.from_samples([], 0.002)
    with pytest.raises(ValueError, match="one of median, mean"):
        SpeedTrace.from_samples([(0.0, 0.002)], 0.002, smoothing="min")


def test_one_stalled_sample_does_not_move_the_median_trace() -> None:
    # Five samples 2 s apart at the reference speed, the middle one stalled to 4x (a 100 ms
    # pause in a 33 ms sample): by the median every point of a 20 s window stays at 1.0; by the
    # mean (how profiles made before the median smoothed) every point moves to 1.6.
    samples = [(2.0 * i, 0.033 * (4.0 if i == 2 else 1.0)) for i in range(5)]
    med = SpeedTrace.from_samples(samples, 0.033, window_s=20.0)
    assert med.smoothing == "median" and med.factors == pytest.approx([1.0] * 5)
    assert med.summary()["smoothing"] == "median" and med.raw[2] == pytest.approx(4.0)
    mean = SpeedTrace.from_samples(samples, 0.033, window_s=20.0, smoothing="mean")
    assert mean.factors == pytest.approx([1.6] * 5)
    # A slowdown that lasts (most of a window's samples) moves the median as it moves the mean.
    slow = [(2.0 * i, 0.033 * (1.5 if i >= 2 else 1.0)) for i in range(5)]
    assert SpeedTrace.from_samples(slow, 0.033, window_s=20.0).factors == pytest.approx([1.5] * 5)
    with pytest.raises(ValueError, match="positive seconds"):
        SpeedTrace.from_samples([(0.0, 0.002)], 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 600), st.floats(1e-4, 1e-2)), min_size=1, max_size=60),
       st.floats(0.5, 60), st.floats(-100, 700))
def test_trace_stays_within_its_samples(samples, window, t) -> None:
    tr = SpeedTrace.from_samples(samples, 0.003, window_s=window)
    lo, hi = min(s for _, s in samples) / 0.003, max(s for _, s in samples) / 0.003
    assert all(lo * (1 - 1e-9) <= f <= hi * (1 + 1e-9) for f in tr.factors)
    assert lo * (1 - 1e-9) <= tr.factor(t) <= hi * (1 + 1e-9)


def test_sample_clock_fires_after_every_gap_of_its_period() -> None:
    c = SampleClock(2.0)
    fired = [t for t in (0.0, 0.5, 1.9, 2.0, 3.0, 4.1, 9.0) if c.due(t)]
    assert fired == [0.0, 2.0, 4.1, 9.0]


def test_at_a_constant_speed_the_trace_is_the_scaled_simulation() -> None:
    # No pauses (a sample costs nothing here): pricing every step at x 1.3 through the trace is
    # the profile at time_scale 1.3, token for token (the traced run does not fast-forward).
    prof, make, sched = _profile(None), _make(n=120), _sched()
    flat = SpeedTrace.from_samples([(0.0, 0.0013), (50.0, 0.0013)], 0.001)
    flat.pause_s = 0.0
    traced = simulate(prof, make, sched, flat)
    scaled = simulate(dataclasses.replace(prof, time_scale=1.3), make, sched)
    got = {r.request_id: r.token_times for r in traced.records}
    want = {r.request_id: r.token_times for r in scaled.records}
    assert got.keys() == want.keys()
    for rid in want:
        assert got[rid] == pytest.approx(want[rid], rel=1e-9, abs=1e-12), rid


class _SlowingExecutor(SimExecutor):
    """The truth: a machine that runs at the profile's speed until `at`, then `slow` times slower."""

    def __init__(self, model, at: float, slow: float) -> None:
        super().__init__(model)
        self.at, self.slow, self.clock = at, slow, lambda: 0.0

    @property
    def waking(self) -> bool:
        return True

    def execute(self, so):
        out = super().execute(so)
        if self.clock() >= self.at:
            out.step_time *= self.slow
        return out


def test_a_machine_that_slows_mid_run_is_followed_by_the_trace_not_by_its_mean() -> None:
    prof, sched = _profile(None), _sched()
    make = _make(rate=55.0, n=300)
    ex = _SlowingExecutor(prof, at=2.0, slow=1.5)
    truth_sim = Simulation(EngineCore(dataclasses.replace(sched), ex), ex, make(), fast_forward=False)
    ex.clock = lambda: truth_sim.env.now
    truth = truth_sim.run()
    end = max(r.finish_time for r in truth.records)
    assert end > 3.0  # the run lasts well past the slowdown
    # Samples every 0.05 s of a 1 ms product on that machine, smoothed over 0.1 s.
    samples = [(0.05 * i, 0.001 * (1.5 if 0.05 * i >= 2.0 else 1.0)) for i in range(int(end / 0.05) + 1)]
    trace = SpeedTrace.from_samples(samples, 0.001, every_s=1e9, window_s=0.1)
    trace.pause_s = 0.0
    traced = compare(truth.records, simulate(prof, make, sched, trace).records)["metrics"]
    # The best single speed: the truth's busy-weighted mean.
    starts, durs = truth.steps.start, truth.steps.duration
    mean = sum(d for d in durs) / sum(d / (1.5 if s >= 2.0 else 1.0) for s, d in zip(starts, durs))
    flat = compare(truth.records, simulate(dataclasses.replace(prof, time_scale=mean), make, sched).records)["metrics"]
    for m in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p99"):
            assert abs(traced[m][q]["err"]) < 0.03, (m, q, traced[m][q])
    # At one mean speed the queue that builds after the slowdown is missed.
    worst_flat = max(abs(flat[m][q]["err"]) for m in ("ttft", "e2e") for q in ("p50", "p99"))
    worst_traced = max(abs(traced[m][q]["err"]) for m in ("ttft", "e2e") for q in ("p50", "p99"))
    assert worst_flat > 0.10 and worst_flat > 4 * worst_traced


def test_the_samples_pause_the_simulated_engine_as_they_pause_the_real_one() -> None:
    # A closed batch keeps the engine busy from 0 to the end: after the first step and then
    # after each step ending 0.05 s or more after the last sample, the next step waits 4 ms.
    prof, sched = _profile(None), _sched()
    cfg = WorkloadConfig(num_requests=40, arrival="all_at_once", rate=1.0, prompt_dist="uniform", prompt_min=8,
                         prompt_max=64, output_dist="uniform", output_min=4, output_max=24, vocab_size=1000)
    make = lambda: Workload(cfg, 5, 512)  # noqa: E731
    trace = SpeedTrace.from_samples([(0.0, 0.002)], 0.002, every_s=0.05)
    trace.pause_s = 0.004
    res = run_simulation(prof, sched, make(), trace)
    base = simulate(prof, make, sched)
    ends = [s + d for s, d in zip(res.steps.start, res.steps.duration)]
    clock = SampleClock(0.05)
    pauses = sum(clock.due(e) for e in ends[:-1])  # the last step's sample delays nothing
    assert pauses >= 5
    assert len(ends) == base.num_steps
    assert ends[-1] == pytest.approx(sum(base.steps.duration) + 0.004 * pauses, rel=1e-9)


def test_the_real_loop_samples_by_the_simulators_rule(make_engine) -> None:
    from twinserve.twin.realrun import run_real

    class Fake:
        calls = 0

        def sample(self) -> float:
            Fake.calls += 1
            return 0.001

    engine = make_engine()
    cfg = WorkloadConfig(num_requests=12, arrival="poisson", rate=200.0, prompt_dist="uniform",
                         prompt_min=8, prompt_max=40, output_dist="uniform", output_min=4, output_max=12,
                         vocab_size=200)
    run = run_real(engine, Workload(cfg, 3, 256), sampler=Fake(), sample_every_s=0.01)
    engine.shutdown()
    clock = SampleClock(0.01)
    due = [e for e in run.step_ends if clock.due(e)]
    assert len(run.speed_samples) == Fake.calls == len(due) >= 2
    # Each sample was taken after the step whose end made it due, and before the next began.
    for (t, sec), e in zip(run.speed_samples, due):
        assert sec == 0.001 and t >= e
        later = [s for s in run.step_starts if s > e]
        assert not later or t <= later[0]
    assert all(math.isfinite(t) for t, _ in run.speed_samples) and run.t0 > 0


def _greedy(engine, sampler=None) -> dict[str, list[int]]:
    """Greedy tokens of three prompts, with a sample after every engine step when given one."""
    from twinserve.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, prompt in enumerate(([5, 9, 31, 7], list(range(40, 70)), [3] * 9)):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    done: dict[str, list[int]] = {}
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        if sampler is not None:
            sampler.sample()
    return done


def test_the_weights_sampler_passes_a_row_through_every_projection_and_changes_no_token(make_engine) -> None:
    import torch

    from twinserve.twin.speedtrace import SpeedSampler, WeightsSampler, sampler_for

    engine = make_engine()
    sampler = sampler_for(engine)
    assert isinstance(sampler, WeightsSampler) and sampler.model is engine.worker.model
    model = engine.worker.model
    seen: list[tuple[int, tuple[int, ...]]] = []
    real_linear = sampler._linear

    def counting(x, layer):
        seen.append((id(layer), tuple(x.shape)))
        return real_linear(x, layer)

    sampler._linear = counting
    heads: list[int] = []
    real_head = model.compute_logits
    model.compute_logits = lambda h: heads.append(h.shape[0]) or real_head(h)
    try:
        assert sampler.sample() > 0
    finally:
        del model.compute_logits
        sampler._linear = real_linear
    # One row through every projection of every layer, once, in the model's dtype, and one
    # row through the LM head: a decode step's weight traffic.
    linears = [m for layer in model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(i for i, _ in seen) == sorted(id(m) for m in linears)
    assert all(shape[0] == 1 for _, shape in seen) and heads == [1]
    assert all(x.dtype == model.embed_tokens.weight.dtype for _, x in sampler._calls)
    # Sampling between steps leaves what the engine generates as it was.
    plain = _greedy(engine)
    assert _greedy(engine, sampler) == plain and len(plain) == 3
    assert isinstance(sampler_for(engine, "matvec"), SpeedSampler)
    with pytest.raises(ValueError, match="speed sampler 'gpu': one of weights, matvec"):
        sampler_for(engine, "gpu")
    engine.shutdown()


def test_the_prefill_sampler_passes_a_block_of_rows_through_the_first_layers_and_changes_no_token(
        make_engine) -> None:
    from twinserve.twin.speedtrace import PREFILL_LAYERS, PREFILL_ROWS, PrefillSampler, prefill_sampler_for

    engine = make_engine()
    sampler = prefill_sampler_for(engine)
    assert isinstance(sampler, PrefillSampler) and sampler.kind == "gemm"
    model = engine.worker.model
    seen: list[tuple[int, tuple[int, ...]]] = []
    real_linear = sampler._linear
    sampler._linear = lambda x, layer: seen.append((id(layer), tuple(x.shape))) or real_linear(x, layer)
    try:
        assert sampler.sample() > 0
    finally:
        sampler._linear = real_linear
    # PREFILL_ROWS rows through the four projections of each of the first PREFILL_LAYERS layers:
    # a slice of a prefill chunk's matrix products, in the model's dtype.
    first = model.layers[:PREFILL_LAYERS]
    want = [id(m) for layer in first for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                 layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    assert [i for i, _ in seen] == want and all(shape[0] == PREFILL_ROWS for _, shape in seen)
    assert all(x.dtype == model.embed_tokens.weight.dtype for _, x in sampler._calls)
    plain = _greedy(engine)
    assert _greedy(engine, sampler) == plain and len(plain) == 3
    engine.shutdown()


def test_a_steps_prefill_share_is_priced_at_the_prefill_samplers_speed() -> None:
    # The truth: a machine whose memory is contended after 1 s, so a step's decode share runs
    # 1.6x slower and its prefill share (prefill tokens over its tokens) 1.1x. The weights
    # sampler sees the 1.6, the prefill sampler the 1.1.
    prof, sched = _profile(None), _sched()
    make = _make(rate=55.0, n=300)

    class Contended(SimExecutor):
        def __init__(self, model) -> None:
            super().__init__(model)
            self.clock = lambda: 0.0

        @property
        def waking(self) -> bool:
            return True

        def execute(self, so):
            out = super().execute(so)
            if self.clock() >= 1.0:
                pt, ds = self.last_features[0], self.last_features[4]
                out.step_time *= 1.6 + (1.1 - 1.6) * pt / (pt + ds)
            return out

    ex = Contended(prof)
    truth_sim = Simulation(EngineCore(dataclasses.replace(sched), ex), ex, make(), fast_forward=False)
    ex.clock = lambda: truth_sim.env.now
    truth = truth_sim.run()
    end = max(r.finish_time for r in truth.records)
    assert end > 2.0
    # Samples every 0.05 s and one just before the switch, each its own window.
    times = [0.05 * i for i in range(int(end / 0.05) + 1)] + [1.0 - 1e-9]
    weights = SpeedTrace.from_samples([(t, 0.03 * (1.6 if t >= 1.0 else 1.0)) for t in times], 0.03,
                                      every_s=1e9, window_s=1e-12)
    prefill = SpeedTrace.from_samples([(t, 0.014 * (1.1 if t >= 1.0 else 1.0)) for t in times], 0.014,
                                      every_s=1e9, window_s=1e-12)
    weights.pause_s = prefill.pause_s = 0.0
    both = weights.with_prefill(prefill)
    assert both.at(2.0, 30, 30) == pytest.approx(1.1) and both.at(2.0, 0, 8) == pytest.approx(1.6)
    assert both.at(2.0, 24, 32) == pytest.approx(1.6 + (1.1 - 1.6) * 0.75) and both.at(0.5, 24, 32) == 1.0
    assert weights.at(2.0, 24, 32) == pytest.approx(1.6)  # no prefill trace: the whole step at its speed
    split = compare(truth.records, simulate(prof, make, sched, both).records)["metrics"]
    alone = compare(truth.records, simulate(prof, make, sched, weights).records)["metrics"]
    # Split by share, each token lands when the truth's does (up to the nanosecond the traces
    # take to switch); by the weights sampler alone every prefill after 1 s is priced 1.6/1.1
    # too slow, and the first tokens come late.
    for m in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p99"):
            assert split[m][q]["err"] == pytest.approx(0.0, abs=1e-6), (m, q)
    assert alone["ttft"]["p50"]["err"] > 0.10
    # The samples of both kinds pause the engine, one after the other.
    weights.pause_s, prefill.pause_s = 0.004, 0.002
    from twinserve.twin.speedtrace import TracedExecutor

    assert TracedExecutor(prof, weights.with_prefill(prefill)).pause_s == pytest.approx(0.006)
    assert TracedExecutor(prof, weights).pause_s == pytest.approx(0.004)


def test_a_calibration_design_refuses_an_unknown_sampler() -> None:
    from twinserve.twin.calibrate import CalibrationDesign
    from twinserve.core.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="sampler"):
        CalibrationDesign(sampler="gpu")
    assert CalibrationDesign.quick().for_limits(8, 64, 256).sampler == "weights"
    # A full-budget chunk is measured too (every long prompt is cut into them), once.
    assert CalibrationDesign().for_limits(32, 512, 8192).prefill_sizes == [8, 32, 96, 192, 384, 512]
    assert CalibrationDesign().for_limits(32, 256, 8192).prefill_sizes == [8, 32, 96, 192, 256]
    assert CalibrationDesign().for_limits(32, 384, 8192).prefill_sizes == [8, 32, 96, 192, 384]
    assert CalibrationDesign().for_limits(32, 2048, 1024).prefill_sizes == [8, 32, 96, 192, 384]
    # The prefill sampler only when asked for, and kept through for_limits.
    assert not CalibrationDesign().prefill_samples
    assert CalibrationDesign(prefill_samples=True).for_limits(8, 64, 256).prefill_samples


def test_fidelity_options_refuse_an_unknown_speed_source_or_sampling_period() -> None:
    from twinserve.twin.fidelity import FidelityError, FidelityOptions

    with pytest.raises(FidelityError, match="--speed-from 'probe': give one of auto, samples, probes"):
        FidelityOptions("p.json", speed_from="probe")
    with pytest.raises(FidelityError, match="--sample-every 0: give seconds > 0"):
        FidelityOptions("p.json", sample_every_s=0)
    assert not FidelityOptions("p.json").prefill_samples  # the prefill sampler only when asked for


def test_without_noise_the_traced_band_is_the_traced_prediction() -> None:
    from twinserve.twin.band import StepNoise, prediction_band

    prof, make, sched = _profile(None), _make(), _sched()
    # The machine halves its speed over the run, and the samples pause it every 50 ms.
    trace = SpeedTrace.from_samples([(0.0, 0.001), (0.4, 0.002)], 0.001, every_s=0.05, window_s=0.01)
    trace.pause_s = 0.002
    point = simulate(prof, make, sched, trace)
    assert point.records != simulate(prof, make, sched).records
    band = prediction_band(prof, make, sched, point.records, StepNoise.for_run(prof, None), samples=3,
                           trace=trace)
    for m, cells in band["cells"].items():
        for p, c in cells.items():
            assert c["lo"] == pytest.approx(c["hi"]) == pytest.approx(c["real"]), (m, p)


def _row(start: float, step: float, gap: float, decodes: int = 4) -> dict:
    return {"start_s": start, "step_time_s": step, "gap_s": gap, "execute_s": step, "num_prefill_tokens": 0.0,
            "num_prefill_seqs": 0.0, "prefill_context": 0.0, "prefill_attn": 0.0,
            "num_decode_seqs": float(decodes), "decode_context": 100.0 * decodes}


def test_a_samples_time_leaves_the_gap_of_the_step_after_it_and_only_once() -> None:
    from twinserve.twin.speedtrace import without_sample_pauses

    # Steps of 0.1 s; a 0.03 s sample after the first (requests waiting: the second step's
    # gap holds it and 1 ms of the loop), and one after the third while the engine was idle
    # (the fourth step's gap is 0: nothing waited), and one before the log began.
    rows = [_row(10.0, 0.1, 0.0), _row(10.131, 0.1, 0.031), _row(10.231, 0.1, 0.0), _row(12.0, 0.1, 0.0)]
    samples = [(9.0, 0.05), (10.1, 0.03), (10.4, 0.03)]
    out = without_sample_pauses(rows, samples)
    assert [r["gap_s"] for r in out] == pytest.approx([0.0, 0.001, 0.0, 0.0])
    assert [r.get("sampler_pause_s") for r in out] == pytest.approx([None, 0.03, 0.0, 0.0], abs=1e-12)
    assert rows[1]["gap_s"] == 0.031  # copies: the log itself is untouched
    assert without_sample_pauses(out, samples) == out
    assert without_sample_pauses(rows, []) == rows
    # Sample times after their own origin, as profiles and runs record them.
    assert without_sample_pauses(rows, [(t - 9.0, sec) for t, sec in samples], t0=9.0) == out


def test_a_fit_without_the_samples_pauses_prices_the_engines_steps_and_with_them_does_not() -> None:
    """Prefill and decode steps priced by a known profile with 8% noise, every fourth after a
    40 ms sample (as calibrate and fidelity log them): fitted on the engine's own time the
    profile prices that time; with the samples left in the gaps it prices it dearer and
    calls the pauses the engine's CPU overhead."""
    import random

    from twinserve.backends.sim.fit import fit_step_profile
    from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel
    from twinserve.twin.band import step_residuals
    from twinserve.twin.speedtrace import without_sample_pauses

    truth = FittedCostModel(intercept_s=0.02, per_token_s=2e-3, per_prefill_seq_s=1e-3,
                            per_decode_context_token_s=2e-6)
    rng = random.Random(0)
    rows, samples, t = [], [], 100.0
    for i in range(240):
        pt, ds = (0, 1 + i % 16) if i % 3 else (64 * (1 + i % 5), 0)
        feats = (pt, 1 if pt else 0, 0, pt * pt / 2, ds, ds * (50 + 37 * (i % 11)))
        step = truth.step_time(*feats) * rng.lognormvariate(0.0, 0.08)
        gap = 0.0
        if i and i % 4 == 0:
            samples.append((t, 0.04))
            gap = 0.0405
        t += gap
        rows.append({**_row(t, step, gap), **dict(zip(FEATURE_COLUMNS, map(float, feats)))})
        t += step
    clean = without_sample_pauses(rows, samples)
    engine_time = sum(r["step_time_s"] + r["gap_s"] for r in clean)

    def priced(m: FittedCostModel) -> float:
        return sum(m.step_time(*(r[c] for c in FEATURE_COLUMNS)) for r in clean) / engine_time

    fitted, raw = fit_step_profile(clean), fit_step_profile(rows)
    assert priced(fitted) == pytest.approx(1.0, abs=0.01)
    assert priced(raw) > 1.04
    assert fitted.overhead[0] < 0.001 < 0.01 < raw.overhead[0]
    # Judged on the engine's own time, the fit's busy time is its time; a sample is no idle gap
    # (the wake after one would be priced on the next step).
    woken = dataclasses.replace(fitted, wake_idle_s=(0.01,), wake_extra_s=((0.5,),))
    res = step_residuals(woken, clean)
    assert sum(p for _, _, p, _ in res) == pytest.approx(sum(m for _, m, _, _ in res), rel=0.01)


def test_the_real_loops_samples_leave_its_step_log_by_their_own_clock(make_engine) -> None:
    import time

    from twinserve.backends.real.step_log import StepLog
    from twinserve.twin.realrun import run_real
    from twinserve.twin.speedtrace import without_sample_pauses

    class Slow:
        def sample(self) -> float:
            time.sleep(0.03)
            return 0.03

    engine = make_engine()
    engine.set_step_log(StepLog(keep=True))
    cfg = WorkloadConfig(num_requests=6, arrival="all_at_once", rate=1.0, prompt_dist="uniform",
                         prompt_min=8, prompt_max=24, output_dist="uniform", output_min=12, output_max=16,
                         vocab_size=200)
    run = run_real(engine, Workload(cfg, 3, 256), sampler=Slow(), sample_every_s=0.01)
    rows = engine.step_log.rows()
    engine.shutdown()
    out = without_sample_pauses(rows, run.speed_samples, t0=run.t0)
    paused = [r for r in out if r.get("sampler_pause_s")]
    # Every sample but one after the last step paused a step of the closed batch.
    assert len(paused) >= len(run.speed_samples) - 1 >= 2
    for r in paused:
        assert r["sampler_pause_s"] == pytest.approx(0.03)
        assert 0.0 <= r["gap_s"] < 0.02  # what is left: the loop's own time between two steps
    assert sum(r["gap_s"] for r in out) < sum(r["gap_s"] for r in rows) - 0.03 * len(paused) + 1e-9
