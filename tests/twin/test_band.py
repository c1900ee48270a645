"""The prediction band: noise drawn as the calibration measured it, and a judgement that can fail.

No engine: the "real" runs here are simulations whose truth is known (the same profile with
other noise draws, or a slower machine), so the band must hold the first and reject the second.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel
from twinserve.twin.band import NoisyCostModel, StepNoise, prediction_band
from twinserve.twin.steps import step_errors
from twinserve.backends.sim.executor import SimExecutor
from twinserve.core.engine_core import EngineCore
from twinserve.core.sched.config import SchedulerConfig
from twinserve.sim.world import Simulation
from twinserve.sim.workload import Workload, WorkloadConfig

FIT = {"mape": 0.08, "by_kind": {"prefill": {"mape": 0.05}, "decode": {"mape": 0.10},
                                 "mixed": {"mape": 0.04}}}


def _profile(fit=FIT) -> FittedCostModel:
    return FittedCostModel(intercept_s=0.004, per_token_s=2e-4, per_decode_seq_s=1e-4,
                           per_decode_context_token_s=1e-6, meta={"fit": fit} if fit else {})


def _make(rate: float = 60.0, n: int = 30):
    cfg = WorkloadConfig(num_requests=n, arrival="poisson", rate=rate, prompt_dist="uniform",
                         prompt_min=8, prompt_max=64, output_dist="uniform", output_min=4,
                         output_max=24, vocab_size=1000)
    return lambda: Workload(cfg, 5, 512)


def _sched() -> SchedulerConfig:
    return SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=8, num_blocks=400,
                           max_model_len=512)


def simulate(model, make, sched):
    ex = SimExecutor(model)
    return Simulation(EngineCore(dataclasses.replace(sched), ex), ex, make(), fast_forward=False).run()


def test_noise_comes_from_the_calibration_residuals_and_the_run_probes() -> None:
    n = StepNoise.for_run(_profile(), {"probe_before_s": 1.1, "probe_after_s": 1.0})
    k = math.sqrt(math.pi / 2)
    assert n.step_sigma == pytest.approx({"prefill": 0.05 * k, "decode": 0.10 * k, "mixed": 0.04 * k})
    assert n.speed_sigma == pytest.approx(math.log(1.1) / 2)
    # A kind the fit did not report falls back to the overall MAPE; no probes, no speed noise.
    n = StepNoise.for_run(_profile({"mape": 0.08, "by_kind": {"decode": {"mape": 0.1}}}), None)
    assert n.step_sigma["prefill"] == pytest.approx(0.08 * k) and n.speed_sigma == 0.0
    # A hand-made profile (no fit diagnostics) has no step noise.
    assert StepNoise.for_run(_profile(None), None).step_sigma == {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}


def _rows(profile, n, bias, sigma, phi, seed=0):
    # A step log whose times are the profile's times times exp(bias of the kind + AR(1) noise).
    import random

    rng = random.Random(seed)
    z, rows = rng.gauss(0, 1), []
    for i in range(n):
        feats = (48, 1, 0, 48 * 24.0, 0, 0) if i % 4 == 0 else (0, 0, 0, 0.0, 3, 300 + i)
        kind = "prefill" if i % 4 == 0 else "decode"
        t = profile.step_time(*feats) * math.exp(bias[kind] + sigma * z)
        z = phi * z + math.sqrt(1 - phi * phi) * rng.gauss(0, 1)
        rows.append({"num_prefill_tokens": feats[0], "num_prefill_seqs": feats[1],
                     "prefill_context": feats[2], "prefill_attn": feats[3], "num_decode_seqs": feats[4],
                     "decode_context": feats[5], "step_time_s": t, "gap_s": 0.0})
    return rows


def test_a_run_with_a_step_log_measures_its_own_noise_without_its_bias() -> None:
    prof = _profile()
    rows = _rows(prof, 4000, {"prefill": 0.3, "decode": -0.1}, sigma=0.1, phi=0.6)
    n = StepNoise.for_run(prof, None, rows)
    assert n.source == "run"
    # The kinds' biases (+0.3, -0.1 in log) are the profile's error, not noise: the spread is
    # the series' own 0.1 for both kinds (the AR(1) series is shared), and its correlation.
    assert n.step_sigma["prefill"] == pytest.approx(0.1, rel=0.15)
    assert n.step_sigma["decode"] == pytest.approx(0.1, rel=0.15)
    assert n.correlation == pytest.approx(0.6, abs=0.15)
    # The busy-time error weighs steps by their length and sees the biases per kind.
    st = step_errors(prof, rows)
    assert st["busy_err_by_kind"]["prefill"] == pytest.approx(math.exp(-0.3 - 0.005) - 1, abs=0.03)
    assert st["busy_err_by_kind"]["decode"] == pytest.approx(math.exp(0.1 - 0.005) - 1, abs=0.03)
    # Too few steps: the calibration's residuals, uncorrelated.
    few = StepNoise.for_run(prof, None, rows[:10])
    assert few.source == "calibration" and few.correlation == 0.0


def test_noisy_steps_keep_the_mean_and_the_spread_of_their_kind() -> None:
    base = _profile()
    noisy = NoisyCostModel(base, StepNoise({"prefill": 0.0, "decode": 0.2, "mixed": 0.0}), seed=1)
    decode = (0, 0, 0, 0.0, 4, 400)
    ratios = [noisy.step_time(*decode) / base.step_time(*decode) for _ in range(20_000)]
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(math.log(r) for r in ratios) == pytest.approx(0.2, rel=0.05)
    # A kind with no noise is priced exactly as the profile prices it.
    prefill = (32, 1, 0, 512.0, 0, 0)
    assert {noisy.step_time(*prefill) for _ in range(50)} == {base.step_time(*prefill)}
    # Correlated noise: the log factors follow an AR(1) series with the asked-for correlation,
    # each still mean-one.
    corr = NoisyCostModel(base, StepNoise({"prefill": 0.0, "decode": 0.2, "mixed": 0.0}, 0.0, 0.7), seed=3)
    logs = [math.log(corr.step_time(*decode) / base.step_time(*decode)) for _ in range(20_000)]
    assert statistics.correlation(logs[:-1], logs[1:]) == pytest.approx(0.7, abs=0.03)
    assert statistics.fmean(math.exp(x) for x in logs) == pytest.approx(1.0, abs=0.02)
    # The run's speed factor multiplies every step alike, and is drawn once per run.
    slow = NoisyCostModel(base, StepNoise({"prefill": 0.0, "decode": 0.0, "mixed": 0.0}, 0.3), seed=2)
    assert slow.speed != 1.0
    assert slow.step_time(*prefill) == pytest.approx(base.step_time(*prefill) * slow.speed)
    assert slow.step_time(*decode) == pytest.approx(base.step_time(*decode) * slow.speed)


def test_without_noise_the_band_is_the_prediction_itself() -> None:
    prof, make, sched = _profile(None), _make(), _sched()
    point = simulate(prof, make, sched)
    band = prediction_band(prof, make, sched, point.records, StepNoise.for_run(prof, None), samples=3)
    for m, cells in band["cells"].items():
        for p, c in cells.items():
            assert c["lo"] == pytest.approx(c["hi"]) == pytest.approx(c["real"]), (m, p)
            assert c["inside"] is True


def test_the_band_holds_a_run_from_the_same_noise_and_rejects_a_slower_machine() -> None:
    prof, make, sched = _profile(), _make(), _sched()
    noise = StepNoise.for_run(prof, None)
    # "Real" runs whose truth is known: the profile with other noise draws...
    same = simulate(NoisyCostModel(prof, noise, seed=987), make, sched)
    band = prediction_band(prof, make, sched, same.records, noise, samples=20, seed=3)
    judged = [c["inside"] for g in band["cells"].values() for c in g.values()]
    assert sum(judged) >= 0.8 * len(judged)
    # ...and a machine 25% slower than the profile: every latency percentile is out of the band.
    slow = simulate(NoisyCostModel(dataclasses.replace(prof, time_scale=1.25), noise, seed=987),
                    make, sched)
    band = prediction_band(prof, make, sched, slow.records, noise, samples=20, seed=3)
    for m in ("ttft", "tpot", "e2e"):
        for p in ("p50", "p90", "p99"):
            c = band["cells"][m][p]
            assert not c["inside"] and c["real"] > c["hi"], (m, p, c)
    assert band["cells"]["e2e"]["p50"]["half_width"] > 0


def test_band_samples_must_make_a_range() -> None:
    prof = _profile()
    with pytest.raises(ValueError, match="at least 2"):
        prediction_band(prof, _make(), _sched(), [], StepNoise.for_run(prof, None), samples=1)


def test_price_sensitivity_is_one_without_queueing_and_grows_with_load() -> None:
    """How far each metric moves per error in every step price: exactly 1 when no request ever
    waits for another (every latency is a sum of steps), and past saturation TTFT and E2E move
    more than twice as far, since queueing adds steps in proportion to their length."""
    from twinserve.twin.fidelity import price_sensitivity, sensitivity_line

    def work(arrival: str, rate: float):
        cfg = WorkloadConfig(num_requests=60, arrival=arrival, rate=rate, prompt_dist="uniform",
                             prompt_min=8, prompt_max=64, output_dist="uniform", output_min=4,
                             output_max=24, vocab_size=1000)
        return lambda: Workload(cfg, 5, 512)

    prof = _profile(None)
    alone = price_sensitivity(prof, work("fixed", 0.5), _sched())  # one request every 2 s
    for m, per in alone["elasticity"].items():
        assert per == pytest.approx({"p50": 1.0, "p99": 1.0}, abs=1e-6), m
    assert alone["speed_precision"]["ttft"] == pytest.approx({"p50": 0.05, "p99": 0.10}, rel=1e-5)
    # The same from the profile at another speed: elasticity is about relative prices.
    slow = price_sensitivity(dataclasses.replace(prof, time_scale=1.7), work("fixed", 0.5), _sched())
    assert slow["elasticity"]["e2e"]["p99"] == pytest.approx(1.0, abs=1e-6)

    busy = price_sensitivity(prof, work("poisson", 60.0), _sched())
    el = busy["elasticity"]
    assert el["ttft"]["p50"] > 2.0 and el["e2e"]["p50"] > 2.0
    # Its definition, from the two simulations at x 0.95 and x 1.05.
    lo, hi = (simulate(dataclasses.replace(prof, time_scale=f), work("poisson", 60.0), _sched())
              for f in (0.95, 1.05))
    med = [statistics.median(r.first_token_time - r.arrival_time for r in x.records) for x in (lo, hi)]
    assert el["ttft"]["p50"] == pytest.approx(math.log(med[1] / med[0]) / math.log(1.05 / 0.95), rel=1e-9)
    prec = busy["speed_precision"]
    assert prec["ttft"]["p50"] == pytest.approx(0.05 / el["ttft"]["p50"])
    t = busy["tightest"]
    assert t["speed_precision"] == min(v for per in prec.values() for v in per.values())
    assert prec[t["metric"]][t["percentile"]] == t["speed_precision"]
    assert f"known within {t['speed_precision']:.1%} ({t['metric'].upper()} {t['percentile']})" \
        in sensitivity_line(busy)
    with pytest.raises(ValueError, match="delta 1.0"):
        price_sensitivity(prof, work("fixed", 0.5), _sched(), delta=1.0)
    # One-token outputs have no TPOT: that metric asks nothing of the speed, the others still do.
    one = WorkloadConfig(num_requests=20, arrival="poisson", rate=60.0, prompt_dist="uniform", prompt_min=8,
                         prompt_max=64, output_dist="fixed", output_mean=1, vocab_size=1000)
    short = price_sensitivity(prof, lambda: Workload(one, 5, 512), _sched())
    assert math.isnan(short["elasticity"]["tpot"]["p50"])
    assert short["speed_precision"]["tpot"] == {"p50": None, "p99": None}
    assert short["tightest"]["metric"] in ("ttft", "e2e") and short["tightest"]["speed_precision"] > 0


def test_host_load_tells_other_work_on_our_cpus_from_our_own() -> None:
    import subprocess
    import sys
    import time

    import psutil

    from twinserve.twin.hostload import HostLoad, warning

    # Busy for 2 s; measured from 0.2 s to 1.5 s, so it is alive when the measurement ends.
    burn = "import time\nt = time.time()\nwhile time.time() - t < 2.0: pass"

    def busy(cpus: list[int]) -> float:
        per = psutil.cpu_times(percpu=True)
        return sum(per[c].user + per[c].nice + per[c].system + per[c].irq + per[c].softirq for c in cpus)

    def measure(orphan: bool) -> tuple[dict, float, float]:
        """(HostLoad's result, CPU s the burner used, CPU s all work used on our CPUs) in the window."""
        if orphan:  # a process outside our tree: sh exits at once, its child is reparented
            pid = int(subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{burn}" >/dev/null 2>&1 & echo $!'],
                                     check=True, capture_output=True, text=True).stdout)
            proc = psutil.Process(pid)
        else:  # our own child: our work, not other work
            child = subprocess.Popen([sys.executable, "-c", burn])
            proc = psutil.Process(child.pid)
        time.sleep(0.2)  # past the interpreter's start
        h = HostLoad()
        before, all_before = sum(proc.cpu_times()[:2]), busy(h.cpus)
        time.sleep(1.3)
        used, all_used = sum(proc.cpu_times()[:2]) - before, busy(h.cpus) - all_before
        res = h.result()
        time.sleep(0.7)  # both are done before anything else is timed
        if not orphan:
            child.wait()
        return res, used, all_used

    # Whatever else runs on these CPUs, the orphan's time is counted as other work...
    other, used, _ = measure(True)
    assert used > 0.05 and other["other_cpu_s"] >= 0.8 * used, (other, used)
    # ...and our own child's is not: other work is all work less most of the child's.
    own, used, all_used = measure(False)
    assert used > 0.05 and own["other_cpu_s"] <= all_used - 0.8 * used + 0.05, (own, used, all_used)
    assert warning({"cpus": [0], "other_share": 0.0, "steal_share": 0.0}, "x") is None
    assert "taskset" in warning({"cpus": [1], "other_share": 0.4, "steal_share": 0.0}, "calibration")


