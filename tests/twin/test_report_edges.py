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


def test_the_probe_spread_bound_is_the_one_calibrate_warns_at() -> None:
    """Issue 53 item 22 (bounds declared once): probes 17% apart made calibrate warn (over 15%) while the
    fidelity banner, bounded at 20%, said nothing of the same profile."""
    from twinserve.twin.calibrate import drift_warning
    from twinserve.twin.report import profile_validity

    prov = {"speed_probe_drift": 0.17, "speed_probes": [[0.0, 1.0], [50.0, 1.17]]}
    assert drift_warning(prov) is not None
    lines = profile_validity({"provenance": prov, "fit": {"mape": 0.05}}, 1.0)
    assert len(lines) == 2 and "speed probes were 17% apart (over 15%)" in lines[1]
    # Within both: neither warns.
    prov = {"speed_probe_drift": 0.12, "speed_probes": [[0.0, 1.0], [50.0, 1.12]]}
    assert drift_warning(prov) is None and len(profile_validity({"provenance": prov}, 1.0)) == 1


def test_a_profile_calibrated_at_the_noisy_share_is_warned_as_calibrate_warns() -> None:
    """One bound, one comparison: hostload.warning calls a share at NOISY_SHARE noisy, so the banner does too."""
    from twinserve.backends.real.hostload import NOISY_SHARE, warning
    from twinserve.twin.report import profile_validity

    host = {"other_share": NOISY_SHARE, "steal_share": 0.0, "cpus": [1]}
    assert warning(host, "calibrate") is not None
    lines = profile_validity({"provenance": {"host_load": host}, "fit": {"mape": 0.05}}, 1.0)
    assert len(lines) == 2 and "other load" in lines[1]


def _one_token_cells() -> dict:
    from twinserve.twin.verdict import judge

    pct = lambda v: {"p50": v, "p90": v, "p99": v}  # noqa: E731
    fc = {"ttft": pct(0.010), "tpot": pct(None), "itl": pct(None), "e2e": pct(0.010)}
    runs = [{"ttft": pct(x), "tpot": pct(None), "itl": pct(None), "e2e": pct(x)} for x in (0.0100, 0.0101, 0.0099)]
    return judge(fc, runs, 3)


def test_an_undefined_metric_is_n_a_everywhere_and_its_exclusion_is_said_once() -> None:
    """Issue 53 item 21: TPOT/ITL of one-token outputs are n/a (never "nan%") in every printed line, and
    one line says they are left out of the verdict and why."""
    from twinserve.twin.report import excluded_line, forecast_table, free_running_line, verdict_table

    v = _one_token_cells()
    assert v["summary"]["cells"] == 4  # TTFT and E2E at p50/p90 (p99: 3 requests)
    line = excluded_line(v["cells"])
    assert line == ("not judged: TPOT, ITL (n/a: every output is one token, so there is no time between "
                    "tokens); the verdict counts the other metrics' cells")
    assert "| TPOT | n/a | n/a | n/a |" in forecast_table({"tpot": {"p50": None, "p90": None, "p99": None}},
                                                             "forecast")
    table = verdict_table(v["cells"])
    assert "| TPOT | p50 | n/a | n/a / n/a / n/a |" in table
    nan = float("nan")
    fr = {"steps_by_measured_shape": 3, "steps_by_kind_ratio": 0,
          "schedule_drift": {"ttft": {"p50": 0.1}, "tpot": {"p50": nan}},
          "step_pricing": {"ttft": {"p50": -0.2}, "tpot": {"p50": None}}}
    text = free_running_line(fr)
    assert "nan" not in text and "TPOT n/a" in text and "TTFT +10.0%" in text
    # Nothing undefined: no such line.
    from twinserve.twin.verdict import judge

    pct = lambda v: {"p50": v, "p90": v, "p99": v}  # noqa: E731
    ok = judge({m: pct(0.01) for m in ("ttft", "tpot")}, [{m: pct(0.01) for m in ("ttft", "tpot")}] * 2, 3,
               metrics=("ttft", "tpot"))
    assert excluded_line(ok["cells"]) is None


def test_the_nowcast_line_says_n_a_for_an_undefined_metric() -> None:
    from twinserve.twin.report import nowcast_line

    text = nowcast_line([{"err_p50": {"ttft": 0.05, "tpot": float("nan"), "itl": None}}])
    assert "nan" not in text and "TTFT +5.0%, TPOT n/a, ITL n/a" in text


def test_bench_and_fidelity_resolve_builtin_traces_with_simulates_resolver() -> None:
    """Issue 53 item 25 (share the resolver): bench sent `--trace builtin:nope` on as a file path; both
    now refuse it with the simulator's own message, and resolve a known name to the same file."""
    import argparse

    from twinserve.backends.real.serving.flags import add_bench_args
    from twinserve.bench.cli import workload_config
    from twinserve.core.errors import InvalidConfigError
    from twinserve.sim.trace_paths import UnknownBuiltinTrace, trace_path
    from twinserve.twin.preflight import FidelityError
    from twinserve.twin.workload import trace_path as fidelity_trace_path

    with pytest.raises(UnknownBuiltinTrace) as e:
        trace_path("builtin:nope")
    shared = str(e.value)
    p = argparse.ArgumentParser()
    add_bench_args(p)
    ns = p.parse_args(["--dataset-name", "trace", "--trace", "builtin:nope"])
    with pytest.raises(InvalidConfigError, match="trace") as b:
        workload_config(ns, 1000)
    with pytest.raises(FidelityError) as f:
        fidelity_trace_path("builtin:nope")
    assert shared in str(b.value) and shared in str(f.value)
    ns = p.parse_args(["--dataset-name", "trace", "--trace", "builtin:azure_conv"])
    assert workload_config(ns, 1000).trace == trace_path("builtin:azure_conv") == \
        fidelity_trace_path("builtin:azure_conv")
