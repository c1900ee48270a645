"""The twin's loop on a real (tiny) engine: replay must reproduce the schedule exactly; calibrate
and fidelity produce what they promise; bad inputs are clear errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from twinserve.backends.real.step_log import read_step_log
from twinserve.twin.fidelity import FidelityOptions, exit_code, run_fidelity
from twinserve.twin.realrun import run_real
from twinserve.twin.replay import replay
from twinserve.core.errors import TwinserveError
from twinserve.sim.workload import Workload, WorkloadConfig

TRACE_ROWS = [(0.0, 30, 6), (0.01, 12, 9), (0.02, 44, 4), (0.05, 20, 7), (0.06, 9, 12),
              (0.07, 33, 5), (0.09, 16, 8), (0.12, 25, 6), (0.13, 40, 3), (0.2, 11, 10)]


def _trace(path: Path, rows=TRACE_ROWS) -> Path:
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{a},{p},{d}" for a, p, d in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _busy_workload(vocab: int) -> WorkloadConfig:
    # Shared system prompts (prefix hits), two turns (history hits), fast arrivals (queueing,
    # chunked prefill against a small budget) on a small KV pool (preemption).
    return WorkloadConfig(num_requests=14, arrival="poisson", rate=400.0, prompt_dist="uniform",
                          prompt_min=10, prompt_max=40, output_dist="uniform", output_min=4,
                          output_max=14, num_system_prompts=2, system_prompt_len=12, turns=2,
                          followup_tokens=8, think_time=0.002, vocab_size=vocab)


def test_replay_reproduces_the_real_schedule_exactly(make_engine) -> None:
    engine = make_engine(num_gpu_blocks_override=40, max_num_batched_tokens=24, max_num_seqs=6)
    cfg = _busy_workload(engine.vocab_size)
    make = lambda: Workload(cfg, 3, engine.max_model_len)  # noqa: E731
    real = run_real(engine, make())
    assert not real.interrupted and len(real.records) > 14  # follow-up turns were made
    # The workload exercised what the check must see.
    assert real.num_preemptions > 0
    assert sum(r.prefix_hit_tokens for r in real.records) > 0
    prompts = {r.request_id: r.num_prompt_tokens for r in real.records}
    assert any(n < prompts[rid] and n > 1 for s in real.schedules for rid, n in s.items())  # chunked
    check = replay(real, make, engine.scheduler_config)
    assert check.exact, check.first_mismatch
    assert check.num_steps_sim == check.num_steps_real == len(real.step_starts)
    assert check.max_token_time_diff_s < 1e-9
    # The check can fail: a simulator with a different KV pool schedules differently.
    other = dataclasses.replace(engine.scheduler_config, num_blocks=64)
    assert not replay(real, make, other).exact
    engine.shutdown()


def test_calibrate_and_fidelity_end_to_end(tiny_model: Path, tmp_path: Path, capsys, experiment) -> None:
    from twinserve.cli import main

    prof = tmp_path / "tiny.json"
    common = ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "256",
              "--block-size", "4", "--num-gpu-blocks-override", "200"]
    # Speed samples every 20 ms (the tiny model's design runs in about a second).
    assert main(["calibrate", "--out", str(prof), "--quick", "--repeats", "1", "--no-progress",
                 "--max-context", "100", "--probe-every", "5", "--sample-every", "0.02", "--prefill-samples",
                 *common]) == 0
    data = json.loads(prof.read_text())
    # The quick design's decodes reach 1.5 x 24 + 3 tokens of context; --max-context adds a
    # decode context whose spread reaches 100, and the fit saw batches at it (65 on average).
    assert data["provenance"]["design"]["decode_contexts"] == [8, 24, 65]
    assert data["fit"]["range"]["decode_context_per_seq"] >= 65
    assert data["format"] == "twinserve-step-profile/4"
    assert data["provenance"]["threads"] == 1 and data["provenance"]["dtype"] == "float64"
    import torch

    from twinserve.twin.calibrate import cpu_features, device_name

    # The machine it was made on, by name and by the CPU features that pick torch's kernels.
    assert data["hardware"] == device_name(torch.device("cpu"))
    assert data["provenance"]["cpu"] == cpu_features()
    assert data["fit"]["num_steps"] > 20 and {"prefill", "decode", "mixed"} <= set(data["fit"]["by_kind"])
    assert all(v >= 0 for v in data["coefficients"].values())
    assert all(v >= 0 for v in data["overhead_coefficients"].values())
    assert prof.with_suffix(".steps.csv").exists()
    # The quick design idles 0.05 s twice before a fresh prompt: the steps after it are marked
    # (their prompt's prefill first) and priced by an extra time per step.
    marks = data["provenance"]["idle_steps"]
    assert [g for _, g in marks] == [0.05, 0.05]
    steps = read_step_log(prof.with_suffix(".steps.csv"))
    assert all(steps[i]["num_prefill_seqs"] == 1 and steps[i]["num_decode_seqs"] == 0 for i, _ in marks)
    assert data["wake"]["idle_s"] == [0.05] and len(data["wake"]["extra_s"][0]) == 2
    printed = capsys.readouterr().out
    assert "first steps after idling 0.05 s: +" in printed
    # The profile records the largest steps it was fitted on (not the steps after idling,
    # which are priced apart), and says so.
    from twinserve.twin.calibrate import split_wake

    top = data["fit"]["range"]
    fitted, _ = split_wake(steps, marks)
    assert top["num_tokens"] == max(r["num_prefill_tokens"] + r["num_decode_seqs"] for r in fitted)
    assert f"fitted steps of up to {top['num_tokens']:.0f} new tokens" in printed
    # The speed probe ran before and after the design and every 5 points; the profile is
    # priced at their median.
    probes = data["provenance"]["speed_probes"]
    assert data["provenance"]["design"]["probe_every"] == 5 and data["provenance"]["drift_corrected"]
    from twinserve.twin.calibrate import CalibrationDesign

    design = CalibrationDesign(**data["provenance"]["design"])
    points = sum(c > 0 for c in design.prefill_contexts) + design.num_points() * design.repeats
    assert len(probes) == 2 + points // 5  # one after every 5th point, plus before and after
    assert data["provenance"]["speed_probe_s"] == pytest.approx(float(np.median([s for _, s in probes])))
    # The drift was corrected by the speed samples, each smoothed as fidelity smooths them; the
    # profile is priced at the median smoothed sample.
    from twinserve.twin.speedtrace import SpeedTrace

    prov = data["provenance"]
    assert prov["drift_source"] == "samples" and len(prov["speed_samples"]) >= 5
    # By default sampled by a pass through the model's own weights, which fidelity samples with too.
    assert prov["speed_sampler"] == "weights"
    # Smoothed by the median, without the samples the steps around them contradicted (if any).
    assert prov["speed_sample_smoothing"] == "median"
    kept = [x for i, x in enumerate(prov["speed_samples"]) if i not in prov["speed_samples_dropped"]]
    assert len(kept) >= 2
    n, k = len(prov["speed_samples"]), len(prov["speed_samples_dropped"])
    assert f"speed samples: {n}, smoothed by their median over 20 s; " in printed
    assert ("none contradicted" in printed) == (k == 0) and (f"{k} left out, contradicted" in printed) == (k > 0)
    smooth = SpeedTrace.from_samples(kept, 1.0, window_s=prov["speed_sample_window_s"])
    assert prov["speed_sample_s"] == pytest.approx(float(np.median(smooth.factors)), rel=1e-6)
    # Asked for, the prefill sampler sampled right after every speed sample; the steps' prefill
    # shares are priced at its median smoothed sample.
    assert prov["prefill_speed_sampler"] == "gemm"
    pre = prov["prefill_speed_samples"]
    assert len(pre) == len(prov["speed_samples"]) and all(a[0] > b[0] for a, b in zip(pre, prov["speed_samples"]))
    smooth_p = SpeedTrace.from_samples(pre, 1.0, window_s=prov["speed_sample_window_s"])
    assert prov["prefill_speed_sample_s"] == pytest.approx(float(np.median(smooth_p.factors)), rel=1e-6)
    assert f"prefill samples (gemm): {len(pre)}, reference {prov['prefill_speed_sample_s'] * 1e3:.2f} ms" in printed
    out = tmp_path / "fid"
    # By default (--speed-from auto) a profile whose reference the weights sampler took judges by
    # the samples.
    rc = main(["fidelity", "--profile", str(prof), "--trace", str(_trace(tmp_path / "t.csv")),
               "--out", str(out), "--max-num-batched-tokens", "128", "--sample-every", "0.02", "--prefill-samples",
               *common])
    assert rc == 0
    rep = json.loads((out / "fidelity.json").read_text())
    assert rep["workload"]["speed_from"] == "auto"
    for m in ("ttft", "tpot", "itl", "e2e"):
        for p in ("p50", "p90", "p99"):
            cell = rep["metrics"][m][p]
            assert cell["real"] > 0 and cell["sim"] > 0
            assert cell["err"] == pytest.approx((cell["sim"] - cell["real"]) / cell["real"])
        assert rep["metrics"][m]["per_request_median_abs_err"] >= 0
    assert rep["num_requests"] == len(TRACE_ROWS) and rep["profile"] == str(prof)
    assert rep["engine"]["hardware"] == data["hardware"] and rep["engine"]["cpu"] == cpu_features()
    # How far each target metric moves per error in the step prices, and what that asks of the
    # speed probes (fidelity.price_sensitivity, tested on its own in test_band.py).
    sens = rep["sensitivity"]
    assert set(sens["elasticity"]) == {"ttft", "tpot", "e2e"} and sens["tightest"]["speed_precision"] > 0
    assert "must be known within" in (out / "fidelity.md").read_text()
    assert set(rep["throughput"]) == {"output_tok_s", "request_s"}
    assert rep["replay"]["exact"] and rep["steps"]["num_steps"] > 0
    # How much of the run the profile priced beyond the shapes it was fitted on.
    beyond = rep["steps"]["beyond_range"]
    assert 0.0 <= beyond["steps_share"] <= 1.0 and 0.0 <= beyond["busy_share"] <= 1.0
    assert all(d["max_seen"] > d["max_fitted"] == top[name] for name, d in beyond["dims"].items())
    assert bool(beyond["dims"]) == (beyond["steps_share"] > 0)
    # The machine's speed was probed around the run and the prediction scaled by it; the raw
    # comparison is kept beside it.
    sp = rep["speed"]
    assert sp["normalized"] and sp["probe_before_s"] > 0 and sp["probe_after_s"] > 0
    assert sp["machine_speed_ratio"] == pytest.approx(
        (sp["probe_before_s"] + sp["probe_after_s"]) / 2 / data["provenance"]["speed_probe_s"])
    # Decode and prefill are scaled by their own parts of the probe, against calibration's.
    cal_parts = data["provenance"]["speed_probe_parts"]
    for part in ("decode", "prefill"):
        mean = (sp["probe_before_parts"][f"{part}_s"] + sp["probe_after_parts"][f"{part}_s"]) / 2
        assert sp[f"machine_speed_ratio_{part}"] == pytest.approx(mean / cal_parts[f"{part}_s"])
    assert sp["probe_before_s"] == pytest.approx(sum(sp["probe_before_parts"].values()))
    assert "scaled by part" not in (out / "fidelity.md").read_text()  # overall unless asked
    # The machine's speed was also sampled all through the run (every 20 ms here), and the
    # prediction priced every step at the speed sampled at its start, against the profile's
    # median sample; its mean over the run's steps is reported.
    smp = sp["sampled"]
    assert smp["num_samples"] == len(smp["samples"]) >= 2 and smp["ref_s"] == prov["speed_sample_s"]
    assert smp["sampler"] == "weights"
    trace = SpeedTrace.from_samples(smp["samples"], prov["speed_sample_s"], smp["every_s"], smp["window_s"])
    # and, asked for, by the prefill sampler after each: a step's prefill share at its speed.
    assert smp["prefill_sampler"] == "gemm" and len(smp["prefill_samples"]) == len(smp["samples"])
    assert smp["prefill"]["num_samples"] == len(smp["samples"])
    pre = SpeedTrace.from_samples(smp["prefill_samples"], prov["prefill_speed_sample_s"], smp["every_s"],
                                  smp["window_s"])
    rows = read_step_log(out / "steps_real.csv")

    def at(r, prefill=True):
        t, p = float(r["start_s"]) - smp["t0"], r["num_prefill_tokens"]
        w = trace.factor(t)
        return w + (pre.factor(t) - w) * p / (p + r["num_decode_seqs"]) if prefill and p else w

    busy = sum(r["step_time_s"] for r in rows)
    assert smp["mean_factor"] == pytest.approx(sum(r["step_time_s"] * at(r) for r in rows) / busy)
    # Without the prefill samples (--no-prefill-samples), every step at the weights sampler's speed.
    weights_only = tmp_path / "weights-only"
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(weights_only),
                 "--band-samples", "0", "--no-prefill-samples"]) == 0
    rw = json.loads((weights_only / "fidelity.json").read_text())
    assert "prefill" not in rw["speed"]["sampled"] and rw["workload"]["prefill_samples"] is False
    assert rw["speed"]["sampled"]["mean_factor"] == pytest.approx(
        sum(r["step_time_s"] * at(r, False) for r in rows) / busy)
    assert f"sampled {smp['num_samples']} times (every 0.02 s" in (out / "fidelity.md").read_text()
    assert "ms each, by the weights sampler)" in (out / "fidelity.md").read_text()
    assert "; its prefill shares by the gemm sampler after each (" in (out / "fidelity.md").read_text()
    # The samples paused the steps after them; fidelity judged the steps without that time
    # (without_sample_pauses), so the report's busy time is the engine's alone.
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.twin.fidelity import raw_speed
    from twinserve.twin.speedtrace import without_sample_pauses
    from twinserve.twin.steps import step_errors

    judged = without_sample_pauses(rows, smp["samples"] + smp["prefill_samples"], t0=smp["t0"])
    assert any(r.get("sampler_pause_s", 0.0) > 0 for r in judged)
    raw = raw_speed(FittedCostModel.load(prof))
    assert rep["steps_raw"]["busy_err"] == pytest.approx(step_errors(raw, judged)["busy_err"], abs=1e-12)
    assert step_errors(raw, rows)["busy_err"] < rep["steps_raw"]["busy_err"] - 1e-6
    # experiments/speed_in_runs.py prices the run's steps as fidelity does: by the samples, its
    # busy-time error is the report's, and read at the reference speed, the raw one.
    speed_in_runs = experiment("speed_in_runs")
    win, busy, shares = speed_in_runs.measure(FittedCostModel.load(prof), speed_in_runs.run_dirs([str(out)]))
    assert busy["none"] == [pytest.approx(np.log1p(rep["steps_raw"]["busy_err"]), abs=1e-9)]
    # The run took prefill samples too: they split each step in one more reading; the weights
    # samples alone are fidelity's default reading.
    assert busy["samples (fidelity)"] == [pytest.approx(np.log1p(rw["steps"]["busy_err"]), abs=1e-9)]
    assert busy[speed_in_runs.SPLIT] == [pytest.approx(np.log1p(rep["steps"]["busy_err"]), abs=1e-9)]
    assert len(busy) == 7 and set(shares) == set(speed_in_runs.BY_SHARE)
    assert all(0.0 <= s <= 1.0 for rows in shares.values() for *_, s, _ in rows)
    # Judged by the probes around it instead: the steps priced at their mean ratio.
    by_probes = tmp_path / "by-probes"
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(by_probes),
                 "--band-samples", "0", "--speed-from", "probes"]) == 0
    rp = json.loads((by_probes / "fidelity.json").read_text())
    assert "scaled by the run's measured machine speed" in (by_probes / "fidelity.md").read_text()
    assert rp["speed_matched"]["time_scale"] == pytest.approx(
        sp["machine_speed_ratio"] / (1 + rp["steps"]["busy_err"]))
    # A profile with no reference sample (made before samples, or on a CUDA device) judges the
    # sampled run by its probes, and keeps nothing of the samples' earlier judgement.
    unsampled = tmp_path / "unsampled.json"
    unsampled.write_text(json.dumps({**data, "provenance": {**prov, "speed_sample_s": None}}))
    assert speed_in_runs.measure(FittedCostModel.load(unsampled), [out]) == ({}, {}, {})
    assert main(["fidelity", "--from-run", str(out), "--profile", str(unsampled), "--out",
                 str(tmp_path / "unsampled"), "--band-samples", "0"]) == 0
    ru = json.loads((tmp_path / "unsampled" / "fidelity.json").read_text())
    assert set(ru["speed"]["sampled"]) == {"samples", "t0", "every_s", "window_s", "sampler", "prefill_samples",
                                           "prefill_sampler"}
    assert ru["metrics"] == rp["metrics"]
    # So does a profile whose reference is another kind of sample's seconds (a matvec's), whose
    # ratio to this run's samples would mean nothing.
    other_kind = tmp_path / "matvec.json"
    other_kind.write_text(json.dumps({**data, "provenance": {**prov, "speed_sampler": "matvec"}}))
    assert main(["fidelity", "--from-run", str(out), "--profile", str(other_kind), "--out",
                 str(tmp_path / "other-kind"), "--band-samples", "0", "--speed-from", "samples"]) == 0
    rk = json.loads((tmp_path / "other-kind" / "fidelity.json").read_text())
    assert "mean_factor" not in rk["speed"]["sampled"] and rk["metrics"] == rp["metrics"]
    # With a profile whose reference the matvec sampler took, fidelity by default takes no samples
    # (the real run has no pauses) and judges by the probes.
    plain = tmp_path / "plain"
    assert main(["fidelity", "--profile", str(other_kind), "--trace", str(_trace(tmp_path / "t.csv")),
                 "--out", str(plain), "--max-num-batched-tokens", "128", "--band-samples", "0", *common]) == 0
    rq = json.loads((plain / "fidelity.json").read_text())
    assert "sampled" not in rq["speed"] and rq["workload"]["speed_from"] == "auto"
    assert rq["speed"]["normalized"] and "scaled by it" in (plain / "fidelity.md").read_text()
    assert set(rep["metrics_raw"]) == {"ttft", "tpot", "itl", "e2e"}
    assert (out / "fidelity.png").stat().st_size > 10_000 and (out / "fidelity.md").exists()
    # Arrivals are the trace's own timestamps; outputs are forced to the trace's lengths.
    import pandas as pd

    real = pd.read_csv(out / "requests_real.csv").sort_values("arrival_s")
    assert real["arrival_s"].tolist() == pytest.approx([a for a, _, _ in TRACE_ROWS])
    assert real["output_tokens"].tolist() == [d for _, _, d in TRACE_ROWS]
    # The recorded run judged again, without the engine, with the same profile: the same report.
    again = tmp_path / "again"
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(again)]) == 0
    rep2 = json.loads((again / "fidelity.json").read_text())
    assert rep2["metrics"] == rep["metrics"] and rep2["throughput"] == rep["throughput"]
    assert rep2["metrics_raw"] == rep["metrics_raw"] and rep2["steps"] == rep["steps"]
    # The targets, cell by cell from the report's errors, in the JSON and the table's line.
    t = rep["targets"]
    errs = [rep["metrics"][m][q]["err"] for m in ("ttft", "tpot", "e2e") for q in ("p50", "p99")]
    assert t["of"] == 6 and t["met"] == sum(abs(e) <= lim for e, lim in zip(errs, [0.05, 0.10] * 3))
    assert f"{t['met']} of 6 met" in (out / "fidelity.md").read_text() and rep2["targets"] == t
    # The same cells at the run's own mean speed (one run: judged on it), and the scale used.
    tm = rep["targets_speed_matched"]
    assert tm["judged_on"] == "the run; each run at its own mean speed, not a prediction"
    assert tm["cells"]["ttft"]["p50"]["err"] == rep["speed_matched"]["metrics"]["ttft"]["p50"]["err"]
    # Judged at the speed sampled through the run, the matched scale is on top of it.
    assert rep["speed_matched"]["time_scale"] == pytest.approx(1 / (1 + rep["steps"]["busy_err"]))
    assert (f"x {rep['speed_matched']['time_scale']:.3f} the calibration's prices, at the speed sampled "
            "through it" in (out / "fidelity.md").read_text())
    assert rep2["targets_speed_matched"] == tm
    # --fail-on-miss: exit 3 when a cell misses, 0 when all are met; a bad limit is refused.
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(again),
                 "--band-samples", "0", "--target-p50", "1e-9", "--fail-on-miss"]) == 3
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(again),
                 "--band-samples", "0", "--target-p50", "9", "--target-p99", "9", "--fail-on-miss"]) == 0
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(again),
                 "--target-p99", "0"]) == 2
    assert "--target-p99 0.0: give the largest relative error allowed" in capsys.readouterr().err
    # The prediction band: 20 noisy simulations with the profile's own residual spread; the
    # same seeds give the same band when the run is judged again.
    band = rep["band"]
    assert band["samples"] == 20 and band["noise"]["step_sigma"]["decode"] > 0
    for m in ("ttft", "tpot", "e2e"):
        c = band["cells"][m]["p50"]
        assert c["lo"] <= c["hi"] and c["real"] == rep["metrics"][m]["p50"]["real"]
    assert rep2["band"] == band
    assert "prediction band" in (out / "fidelity.md").read_text()
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(again),
                 "--band-samples", "1"]) == 2
    assert "--band-samples 1: give 0 (no band) or at least 2" in capsys.readouterr().err
    # Judged again scaling decode and prefill by their own probe parts.
    by_part = tmp_path / "by-part"
    assert main(["fidelity", "--from-run", str(out), "--profile", str(prof), "--out", str(by_part),
                 "--speed-by-part", "--band-samples", "0", "--speed-from", "probes"]) == 0
    rep3 = json.loads((by_part / "fidelity.json").read_text())
    assert rep3["workload"]["speed_by_part"] and "band" not in rep3
    assert "decode and prefill by part" in (by_part / "fidelity.md").read_text()
    # A profile refitted from its own step log by the same fit is the same profile, up to the
    # drift correction redone from probe times and seconds stored rounded (to 1 us and 1 ns):
    # a few parts per million of a coefficient with probes every 5 points, and 1e-12 s per unit
    # is far below any term.
    refit = tmp_path / "refit.json"
    assert main(["calibrate", "--refit", str(prof), "--out", str(refit)]) == 0
    r = json.loads(refit.read_text())
    assert r["coefficients"] == pytest.approx(data["coefficients"], rel=2e-5, abs=1e-12)
    assert r["overhead_coefficients"] == pytest.approx(data["overhead_coefficients"], rel=2e-5, abs=1e-12)
    assert r["provenance"]["refit"]["step_log"] == "tiny.steps.csv"
    # The reference samples (both kinds) are redone from the samples too, stored to 1 ns.
    got, made = (dict(p, refit=None, speed_sample_s=None, prefill_speed_sample_s=None)
                 for p in (r["provenance"], data["provenance"]))
    assert got == made
    for key in ("speed_sample_s", "prefill_speed_sample_s"):
        assert r["provenance"][key] == pytest.approx(data["provenance"][key], rel=1e-4)
    # Refitted again, the earlier refit's note is kept under the new one.
    refit2 = tmp_path / "refit2.json"
    assert main(["calibrate", "--refit", str(refit), "--from-log", str(prof.with_suffix(".steps.csv")),
                 "--out", str(refit2)]) == 0
    assert json.loads(refit2.read_text())["provenance"]["refit"]["earlier_refit"] == r["provenance"]["refit"]


def test_fidelity_refuses_bad_inputs_before_running(tiny_model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.cli import main

    other = tmp_path / "other.json"
    FittedCostModel(intercept_s=0.01, meta={"model": "Llama-2-7B"}).save(other)
    common = ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "64",
              "--out", str(tmp_path / "o")]
    trace = _trace(tmp_path / "t.csv")
    assert main(["fidelity", "--profile", str(other), "--trace", str(trace), *common]) == 2
    err = capsys.readouterr().err
    assert "Llama-2-7B" in err and "calibrated for model" in err and not (tmp_path / "o").exists()
    # A profile measured on another machine prices this one's steps wrong: refused, naming both.
    elsewhere = tmp_path / "elsewhere.json"
    FittedCostModel(intercept_s=0.01, meta={"hardware": "cpu: Some Other CPU"}).save(elsewhere)
    assert main(["fidelity", "--profile", str(elsewhere), "--trace", str(_trace(tmp_path / "t.csv")),
                 *common]) == 2
    err = capsys.readouterr().err
    assert "calibrated on 'cpu: Some Other CPU' but the engine runs on 'cpu: " in err
    assert "twinserve calibrate" in err and not (tmp_path / "o").exists()
    ok = tmp_path / "ok.json"
    FittedCostModel(intercept_s=0.01).save(ok)
    long_trace = _trace(tmp_path / "long.csv", [(0.0, 10, 4), (0.1, 60, 30)])
    assert main(["fidelity", "--profile", str(ok), "--trace", str(long_trace), *common]) == 2
    err = capsys.readouterr().err
    assert "long.csv:3" in err and "--max-prompt-tokens" in err
    # Clipped as the message says, the same trace runs.
    assert main(["fidelity", "--profile", str(ok), "--trace", str(long_trace), "--max-prompt-tokens",
                 "32", "--max-output-tokens", "16", *common]) == 0
    # calibrate refuses a bad design flag by name, before loading an engine, writing nothing.
    prof = tmp_path / "cal.json"
    for flag, value in (("--max-context", "0"), ("--probe-every", "-1")):
        assert main(["calibrate", "--out", str(prof), "--quick", flag, value, *common[:-2]]) == 2
        assert f"config {flag[2:].replace('-', '_')}=" in capsys.readouterr().err and not prof.exists()


def test_fidelity_refuses_a_profile_made_with_other_small_batch_rows(tiny_model: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An fp32 CPU engine whose products take the transposed copies up to 8 rows refuses a profile
    whose engine took them up to 4 (its 5-8-row steps ran another kernel), naming both."""
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.cli import main

    prov = {"device": "cpu", "dtype": "float32", "engine": {"small_batch_weights": True, "small_batch_rows": 4}}
    prof = tmp_path / "rows4.json"
    FittedCostModel(intercept_s=0.002, meta={"provenance": prov}).save(prof)
    common = ["--model", str(tiny_model), "--dtype", "float32", "--max-model-len", "64",
              "--trace", str(_trace(tmp_path / "t.csv")), "--profile", str(prof)]
    assert main(["fidelity", *common, "--small-batch-rows", "8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "small_batch_rows=4 but the engine runs small_batch_rows=8" in err and "5-8 rows" in err
    assert not (tmp_path / "o").exists()
    # The engine with the profile's limit runs it, and records its own limit with the run.
    assert main(["fidelity", *common, "--small-batch-rows", "4", "--no-normalize-speed",
                 "--out", str(tmp_path / "ok")]) == 0
    assert json.loads((tmp_path / "ok" / "fidelity.json").read_text())["engine"]["small_batch_rows"] == 4
    # Judged again later (--from-run), the run's recorded limit is checked the same way.
    prov["engine"]["small_batch_rows"] = 8
    rows8 = tmp_path / "rows8.json"
    FittedCostModel(intercept_s=0.002, meta={"provenance": prov}).save(rows8)
    capsys.readouterr()
    assert main(["fidelity", "--from-run", str(tmp_path / "ok"), "--profile", str(rows8),
                 "--out", str(tmp_path / "again")]) == 2
    assert "small_batch_rows=8 but the engine runs small_batch_rows=4" in capsys.readouterr().err


def test_interrupt_aborts_the_engine_and_writes_what_was_measured(make_engine, tmp_path: Path) -> None:
    from twinserve.backends.sim.fitted import FittedCostModel

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(prof)
    engine = make_engine()
    real_step = engine.step
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt
        return real_step()

    engine.step = step
    rep = run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv"))),
                       tmp_path / "out", echo=lambda s: None)
    assert rep["interrupted"] and exit_code(rep) == 130
    assert not engine.has_unfinished_requests() and not engine.core.has_unfinished_requests()
    saved = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert saved["interrupted"] and saved["num_requests"] < len(TRACE_ROWS) + 1
    engine.shutdown()


def test_calibration_decode_points_measure_the_whole_batch(make_engine) -> None:
    """A batch whose prefill spans many steps still decodes together, `steps` times at least."""
    from twinserve.twin.calibrate import Calibrator

    engine = make_engine(max_num_batched_tokens=32, max_num_seqs=16)
    cal = Calibrator(engine)
    engine.set_step_log(cal.log)
    for batch, context in ((6, 24), (12, 40)):
        first = len(cal.log.records)
        cal.decode(batch, context, 3)
        whole = [r for r in cal.log.records[first:]
                 if r.num_prefill_tokens == 0 and r.num_decode_seqs == batch]
        assert len(whole) >= 3, (batch, context, len(whole))
        # ...at the design's context: about batch x context tokens, plus what was decoded.
        assert whole[0].decode_context >= batch * context
    engine.shutdown()


def test_calibration_decode_sweep_measures_every_batch_from_one_prefill(make_engine) -> None:
    """One set of prompts serves every batch size: each size decodes `steps` times with its
    contexts still spread over [c/2, 3c/2] and the middle prompt kept (one sequence decodes at
    the design's context), and only the largest batch's prompts are prefilled."""
    from twinserve.backends.real.step_log import StepLog
    from twinserve.twin.calibrate import Calibrator

    engine = make_engine(max_num_batched_tokens=32, max_num_seqs=16, num_gpu_blocks_override=400)
    cal = Calibrator(engine)
    cal.log = StepLog(keep=True, record_schedule=True)  # which request ran in each step
    engine.set_step_log(cal.log)
    batches, context, steps = [1, 2, 3, 6, 12], 40, 3
    cal.decode_sweep(batches, context, steps)
    recs = cal.log.records
    lens = [round(context * (0.5 + i / 11)) for i in range(12)]  # cal-1 .. cal-12, shortest first
    assert sum(r.num_prefill_tokens for r in recs) == sum(lens)
    shortest, middle, longest = "cal-1", "cal-6", "cal-12"
    for b in batches:
        whole = [r for r in recs if r.num_prefill_tokens == 0 and r.num_decode_seqs == b]
        assert len(whole) >= steps, (b, len(whole))
        ran = set(whole[0].scheduled)
        # Kept evenly, with the middle prompt (38 tokens) in every batch: three or more keep the
        # shortest and longest (20 and 60 tokens) too, two the middle and the longest, and one
        # is the middle (kept only evenly, it was the shortest).
        assert middle in ran, (b, ran)
        if b > 2:
            assert {shortest, longest} <= ran, (b, ran)
        elif b == 2:
            assert ran == {middle, longest}, ran
        else:
            assert ran == {middle}, ran
    # Largest first, and nothing is left running or holding KV blocks.
    sizes = [r.num_decode_seqs for r in recs if r.num_prefill_tokens == 0]
    assert sizes.index(12) < sizes.index(6) < sizes.index(3) < sizes.index(1)
    assert not engine.has_unfinished_requests()
    kv = engine.core.scheduler.kv
    assert kv.pool.num_free_blocks == kv.num_blocks
    engine.shutdown()


def test_calibration_probes_between_points_only_where_the_probes_correct_the_drift(make_engine) -> None:
    """By default the probe runs between design points only where it corrects the drift: with
    speed samples, only before and after the design."""
    from dataclasses import replace

    from twinserve.twin.calibrate import PROBE_EVERY, CalibrationDesign, calibrate

    engine = make_engine(max_num_batched_tokens=128, max_num_seqs=8, max_model_len=256)
    quick = replace(CalibrationDesign.quick(), probe_every=None, idle_gaps=[])
    sampled, _ = calibrate(engine, replace(quick, sample_every_s=0.02), progress=False)
    prov = sampled.meta["provenance"]
    assert prov["drift_source"] == "samples" and prov["design"]["probe_every"] == 0
    assert len(prov["speed_probes"]) == 2
    probed, _ = calibrate(engine, replace(quick, sample_every_s=0.0), progress=False)
    prov = probed.meta["provenance"]
    assert prov["drift_source"] == "probes" and prov["design"]["probe_every"] == PROBE_EVERY
    points = sum(c > 0 for c in quick.prefill_contexts) + quick.num_points()
    assert len(prov["speed_probes"]) == 2 + points // PROBE_EVERY > 2
    engine.shutdown()


def test_calibration_mixed_points_meet_the_whole_batch_at_its_context(make_engine) -> None:
    """The prompt of a mixed point shares its step with every sequence of the batch, even when
    the batch's own prefill at long context took many steps."""
    from twinserve.twin.calibrate import Calibrator

    engine = make_engine(max_num_batched_tokens=32, max_num_seqs=16)
    cal = Calibrator(engine)
    engine.set_step_log(cal.log)
    for batch, q, context in ((3, 8, 4), (6, 20, 40), (10, 16, 24)):
        first = len(cal.log.records)
        cal.mixed(batch, q, context)
        met = [r for r in cal.log.records[first:]
               if r.num_prefill_tokens == q and r.num_prefill_seqs == 1 and r.num_decode_seqs == batch]
        assert len(met) == 1, (batch, q, context)
        assert met[0].decode_context >= batch * context
    engine.shutdown()


def test_speed_probe_repeats_on_one_engine(make_engine) -> None:
    """The probe computes every token each time: its prompts never become prefix hits later."""
    from twinserve.twin.calibrate import speed_probe

    engine = make_engine(max_num_batched_tokens=256)
    first, second = speed_probe(engine), speed_probe(engine)
    assert first > 0 and second > 0
    assert engine.core.scheduler.kv.stats.hits == 0
    assert speed_probe(make_engine(max_num_batched_tokens=64)) is None  # shapes do not fit one step
    engine.shutdown()


def test_speed_probe_rounds_take_the_median_over_more_steps(make_engine, monkeypatch) -> None:
    """More rounds run more probe steps, and the parts are the median over all of them."""
    from twinserve.backends.real import step_log
    from twinserve.twin.calibrate import speed_probe_parts

    engine = make_engine(max_num_batched_tokens=256)
    steps = []
    for rounds in (1, 4):
        before = engine.core.num_steps
        parts = speed_probe_parts(engine, rounds=rounds)
        steps.append(engine.core.num_steps - before)
        assert parts.decode_s > 0 and parts.prefill_s > 0
    assert steps[1] == 4 * steps[0]
    # Planted step times: rounds of 128-token prefills taking 1, 2, ... s; the median is chosen.
    seen = iter(range(1, 100))
    append = step_log.StepLog.append

    def planted(self, rec):
        if rec.num_prefill_tokens == 128 and rec.num_decode_seqs == 0:
            rec.step_time_s = float(next(seen))
        return append(self, rec)

    monkeypatch.setattr(step_log.StepLog, "append", planted)
    assert speed_probe_parts(engine, rounds=5).prefill_s == 3.0
    with pytest.raises(ValueError, match="rounds"):
        speed_probe_parts(engine, rounds=0)
    engine.shutdown()


def test_calibrate_at_tensor_parallel_2_logs_comm_and_fidelity_refuses_a_tp_mismatch(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """calibrate runs the design on two worker processes: the profile says TP 2 and prices the
    all-reduce time the step log recorded; a TP 1 engine refuses it, naming both sizes."""
    from twinserve.cli import main

    prof = tmp_path / "tp2.json"
    common = ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "256",
              "--block-size", "4", "--num-gpu-blocks-override", "200"]
    assert main(["calibrate", "--out", str(prof), "--quick", "--repeats", "1", "--no-progress",
                 "--tensor-parallel-size", "2", *common]) == 0
    data = json.loads(prof.read_text())
    assert data["tensor_parallel_size"] == 2 and data["provenance"]["tensor_parallel_size"] == 2
    assert 0 < data["fit"]["comm_share"] < 1
    import pandas as pd

    steps = pd.read_csv(prof.with_suffix(".steps.csv"))
    comm = steps["extra"].map(lambda e: json.loads(e).get("comm_time_s", 0.0))
    assert (comm > 0).mean() > 0.9  # every step that ran the model all-reduced
    assert "all-reduce" in capsys.readouterr().out
    rc = main(["fidelity", "--profile", str(prof), "--trace", str(_trace(tmp_path / "t.csv")),
               "--out", str(tmp_path / "fid"), *common])
    err = capsys.readouterr().err
    assert rc == 2 and "tensor_parallel_size=2" in err and "tensor_parallel_size=1" in err
    assert not (tmp_path / "fid" / "fidelity.json").exists()


def test_replay_reproduces_a_core_process_schedule_exactly(make_engine) -> None:
    from twinserve.backends.real.step_log import StepLog

    engine = make_engine(num_gpu_blocks_override=40, max_num_batched_tokens=24, max_num_seqs=6,
                         engine_core_mode="process")
    try:
        cfg = _busy_workload(engine.vocab_size)
        make = lambda: Workload(cfg, 3, engine.max_model_len)  # noqa: E731
        # The core's own steps come from its step log, which must record schedules.
        with pytest.raises(TwinserveError, match="record_schedule"):
            run_real(engine, make())
        engine.set_step_log(StepLog(keep=True, record_schedule=True))
        real = run_real(engine, make())
        assert not real.interrupted and len(real.records) > 14
        assert real.num_preemptions > 0 and sum(r.prefix_hit_tokens for r in real.records) > 0
        prompts = {r.request_id: r.num_prompt_tokens for r in real.records}
        assert any(1 < n < prompts[rid] for s in real.schedules for rid, n in s.items())  # chunked
        # One entry per core step, in the core's numbering.
        assert [r.step for r in engine.step_log.records] == list(range(len(real.schedules)))
        check = replay(real, make, engine.scheduler_config)
        assert check.exact, check.first_mismatch
        assert check.num_steps_sim == check.num_steps_real == len(real.step_starts)
        # Token times: the simulator's are the core's step ends; the real ones are when the front
        # end had them (the hop back), so they differ a little, later on the real side.
        assert 0 < check.max_token_time_diff_s < 0.5
        # A request reaches the core after it arrives, never before.
        assert all(a <= s for a, s in zip(real.admit_until, real.step_starts))
        other = dataclasses.replace(engine.scheduler_config, num_blocks=64)
        assert not replay(real, make, other).exact
    finally:
        engine.shutdown()


def test_replay_admits_what_had_reached_the_core(tmp_path: Path) -> None:
    from twinserve.twin.replay import RecordingExecutor, ReplayCostModel
    from twinserve.core.engine_core import EngineCore
    from twinserve.core.sched.config import SchedulerConfig
    from twinserve.sim.world import Simulation

    # b arrived before step 0 started but reached the core only for step 1.
    trace = _trace(tmp_path / "t.csv", [(0.0, 8, 3), (0.001, 8, 2)])
    cfg = WorkloadConfig(num_requests=2, arrival="trace", trace=str(trace), prompt_dist="trace",
                         output_dist="trace", vocab_size=100)
    sched = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, num_blocks=32,
                            block_size=4)
    starts = [0.002, 0.004, 0.006, 0.008]

    def run(admit: list[float] | None) -> list[dict[str, int]]:
        ex = RecordingExecutor(ReplayCostModel([0.001] * 4))
        Simulation(EngineCore(sched, ex), ex, Workload(cfg, 0, 64), step_starts=starts, admit_until=admit).run()
        return ex.schedules

    by_start = run(None)
    by_core = run([0.0, 0.001, 0.001, 0.001])
    assert len(by_start[0]) == 2 and len(by_core[0]) == 1 and len(by_core[1]) == 2
    # Nothing had reached the core, yet the real core stepped: the replay stops, not loops.
    ex = RecordingExecutor(ReplayCostModel([0.001] * 4))
    sim = Simulation(EngineCore(sched, ex), ex, Workload(cfg, 0, 64), step_starts=starts,
                     admit_until=[-1.0] * 4)
    sim.run()
    assert sim.replay_exhausted and ex.schedules == []


