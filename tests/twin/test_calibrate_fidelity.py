"""The twin's loop on a real (tiny) engine: the schedule on the real step times must be the real
one exactly; calibrate and fidelity produce what they promise; bad inputs are clear errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from twinserve.backends.real.step_log import read_step_log
from twinserve.twin.realrun import run_real
from twinserve.twin.schedule import schedule_equivalence
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


def test_the_schedule_on_the_real_step_times_is_the_real_one(make_engine) -> None:
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
    check = schedule_equivalence(real, make, engine.scheduler_config)
    assert check.equivalent, check.first_mismatch
    assert check.num_steps_sim == check.num_steps_real == len(real.step_starts)
    assert check.max_token_time_diff_s < 1e-9
    # The check can fail: a simulator with a different KV pool schedules differently.
    other = dataclasses.replace(engine.scheduler_config, num_blocks=64)
    assert not schedule_equivalence(real, make, other).equivalent
    engine.shutdown()


def test_calibrate_and_fidelity_end_to_end(tiny_model: Path, tmp_path: Path, capsys, experiment) -> None:
    from twinserve.cli import main

    prof = tmp_path / "tiny.json"
    common = ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "256",
              "--block-size", "4", "--num-gpu-blocks-override", "200"]
    assert main(["calibrate", "--out", str(prof), "--quick", "--repeats", "1", "--no-progress",
                 "--max-context", "100", "--probe-every", "5", *common]) == 0
    data = json.loads(prof.read_text())
    # The quick design's decodes reach 1.5 x 24 + 3 tokens of context; --max-context adds decode
    # contexts, each reaching about twice the last, up to one whose spread reaches 100 (65 on average).
    assert data["provenance"]["design"]["decode_contexts"] == [8, 24, 50, 65]
    assert data["fit"]["range"]["decode_context_per_seq"] >= 65
    assert data["format"] == "twinserve-step-profile/4"
    assert data["provenance"]["threads"] == 1 and data["provenance"]["dtype"] == "float64"
    import torch

    from twinserve.backends.real.hardware import cpu_features, device_name

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
    from twinserve.twin.calfit import split_wake

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
    assert data["provenance"]["drift_source"] == "probes"
    out = tmp_path / "fid"
    rc = main(["fidelity", "--profile", str(prof), "--trace", str(_trace(tmp_path / "t.csv")),
               "--out", str(out), "--max-num-batched-tokens", "128", "--repeats", "2", *common])
    assert rc == 0
    rep = json.loads((out / "fidelity.json").read_text())
    for m in ("ttft", "tpot", "itl", "e2e"):
        for p in ("p50", "p90", "p99"):
            cell = rep["metrics"][m][p]
            assert cell["real"] > 0 and cell["sim"] > 0
            assert cell["err"] == pytest.approx((cell["sim"] - cell["real"]) / cell["real"])
            assert cell["verdict"]["real"] and cell["verdict"]["forecast"] == cell["sim"]
    assert rep["num_requests"] == len(TRACE_ROWS) and rep["profile"] == str(prof)
    assert rep["engine"]["hardware"] == data["hardware"] and rep["engine"]["cpu"] == cpu_features()
    assert set(rep["throughput"]) == {"output_tok_s", "request_s"}
    assert rep["schedule"]["equivalent"] and rep["steps"]["num_steps"] > 0
    # How much of the run the profile priced beyond the shapes it was fitted on.
    beyond = rep["steps"]["beyond_range"]
    assert 0.0 <= beyond["steps_share"] <= 1.0 and 0.0 <= beyond["busy_share"] <= 1.0
    assert all(d["max_seen"] > d["max_fitted"] == top[name] for name, d in beyond["dims"].items())
    # The forecast was priced at the machine's speed probed before the runs, against calibration's.
    fc = json.loads((out / "forecast.json").read_text())
    assert fc["kind"] == "forecast, probed before"
    assert fc["speed"]["ratio"] == pytest.approx(fc["speed"]["probe_before_s"] / data["provenance"]["speed_probe_s"])
    assert (out / "fidelity.md").exists() and (out / "repeat-2" / "requests_real.csv").exists()
    # Arrivals are the trace's own timestamps; outputs are forced to the trace's lengths.
    import pandas as pd

    real = pd.read_csv(out / "requests_real.csv").sort_values("arrival_s")
    assert real["arrival_s"].tolist() == pytest.approx([a for a, _, _ in TRACE_ROWS])
    assert real["output_tokens"].tolist() == [d for _, _, d in TRACE_ROWS]
    # A profile refitted from its own step log by the same fit is the same profile: probes and
    # step times are stored unrounded, so only float reassociation may differ. (Probe times
    # rounded to 1 us once moved a coefficient by 5e-5 under a 25% speed drift.)
    refit = tmp_path / "refit.json"
    calibrations = experiment("calibrations")
    assert calibrations.main(["refit", str(prof), "--out", str(refit)]) == 0
    r = json.loads(refit.read_text())
    assert r["coefficients"] == pytest.approx(data["coefficients"], rel=1e-12, abs=1e-18)
    assert r["overhead_coefficients"] == pytest.approx(data["overhead_coefficients"], rel=1e-12, abs=1e-18)
    assert r["provenance"]["refit"]["step_log"] == "tiny.steps.csv"
    got, made = (dict(p, refit=None) for p in (r["provenance"], data["provenance"]))
    assert got == made
    # Refitted again, the earlier refit's note is kept under the new one.
    refit2 = tmp_path / "refit2.json"
    assert calibrations.main(["refit", str(refit), "--steps", str(prof.with_suffix(".steps.csv")),
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
    assert main(["fidelity", "--profile", str(ok), "--trace", str(long_trace), "--repeats", "1", "--max-prompt-tokens",
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

    # A profile from before product paths were recorded: up to 4 rows transposed, the rest sgemm.
    path = "sgemm"
    prov = {"device": "cpu", "dtype": "float32", "engine": {"small_batch_weights": True, "small_batch_rows": 4,
                                                            "fp32_product_path": path}}
    prof = tmp_path / "rows4.json"
    FittedCostModel(intercept_s=0.002, meta={"provenance": prov}).save(prof)
    common = ["--model", str(tiny_model), "--dtype", "float32", "--max-model-len", "64",
              "--trace", str(_trace(tmp_path / "t.csv")), "--profile", str(prof), "--cpu-product-paths", "linear"]
    assert main(["fidelity", *common, "--small-batch-rows", "8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "projections of 5-8 rows: profile 'linear', engine 'transposed'" in err
    assert not (tmp_path / "o").exists()
    # The engine with the profile's limit runs it, and records its own limit with the run.
    assert main(["fidelity", *common, "--small-batch-rows", "4", "--no-probe", "--repeats", "1",
                 "--out", str(tmp_path / "ok")]) == 0
    engine = json.loads((tmp_path / "ok" / "fidelity.json").read_text())["engine"]
    assert engine["small_batch_rows"] == 4
    # The run records each row count's product path (what a profile made from it is held to).
    assert engine["cpu_product_paths"]["projections"] == ["transposed"] * 4 + ["linear"] * 13

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


def test_calibration_probes_between_points_and_corrects_by_them(make_engine) -> None:
    """The probe runs before, after and every PROBE_EVERY design points; the steps are corrected by them."""
    from dataclasses import replace

    from twinserve.twin.calfit import calibrate
    from twinserve.twin.calibrate import PROBE_EVERY, CalibrationDesign

    engine = make_engine(max_num_batched_tokens=128, max_num_seqs=8, max_model_len=256)
    quick = replace(CalibrationDesign.quick(), probe_every=PROBE_EVERY, idle_gaps=[])
    probed, _ = calibrate(engine, quick, progress=False)
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
    from twinserve.twin.calibrate import speed_probe_parts

    engine = make_engine(max_num_batched_tokens=256)
    first, second = speed_probe_parts(engine).total, speed_probe_parts(engine).total
    assert first > 0 and second > 0
    assert engine.core.scheduler.kv.stats.hits == 0
    assert speed_probe_parts(make_engine(max_num_batched_tokens=64)) is None  # shapes do not fit one step
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


def test_the_schedule_of_a_core_process_on_its_step_times_is_the_real_one(make_engine) -> None:
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
        check = schedule_equivalence(real, make, engine.scheduler_config)
        assert check.equivalent, check.first_mismatch
        assert check.num_steps_sim == check.num_steps_real == len(real.step_starts)
        # Token times: the simulator's are the core's step ends; the real ones are when the front
        # end had them (the hop back), so they differ a little, later on the real side.
        assert 0 < check.max_token_time_diff_s < 0.5
        # A request reaches the core after it arrives, never before.
        assert all(a <= s for a, s in zip(real.admit_until, real.step_starts))
        other = dataclasses.replace(engine.scheduler_config, num_blocks=64)
        assert not schedule_equivalence(real, make, other).equivalent
    finally:
        engine.shutdown()


def test_replay_admits_what_had_reached_the_core(tmp_path: Path) -> None:
    from twinserve.twin.schedule import RecordingExecutor, ReplayCostModel
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
    # Two requests sent at one time reach the core one by one: a step may start between them
    # (the closed-loop clients freed by one step's finishes), and the count says which it had.
    tied = _trace(tmp_path / "tied.csv", [(0.001, 8, 3), (0.001, 8, 2)])
    tcfg = dataclasses.replace(cfg, trace=str(tied))
    ex = RecordingExecutor(ReplayCostModel([0.001] * 4))
    Simulation(EngineCore(sched, ex), ex, Workload(tcfg, 0, 64), step_starts=starts,
               admit_until=[0.001] * 4, admit_count=[1, 2, 2, 2]).run()
    assert len(ex.schedules[0]) == 1 and len(ex.schedules[1]) == 2


def test_calibrate_and_fidelity_with_the_core_in_its_own_process(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The twin's loop over the process layout: the profile says so, fidelity runs on it (the schedule
    equivalent), and a profile made in the other layout is refused, naming both, unless overridden."""
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
    assert main(["fidelity", "--profile", str(prof), "--trace", trace, "--out", str(out), "--repeats", "1",
                 "--max-num-batched-tokens", "128", *proc, *common]) == 0
    rep = json.loads((out / "fidelity.json").read_text())
    assert rep["engine"]["engine_core_mode"] == "process" and rep["num_requests"] == len(TRACE_ROWS)
    assert rep["schedule"]["equivalent"], rep["schedule"]["first_mismatch"]
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
                 "--allow-profile-mismatch", "--no-probe", "--repeats", "1", *proc, *common]) == 0


def test_python_dash_m_knows_the_twin_subcommands() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "twinserve.cli", "fidelity", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--repeats" in out.stdout and "--calibrate" in out.stdout and "--nowcast" in out.stdout
