"""The twin's report on edge-case workloads: what cannot be measured is said, everything else written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .test_calibrate_fidelity import _trace


def test_one_token_outputs_report_tpot_undefined_and_write_the_rest(tiny_model: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every output one token: TPOT and ITL have no value on either side; fidelity still writes its files."""
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.cli import main

    prof = tmp_path / "ok.json"
    FittedCostModel(intercept_s=0.002).save(prof)
    trace = _trace(tmp_path / "one.csv", [(0.0, 10, 1), (0.01, 20, 1), (0.02, 8, 1)])
    out = tmp_path / "o"
    assert main(["fidelity", "--profile", str(prof), "--trace", str(trace), "--repeats", "2", "--no-probe",
                 "--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "64",
                 "--out", str(out)]) == 0
    text = (out / "fidelity.json").read_text()
    rep = json.loads(text, parse_constant=lambda c: pytest.fail(f"fidelity.json holds {c}: not JSON"))
    for m in ("tpot", "itl"):
        cell = rep["metrics"][m]["p50"]
        assert cell["verdict"]["state"] == "no verdict" and "one token" in cell["verdict"]["why"]
        assert cell["sim"] is None and cell["real"] is None
    # TTFT and E2E are measured and judged as usual.
    for m in ("ttft", "e2e"):
        cell = rep["metrics"][m]["p50"]
        assert cell["real"] > 0 and cell["sim"] > 0 and cell["verdict"]["state"] != "no verdict"
    md = (out / "fidelity.md").read_text()
    assert "TPOT undefined" in md
    assert math.isfinite(rep["summary"]["cells"]) and (out / "requests_real.csv").exists()


def test_fidelity_takes_the_builtin_trace_as_simulate_and_bench_do(tiny_model: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 53 item 25: `--trace builtin:azure_conv` serves the bundled excerpt; an unknown name is refused."""
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.cli import main

    prof = tmp_path / "ok.json"
    FittedCostModel(intercept_s=0.002).save(prof)
    common = ["--profile", str(prof), "--model", str(tiny_model), "--dtype", "float64", "--max-model-len", "64",
              "--num-requests", "3", "--rate", "50", "--max-prompt-tokens", "16", "--max-output-tokens", "3"]
    out = tmp_path / "o"
    assert main(["fidelity", "--trace", "builtin:azure_conv", *common, "--repeats", "1", "--no-probe",
                 "--out", str(out)]) == 0
    assert json.loads((out / "forecast.json").read_text())["num_requests"] == 3
    assert main(["fidelity", "--trace", "builtin:nope", *common, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "builtin:nope" in err and "builtin:azure_conv" in err


def test_the_banner_gives_the_profiles_validity_and_warns_out_of_bounds() -> None:
    """Issue 53 item 22: the profile of the report (88% load, probes 293% apart, MAPE 33%) is warned of."""
    from twinserve.twin.report import banner, profile_validity

    bad = {"provenance": {"host_load": {"other_share": 0.80, "steal_share": 0.08},
                          "speed_probes": [[0.0, 1.0], [100.0, 3.93]]}, "fit": {"mape": 0.33}}
    lines = profile_validity(bad, 2.9)
    assert lines[0].startswith("profile: calibrated under 88% other load, speed probes 293% apart, fit error "
                               "(MAPE) 33%; probe ratio 2.900")
    warned = "\n".join(lines[1:])
    assert len(lines) == 5 and all(w in warned for w in ("88% other load", "293% apart", "fit error is 33%",
                                                         "probe ratio 2.90 is outside [0.8, 1.25]"))
    good = {"provenance": {"host_load": {"other_share": 0.01, "steal_share": 0.0},
                           "speed_probes": [[0.0, 1.0], [100.0, 1.05]]}, "fit": {"mape": 0.08}}
    assert profile_validity(good, 1.02) == ["profile: calibrated under 1% other load, speed probes 5% apart, fit "
                                            "error (MAPE) 8%; probe ratio 1.020 (every step price is scaled by it)"]
    assert "not recorded" in profile_validity({}, None)[0] and "not taken" in profile_validity({}, None)[0]
    assert lines[1] in banner([], [], 400, 3, "forecast", lines)
