"""`twinserve fidelity` on a tiny engine: refusals before any weights load, the forecast written
before the first request and independent of the runs, Ctrl-C, and the two schedule checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from twinserve.backends.sim.fitted import FittedCostModel

ROWS = [(0.0, 30, 6), (0.01, 12, 9), (0.02, 44, 4), (0.05, 20, 7), (0.06, 9, 12),
        (0.07, 33, 5), (0.09, 16, 8), (0.12, 25, 6), (0.13, 40, 3), (0.2, 11, 10)]


def _trace(path: Path, rows=ROWS) -> Path:
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{a},{p},{d}\n" for a, p, d in rows))
    return path


def _common(tiny_model: Path, tmp_path: Path) -> list[str]:
    return ["--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "128", "--block-size", "4",
            "--num-gpu-blocks-override", "200", "--trace", str(_trace(tmp_path / "t.csv"))]


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the model raises: what runs must run before any weights load."""
    from twinserve.backends.real.models import llama

    def refuse(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(llama.LlamaForCausalLM, "__init__", refuse)


def test_a_mismatched_profile_is_refused_before_the_model_is_built(tiny_model, tmp_path, capsys, no_model) -> None:
    from twinserve.cli import main

    elsewhere = tmp_path / "elsewhere.json"
    FittedCostModel(intercept_s=0.01, meta={"hardware": "cpu: Some Other CPU", "tensor_parallel_size": 1,
                                            "provenance": {"dtype": "float64", "device": "cpu"}}).save(elsewhere)
    out = tmp_path / "o"
    assert main(["fidelity", "--profile", str(elsewhere), "--out", str(out), *_common(tiny_model, tmp_path)]) == 2
    err = capsys.readouterr().err
    # Both sides named, and the one command that makes the right profile.
    assert "'cpu: Some Other CPU'" in err and "engine:  " in err and "profile: " in err
    assert "twinserve calibrate --out P.json" in err and "fidelity --calibrate" in err
    assert not out.exists()
    for model_meta, want in (({"model": "Llama-2-7B"}, "Llama-2-7B"),
                             ({"provenance": {"dtype": "bfloat16"}}, "bfloat16"),
                             ({"tensor_parallel_size": 2}, "tensor_parallel_size=2")):
        other = tmp_path / "other.json"
        FittedCostModel(intercept_s=0.01, meta=model_meta).save(other)
        assert main(["fidelity", "--profile", str(other), "--out", str(out), *_common(tiny_model, tmp_path)]) == 2
        assert want in capsys.readouterr().err and not out.exists()


def test_bad_input_is_refused_before_the_model_is_built(tiny_model, tmp_path, capsys, no_model) -> None:
    from twinserve.cli import main

    ok = tmp_path / "ok.json"
    FittedCostModel(intercept_s=0.002).save(ok)
    common = ["--profile", str(ok), "--out", str(tmp_path / "o"), *_common(tiny_model, tmp_path)]
    for flags, want in ((["--repeats", "0"], "--repeats 0"), (["--rate", "-1"], "--rate -1"),
                        (["--num-requests", "0"], "--num-requests 0")):
        assert main(["fidelity", *flags, *common]) == 2
        assert want in capsys.readouterr().err
    long_trace = _trace(tmp_path / "long.csv", [(0.0, 10, 4), (0.1, 100, 60)])
    assert main(["fidelity", *common, "--trace", str(long_trace)]) == 2
    err = capsys.readouterr().err
    assert "long.csv:3" in err and "--max-prompt-tokens" in err
    assert main(["fidelity", "--out", str(tmp_path / "o"), *_common(tiny_model, tmp_path)]) == 2
    assert "--calibrate" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_forecast_is_written_before_the_first_request(make_engine, tmp_path, monkeypatch) -> None:
    import time

    from twinserve.twin.fidelity import run_fidelity
    from twinserve.twin.workload import FidelityOptions

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4, meta={"provenance": {"speed_probe_s": 0.05}}).save(prof)
    engine = make_engine(max_num_batched_tokens=128)
    out = tmp_path / "out"
    seen: dict[str, float] = {}
    add = engine.add_request

    def first_request(request_id, *a, **k):
        if not request_id.startswith(("fidelity-warm-up", "cal-")) and "t" not in seen:
            seen["t"] = time.time()
            seen["ok"] = json.loads((out / "forecast.json").read_text())["num_requests"]
        return add(request_id, *a, **k)

    monkeypatch.setattr(engine, "add_request", first_request)
    rep = run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=2,
                                               nowcast=True), out, echo=lambda s: None)
    engine.shutdown()
    assert seen["ok"] == len(ROWS) and os.path.getmtime(out / "forecast.json") <= seen["t"]
    fc = json.loads((out / "forecast.json").read_text())
    assert fc["kind"] == "forecast, probed before" and fc["speed"]["probe_before_s"] > 0
    assert len(fc["requests"]) == len(ROWS) and len(fc["workload"]["sha256"]) == 64
    assert fc["engine"]["num_blocks"] == 256 and fc["workload"]["seed"] == 0
    # fidelity.json keeps its shape (metrics -> p50 -> real/sim/err) and adds a verdict per cell.
    cell = rep["metrics"]["e2e"]["p50"]
    assert cell["sim"] == pytest.approx(fc["percentiles"]["e2e"]["p50"], rel=1e-6)
    assert cell["verdict"]["state"] in ("PASS", "FAIL", "UNRESOLVED") and len(cell["verdict"]["real"]) == 2
    assert set(rep["summary"]) == {"pass", "fail", "unresolved", "cells"} and rep["summary"]["cells"] == 8
    md = (out / "fidelity.md").read_text()
    assert md.startswith("VALIDITY: ") and "VALIDITY: 10 requests: p99" in md and "| E2E | p50 |" in md
    assert all(r["schedule"]["equivalent"] for r in rep["repeats"]["runs"])
    # The nowcast (each run at its own speed) is reported apart and never judged.
    assert len(rep["nowcast"]) == 2 and "nowcast (uses the run's own speed), never judged" in md
    assert all(rep["metrics"][m][q]["verdict"]["forecast"] == pytest.approx(fc["percentiles"][m][q], rel=1e-6)
               for m in ("ttft", "e2e") for q in ("p50", "p90"))
    fr = rep["free_running"]
    assert fr["steps_by_measured_shape"] > 0 and set(fr["schedule_drift"]) == {"ttft", "tpot", "itl", "e2e"}