def test_calibrate_and_fidelity_with_the_core_in_its_own_process(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The twin's loop over the process layout: the profile says so, fidelity runs on it (replay
    exact), and a profile made in the other layout is refused, naming both, unless overridden."""
    from twinserve.cli import main

    prof = tmp_path / "proc.json"
    common = ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "256",
              "--block-size", "4", "--num-gpu-blocks-override", "200"]
    proc = ["--engine-core-mode", "process"]
    assert main(["calibrate", "--out", str(prof), "--quick", "--repeats", "1", "--no-progress",
                 *proc, *common]) == 0
    data = json.loads(prof.read_text())
    assert data["provenance"]["engine_core_mode"] == "process"
    assert data["fit"]["num_steps"] > 20 and {"prefill", "decode", "mixed"} <= set(data["fit"]["by_kind"])
    import pandas as pd

    steps = pd.read_csv(prof.with_suffix(".steps.csv"))
    assert (steps["forward_s"] > 0).mean() > 0.9 and (steps["gap_s"] > 0).any()
    trace = str(_trace(tmp_path / "t.csv"))
    out = tmp_path / "fid"
    assert main(["fidelity", "--profile", str(prof), "--trace", trace, "--out", str(out),
                 "--max-num-batched-tokens", "128", *proc, *common]) == 0
    rep = json.loads((out / "fidelity.json").read_text())
    assert rep["engine"]["engine_core_mode"] == "process" and rep["num_requests"] == len(TRACE_ROWS)
    assert rep["replay"]["exact"], rep["replay"]["first_mismatch"]
    assert rep["steps"]["num_steps"] > 0 and all(rep["metrics"][m]["p50"]["real"] > 0 for m in ("ttft", "e2e"))
    capsys.readouterr()
    # The in-process engine refuses the process profile, and the process engine an in-process one
    # (a profile without the field was made in process: before this layout could be logged).
    rc = main(["fidelity", "--profile", str(prof), "--trace", trace, "--out", str(tmp_path / "x"), *common])
    err = capsys.readouterr().err
    assert rc == 2 and "engine_core_mode='process'" in err and "engine_core_mode='inproc'" in err
    assert "--engine-core-mode inproc" in err and not (tmp_path / "x").exists()
    from twinserve.backends.sim.fitted import FittedCostModel

    old = tmp_path / "old.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4, meta={"provenance": {"threads": 1}}).save(old)
    rc = main(["fidelity", "--profile", str(old), "--trace", trace, "--out", str(tmp_path / "y"), *proc,
               *common])
    assert rc == 2 and "engine_core_mode='inproc'" in capsys.readouterr().err
    # The override runs it anyway.
    assert main(["fidelity", "--profile", str(old), "--trace", trace, "--out", str(tmp_path / "y"),
                 "--allow-profile-mismatch", "--no-normalize-speed", *proc, *common]) == 0


def test_from_run_needs_a_recorded_run(tmp_path: Path) -> None:
    from twinserve.twin.fidelity import FidelityError, rejudge

    with pytest.raises(FidelityError, match="no fidelity.json"):
        rejudge(tmp_path, "builtin:smollm2-135m-h200-bf16", tmp_path / "out")


def test_python_dash_m_knows_the_twin_subcommands() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "twinserve.cli", "fidelity", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--band-samples" in out.stdout and "--from-run" in out.stdout


def test_repeated_runs_measure_the_real_engine_against_itself(make_engine, tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.twin.fidelity import FidelityError, rejudge

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4,
                    meta={"provenance": {"speed_probe_s": 0.05}}).save(prof)
    engine = make_engine(max_num_batched_tokens=128)  # room for the speed probe's prefill
    with pytest.raises(FidelityError, match="--repeats 0"):
        run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=0),
                     tmp_path / "bad", echo=lambda s: None)
    # Without the speed probe between them (it empties the prefix cache), the second run must
    # still start cold: its prompts are the first run's, and hits the replay cannot see would
    # break it.
    bare = run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=2,
                                                normalize_speed=False),
                        tmp_path / "bare", echo=lambda s: None, band_samples=0)
    assert [x["replay"]["exact"] for x in bare["repeats"]["runs"]] == [True, True]
    hits = [pd.read_csv(d / "requests_real.csv")["prefix_hit_tokens"].sum()
            for d in (tmp_path / "bare", tmp_path / "bare" / "repeat-2")]
    assert hits[0] == hits[1]
    out = tmp_path / "out"
    rep = run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=2),
                       out, echo=lambda s: None, band_samples=0)
    engine.shutdown()
    r = rep["repeats"]
    assert r["count"] == 2 and [x["dir"] for x in r["runs"]] == [".", "repeat-2"]
    # Both runs served the same requests from a cold prefix cache: the second run's prompts were
    # cached by the first, and a warm start would hit them where its replay cannot.
    first, second = (pd.read_csv(d / "requests_real.csv").sort_values("request_id")
                     for d in (out, out / "repeat-2"))
    assert first["arrival_s"].tolist() == second["arrival_s"].tolist()
    assert first["output_tokens"].tolist() == second["output_tokens"].tolist()
    assert first["prefix_hit_tokens"].sum() == second["prefix_hit_tokens"].sum()
    assert all(x["replay"]["exact"] for x in r["runs"])
    # The probe after the first run is the one before the second. Both runs are judged at the
    # mean of the call's three probes; each keeps the ratio of its own two under "adjacent".
    s1, s2 = (x["speed"] for x in r["runs"])
    assert s2["probe_before_s"] == s1["probe_after_s"] and s1["normalized"] and s2["normalized"]
    three = (s1["probe_before_s"], s1["probe_after_s"], s2["probe_after_s"])
    for sp in (s1, s2):
        assert sp["probes_pooled"] == 3
        assert sp["machine_speed_ratio"] == pytest.approx(sum(three) / 3 / 0.05)
        assert sp["adjacent"]["machine_speed_ratio"] == pytest.approx(
            (sp["probe_before_s"] + sp["probe_after_s"]) / 2 / 0.05)
    md = (out / "fidelity.md").read_text()
    assert "the mean of the call's 3 probes" in md and "judged at the mean of the call's 3 probes" in md

    def e2e(df):
        return (df["finish_s"] - df["arrival_s"]).to_numpy()

    # Real against real, from the recorded requests.
    for q in (50, 99):
        want = np.percentile(e2e(second), q) / np.percentile(e2e(first), q) - 1
        assert r["real_vs_first"][0]["err"]["e2e"][f"p{q}"] == pytest.approx(want)
        assert r["real_spread"]["e2e"][f"p{q}"] == pytest.approx(abs(want))
    # Pooled: every request of both runs against its prediction at its own run's speed.
    sims = [pd.read_csv(d / "requests_sim.csv") for d in (out, out / "repeat-2")]
    cell = r["pooled"]["metrics"]["e2e"]["p50"]
    assert cell["real"] == pytest.approx(np.percentile(np.concatenate([e2e(first), e2e(second)]), 50))
    assert cell["sim"] == pytest.approx(np.percentile(np.concatenate([e2e(s) for s in sims]), 50))
    assert r["runs"][0]["err"]["e2e"]["p50"] == rep["metrics"]["e2e"]["p50"]["err"]
    assert "real run 2 vs run 1" in (out / "fidelity.md").read_text()
    # Judged again from the recording: the same repeats, no engine.
    again = rejudge(out, str(prof), tmp_path / "again", echo=lambda s: None, band_samples=0)
    # Judged with another profile (made on a machine half as fast: its probe took twice as
    # long), each run's speed is measured against that profile's probe, not the recorded ratio.
    slow = tmp_path / "slow.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4, meta={"provenance": {"speed_probe_s": 0.1}}).save(slow)
    other = rejudge(out, str(slow), tmp_path / "other", echo=lambda s: None, band_samples=0)
    for was, now in zip(r["runs"], other["repeats"]["runs"], strict=True):
        assert now["speed"]["machine_speed_ratio"] == pytest.approx(was["speed"]["machine_speed_ratio"] / 2)
        assert 1 + now["busy_err"] == pytest.approx((1 + was["busy_err"]) / 2)
    # At each run's own mean speed (step prices scaled so the run's steps cost what they
    # measured in sum), an overall price level no longer matters: a profile half as fast is
    # judged the same, and the scale that matched makes the busy-time error zero.
    from twinserve.backends.real.step_log import read_step_log
    from twinserve.twin.steps import step_errors

    for a, b in zip(again["repeats"]["runs"], other["repeats"]["runs"], strict=True):
        assert a["speed_matched_scale"] == pytest.approx(b["speed_matched_scale"], rel=1e-9)
    for run, d in zip(again["repeats"]["runs"], (out, out / "repeat-2"), strict=True):
        matched = dataclasses.replace(FittedCostModel.load(prof), time_scale=run["speed_matched_scale"])
        assert step_errors(matched, read_step_log(d / "steps_real.csv"))["busy_err"] == pytest.approx(0, abs=1e-9)
        assert run["speed_matched_scale"] == pytest.approx(
            run["speed"]["machine_speed_ratio"] / (1 + run["busy_err"]))
    pm_a, pm_b = (x["repeats"]["pooled_speed_matched"]["metrics"] for x in (again, other))
    for m in ("ttft", "tpot", "e2e"):
        for q in ("p50", "p99"):
            assert pm_a[m][q]["err"] == pytest.approx(pm_b[m][q]["err"], abs=1e-9)
    tm = again["targets_speed_matched"]
    assert tm["judged_on"].endswith("each run at its own mean speed, not a prediction")
    assert tm["cells"]["e2e"]["p50"]["err"] == pm_a["e2e"]["p50"]["err"]
    assert "what the step shapes leave" in (tmp_path / "again" / "fidelity.md").read_text()
    # A profile that recorded no probe cannot be scaled: judged at its own speed.
    bare_prof = tmp_path / "bare.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(bare_prof)
    unscaled = rejudge(out, str(bare_prof), tmp_path / "unscaled", echo=lambda s: None, band_samples=0)
    assert not unscaled["speed"]["normalized"] and "machine_speed_ratio" not in unscaled["speed"]
    assert unscaled["metrics"] == unscaled["metrics_raw"]
    assert again["repeats"]["pooled"] == r["pooled"]
    assert again["repeats"]["real_vs_first"] == r["real_vs_first"]
    # The targets are judged on the runs pooled, each cell beside the real runs' own spread.
    t = rep["targets"]
    assert t["judged_on"] == "pooled over 2 real runs" and again["targets"] == t
    cell = t["cells"]["e2e"]["p99"]
    assert cell["err"] == r["pooled"]["metrics"]["e2e"]["p99"]["err"]
    assert cell["within_real_spread"] == (abs(cell["err"]) <= r["real_spread"]["e2e"]["p99"])
    assert t["within_real_spread"] == sum(c["within_real_spread"] for per in t["cells"].values()
                                          for c in per.values())
    assert (tmp_path / "again" / "repeat-2" / "requests_sim.csv").exists()