def test_host_load_counts_work_on_the_other_cpus_as_neighbours() -> None:
    """A process busy on a CPU outside ours shows in neighbour_share (not in other_share), and a
    measurement with busy neighbours is warned about; with no CPU outside ours it is None."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from twinserve.twin.hostload import HostLoad, warning

    online = len(psutil.cpu_times(percpu=True))
    saved = os.sched_getaffinity(0)
    allowed = sorted(saved)
    load = {"cpus": [1], "other_share": 0.0, "steal_share": 0.0}
    assert warning({**load, "neighbour_share": 0.2}, "x") is None
    assert warning(load, "x") is None  # a log written before neighbours were recorded
    assert "other CPUs were 70% busy during the real run" in warning({**load, "neighbour_share": 0.7},
                                                                      "the real run")
    # Every CPU this process may run on is ours: the rest of the machine are neighbours.
    whole = HostLoad()
    assert whole.neighbours == [c for c in range(online) if c not in allowed]
    time.sleep(0.05)
    assert (whole.result()["neighbour_share"] is None) == (not whole.neighbours)
    if len(allowed) < 2:
        pytest.skip("needs two CPUs this process may run on")
    ours, theirs = allowed[-1], allowed[0]
    burn = "import time\nt = time.time()\nwhile time.time() - t < 2.0: pass"
    try:
        os.sched_setaffinity(0, {ours})
        burner = subprocess.Popen([sys.executable, "-c", burn],
                                  preexec_fn=lambda: os.sched_setaffinity(0, {theirs}))
        try:
            proc = psutil.Process(burner.pid)
            time.sleep(0.3)  # past the interpreter's start
            h = HostLoad()
            before, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            time.sleep(1.2)
            used, wall = sum(proc.cpu_times()[:2]) - before, time.monotonic() - t0
            res = h.result()
        finally:
            burner.wait()
    finally:
        os.sched_setaffinity(0, saved)
    assert h.cpus == [ours] and theirs in h.neighbours
    # The burner ran on CPU `theirs` only: at least its share of the neighbours' capacity.
    assert used > 0.3 and res["neighbour_share"] >= 0.8 * used / (wall * len(h.neighbours)), (res, used)


def test_step_errors_price_the_steps_after_idle_as_the_simulator_does() -> None:
    """A real log whose steps after an idle gap ran slower by the profile's wake cost is priced
    exactly: the busy-time error sees no bias (it would be -33% on those prefills without)."""
    base = _profile(None)
    shapes = [(64, 1, 0, 64 * 32.0, 0, 0)] + [(0, 0, 0, 0.0, 1, 64 + k) for k in range(5)]
    # The wake's extra seconds: half the prefill's time, a fifth of the first decode's.
    extra = (0.5 * base.step_time(*shapes[0]), 0.2 * base.step_time(*shapes[1]))
    prof = dataclasses.replace(base, wake_idle_s=(1.0,), wake_extra_s=(extra,))
    # The log's first step: how long the engine idled before it is not known, so it is plain.
    t = prof.step_time(*shapes[1])
    rows = [{**dict(zip(FEATURE_COLUMNS, shapes[1])), "start_s": 0.0, "step_time_s": t, "gap_s": 0.0}]
    for burst in range(4):
        t += 2.0  # the engine idles 2 s, then a request arrives: a prefill and five decodes
        for j, f in enumerate(shapes):
            d = prof.step_time(*f) + (extra[j] if j < 2 else 0.0)
            rows.append({**dict(zip(FEATURE_COLUMNS, f)), "start_s": t, "step_time_s": d,
                         "gap_s": 0.0})
            t += d
    st = step_errors(prof, rows)
    assert st["busy_err"] == pytest.approx(0.0, abs=1e-12)
    assert all(v == pytest.approx(0.0, abs=1e-12) for v in st["busy_err_by_kind"].values())
    plain = step_errors(dataclasses.replace(prof, wake_idle_s=(), wake_extra_s=()), rows)
    assert plain["busy_err_by_kind"]["prefill"] == pytest.approx(1 / 1.5 - 1)


def test_targets_count_the_cells_met_and_those_inside_the_real_runs_spread() -> None:
    from twinserve.twin.compare import target_line, targets

    errs = {"ttft": (0.049, -0.2), "tpot": (-0.051, 0.09), "e2e": (0.0, -0.101)}
    metrics = {m: {"p50": {"err": a}, "p99": {"err": b}} for m, (a, b) in errs.items()}
    t = targets(metrics)
    assert t["of"] == 6 and t["met"] == 3 and "within_real_spread" not in t
    assert [(m, q) for m, per in t["cells"].items() for q, c in per.items() if not c["met"]] == \
        [("ttft", "p99"), ("tpot", "p50"), ("e2e", "p99")]
    line = target_line(t)
    assert "3 of 6 met; missed: TTFT p99 -20.0%, TPOT p50 -5.1%, E2E p99 -10.1%" in line
    # Beside the real runs' spread: TTFT p99 (-20%) lies inside runs 25% apart, E2E p99 not.
    spread = {m: {"p50": 0.01, "p99": 0.25 if m == "ttft" else 0.05} for m in errs}
    t = targets(metrics, {"p50": 0.06, "p99": 0.10}, spread, "pooled over 2 real runs")
    assert t["met"] == 4 and t["cells"]["ttft"]["p99"]["within_real_spread"]
    assert not t["cells"]["e2e"]["p99"]["within_real_spread"]
    assert t["within_real_spread"] == 2  # TTFT p99 and E2E p50 (0.0 within 1%)
    assert "4 of 6 met, 2 of 6 within the real runs' own spread" in target_line(t)
    assert "TTFT p99 -20.0% (real runs 25.0% apart)" in target_line(t)


def test_busy_error_by_quarter_shows_the_machine_slowing_during_the_run() -> None:
    from twinserve.twin.steps import step_line

    prof = _profile(None)
    rows, t = [], 0.0
    for i in range(40):
        f = (0, 0, 0, 0.0, 4, 400 + i) if i % 2 else (64, 1, 0, 64 * 32.0, 0, 0)
        d = prof.step_time(*f) * (1.25 if i >= 20 else 1.0)  # the core slows by 25% halfway
        rows.append({**dict(zip(FEATURE_COLUMNS, f)), "start_s": t, "step_time_s": d, "gap_s": 0.0})
        t += d
    # Logged out of order (a core process's batches): quarters go by start time.
    st = step_errors(prof, rows[::-1])
    assert st["busy_err_by_quarter"] == pytest.approx([0.0, 0.0, 1 / 1.25 - 1, 1 / 1.25 - 1])
    assert "by quarter of the run +0.0% / +0.0% / -20.0% / -20.0%" in step_line(st, "\n")
    # Without start times (a log from elsewhere) or with too few steps: no quarters.
    assert "busy_err_by_quarter" not in step_errors(prof, [{k: v for k, v in r.items() if k != "start_s"}
                                                           for r in rows])
    assert "busy_err_by_quarter" not in step_errors(prof, rows[:7])