def test_the_forecast_does_not_depend_on_the_runs(tiny_model, tmp_path) -> None:
    from twinserve.cli import main

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(prof)
    common = ["--profile", str(prof), "--no-probe", *_common(tiny_model, tmp_path)]
    assert main(["fidelity", *common, "--out", str(tmp_path / "a"), "--forecast-only"]) == 0
    assert not (tmp_path / "a" / "fidelity.json").exists()
    assert main(["fidelity", *common, "--out", str(tmp_path / "b"), "--repeats", "2"]) == 0
    assert (tmp_path / "b" / "fidelity.json").exists()
    a, b = ((tmp_path / d / "forecast.json").read_bytes() for d in "ab")
    assert a == b and json.loads(a)["kind"] == "forecast, at the profile's own speed"


def test_ctrl_c_during_a_repeat_judges_the_runs_done(make_engine, tmp_path, monkeypatch) -> None:
    import twinserve.twin.fidelity as fid

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(prof)
    engine = make_engine()
    serve, calls = fid.run_real, {"runs": 0, "steps": 0}

    def run_real(eng, workload):
        """The second run's fifth step is a Ctrl-C."""
        calls["runs"] += 1
        if calls["runs"] == 2:
            step = eng.step

            def cut():
                calls["steps"] += 1
                if calls["steps"] == 5:
                    raise KeyboardInterrupt
                return step()

            eng.step = cut
        return serve(eng, workload)

    monkeypatch.setattr(fid, "run_real", run_real)
    opts = fid.FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=3, probe=False)
    rep = fid.run_fidelity(engine, opts, tmp_path / "out", echo=lambda s: None)
    assert rep["interrupted"] and fid.exit_code(rep) == 130 and calls["runs"] == 2
    assert not engine.has_unfinished_requests()
    saved = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert saved["repeats"]["count"] == 1 and saved["metrics"]["e2e"]["p50"]["verdict"]["runs"] == 1
    engine.shutdown()

def test_fidelity_calibrate_makes_the_profile_first_and_forecasts_with_it(tiny_model, tmp_path) -> None:
    from twinserve.cli import main

    out = tmp_path / "run"
    assert main(["fidelity", "--calibrate", "--repeats", "1", "--out", str(out), *_common(tiny_model, tmp_path)]) == 0
    made = json.loads((out / "profile.json").read_text())
    assert made["provenance"]["made_by"] == "twinserve calibrate" and (out / "profile.steps.csv").exists()
    fc = json.loads((out / "forecast.json").read_text())
    assert fc["profile"]["path"] == str(out / "profile.json")
    # A 128-token context cannot run the probe's shapes: the forecast says it is unprobed.
    assert fc["kind"] == "forecast, at the profile's own speed"


def test_free_running_prices_a_seen_shape_at_its_measured_median_and_an_unseen_one_by_its_kind() -> None:
    from twinserve.backends.sim.fitted import FEATURE_COLUMNS
    from twinserve.twin.schedule import ShapeCostModel

    prof = FittedCostModel(intercept_s=0.01, per_decode_seq_s=0.001)
    decode = dict(zip(FEATURE_COLUMNS, (0, 0, 0, 0.0, 4, 400)))
    rows = [dict(decode, start_s=float(i), step_time_s=t) for i, t in enumerate((0.02, 0.03, 0.1))]
    cm = ShapeCostModel(rows, prof)
    assert cm.step_time(0, 0, 0, 0.0, 4, 400) == pytest.approx(0.03)  # the median, not by position
    # A decode shape no real step had: the profile's price x the decodes' median measured / priced.
    ratio = 0.03 / prof.step_time(0, 0, 0, 0.0, 4, 400)
    assert cm.step_time(0, 0, 0, 0.0, 8, 800) == pytest.approx(prof.step_time(0, 0, 0, 0.0, 8, 800) * ratio)
    assert (cm.priced, cm.missed) == (1, 1)
