"""The twin with speculative decoding: calibrate's verify steps and their term, the simulator's price
of a verify step, and `twinserve fidelity` forecasting with an earlier run's acceptance."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.sim.fitted import FittedCostModel

from .test_forecast import no_model  # noqa: F401 - the fixture: building the model raises

SPEC = {"method": "ngram", "num_speculative_tokens": 3}


def _always_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """k drafts every step, as SmolLM2's n-grams find them even in random prompts (it copies them); a
    random-weight model copies nothing."""
    from twinserve.backends.real.spec.ngram import NgramProposer

    monkeypatch.setattr(NgramProposer, "propose", lambda self, ids: [int(ids[-1])] * self.k)


def test_calibrate_logs_verify_steps_and_fits_their_term(make_engine, monkeypatch) -> None:
    from twinserve.twin.calfit import calibrate
    from twinserve.twin.calibrate import CalibrationDesign

    _always_draft(monkeypatch)

    engine = make_engine(max_num_batched_tokens=256, max_num_seqs=16, speculative_config=SPEC)
    try:
        profile, log = calibrate(engine, CalibrationDesign.quick(), progress=False)
    finally:
        engine.shutdown()
    rows = log.rows()
    verify = [r for r in rows if r["num_draft_tokens"]]
    # Every quick verify point ran: batches 1, 2 and 4 each verified drafts for the whole batch.
    assert {1, 2, 4} <= {r["num_spec_reqs"] for r in verify}
    # A verify row is logged as a (k' + 1)-token chunk at its context.
    assert all(r["num_prefill_tokens"] >= r["num_draft_tokens"] + r["num_spec_reqs"] for r in verify)
    v = profile.meta["fit"]["verify"]
    assert 0 < v["num_steps"] <= len(verify)
    assert v["held_out"]["num_steps"] > 0 and v["points"] >= 2
    assert profile.meta["provenance"]["speculative_config"]["num_speculative_tokens"] == 3
    # Drafts only in the verify points: the plain points and the speed probes ran plain steps.
    quick = CalibrationDesign.quick()
    decodes = profile.meta["fit"]["by_kind"]["decode"]["num_steps"]
    assert decodes >= len(quick.decode_batches) * len(quick.decode_contexts) * quick.decode_steps
    assert len(profile.meta["provenance"]["speed_probes"]) >= 2
    # The base fit never saw a verify step: only the term prices what they add.
    assert profile.meta["fit"]["num_steps"] == sum(1 for r in rows if not r["num_draft_tokens"]
                                                   and r["num_prefill_tokens"] + r["num_decode_seqs"] > 0) \
        - 2 * len(profile.meta["provenance"]["idle_steps"])


def _verify_rows(term: tuple[float, float, float], base: FittedCostModel) -> list[dict]:
    """Verify steps at several batches and contexts whose time is their rows' price as decode rows plus
    the planted term."""
    rows = []
    for b in (1, 2, 4, 8):
        for ctx in (64, 256):
            for k in (2, 4):
                q = k + 1
                f = dict(num_prefill_tokens=b * q, num_prefill_seqs=b, prefill_context=b * ctx,
                         prefill_attn=b * q * (ctx + q / 2), num_decode_seqs=0, decode_context=0)
                t = base.step_time(0, 0, 0, 0.0, b * q, b * q * ctx) + term[0] + term[1] * b + term[2] * b * k
                rows.append({**f, "step_time_s": t, "gap_s": 0.0, "num_spec_reqs": b, "num_draft_tokens": b * k})
    return rows


def test_the_verify_term_is_recovered_and_priced_on_held_out_points() -> None:
    from twinserve.twin.verifyfit import fit_verify_term

    base = FittedCostModel(intercept_s=0.01, per_token_s=2e-4, per_decode_seq_s=1e-3,
                           per_decode_context_token_s=1e-6)
    profile = FittedCostModel(**{k: getattr(base, k) for k in ("intercept_s", "per_token_s", "per_decode_seq_s",
                                                                "per_decode_context_token_s")})
    diag = fit_verify_term(profile, _verify_rows((0.02, 0.004, 0.0015), base))
    assert profile.per_verify_step_s == pytest.approx(0.02, rel=1e-6)
    assert profile.per_verify_seq_s == pytest.approx(0.004, rel=1e-6)
    assert profile.per_draft_token_s == pytest.approx(0.0015, rel=1e-6)
    held = diag["held_out"]
    assert held["num_steps"] > 0 and held["mape"] < 1e-6 and diag["without_term"]["total_err"] < -0.05
    # The term survives a save and a load; a malformed one is a typed error naming the field.
    from twinserve.backends.sim.fitted import ProfileError

    again = FittedCostModel.from_dict(profile.to_dict())
    assert again.verify_time(3, 12) == profile.verify_time(3, 12) == pytest.approx(0.02 + 3 * 0.004 + 12 * 0.0015)
    with pytest.raises(ProfileError, match="'verify'"):
        FittedCostModel.from_dict({**profile.to_dict(), "verify": {"per_verify_seq_s": "fast"}})


def test_a_verify_term_fitted_to_zero_still_prices_verify_rows_as_decode_rows() -> None:
    """Verify steps that cost exactly their decode rows fit a zero term: the profile must still say
    so (before, an all-zero term read as "no verify fit" and verify rows were priced as prefill chunks)."""
    from twinserve.twin.verifyfit import fit_verify_term

    base = FittedCostModel(intercept_s=0.01, per_token_s=2e-4, per_decode_seq_s=1e-3,
                           per_decode_context_token_s=1e-6)
    profile = FittedCostModel(**{k: getattr(base, k) for k in ("intercept_s", "per_token_s", "per_decode_seq_s",
                                                                "per_decode_context_token_s")})
    assert not profile.prices_verify
    fit_verify_term(profile, _verify_rows((0.0, 0.0, 0.0), base))
    assert (profile.per_verify_step_s, profile.per_verify_seq_s, profile.per_draft_token_s) == (0.0, 0.0, 0.0)
    assert profile.prices_verify
    saved = profile.to_dict()
    assert saved["verify"] == {"per_verify_step_s": 0.0, "per_verify_seq_s": 0.0, "per_draft_token_s": 0.0}
    assert FittedCostModel.from_dict(saved).prices_verify
    assert not FittedCostModel.from_dict({k: v for k, v in saved.items() if k != "verify"}).prices_verify


def test_a_calibrated_profile_prices_a_verify_row_as_a_decode_row_plus_the_term(monkeypatch) -> None:
    import twinserve.sim.build as b
    from twinserve.sim.build import simulate
    from twinserve.sim.config import StudyConfig

    def busy(term: tuple[float, float]) -> float:
        cfg = StudyConfig()
        cfg.engine.cost_model = "fitted"
        s, w = cfg.scheduler, cfg.workload
        s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len = 1, 256, 256
        w.num_requests, w.arrival, w.prompt_dist, w.output_dist = 1, "all_at_once", "fixed", "fixed"
        w.prompt_mean, w.output_mean, w.output_min = 20.0, 10.0, 10
        cfg.speculative.method, cfg.speculative.num_speculative_tokens = "ngram", 3
        cfg.speculative.acceptance_rates = [0.0] * 3  # every draft rejected: one token a step
        built = FittedCostModel(intercept_s=0.01, per_token_s=1e-4, per_verify_step_s=term[0] / 2,
                                per_verify_seq_s=term[0] / 2, per_draft_token_s=term[1])
        monkeypatch.setattr(b.FittedCostModel, "load", staticmethod(lambda path: built))
        cfg.engine.profile = "planted.json"
        return simulate(cfg)[1].end_time

    # 10 tokens: the first from the 20-token prefill, then 8 verify steps (3, 3, 3, 3, 3, 3, 2, 1
    # drafts: 21, each priced as one more decode row) and a last plain decode, no room for drafts.
    prefill, decode = 0.01 + 20e-4, 0.01 + 1e-4
    assert busy((0.01, 0.001)) == pytest.approx(prefill + 9 * decode + 21e-4 + 8 * 0.01 + 21 * 0.001, rel=1e-12)
    # Without the term (a profile not calibrated on verify steps) a verify row is the chunk it runs.
    assert busy((0.0, 0.0)) == pytest.approx(prefill + 9 * decode + 21e-4, rel=1e-12)


def _earlier_run(path: Path, accepted_per_step: int, k: int = 3, steps: int = 20) -> Path:
    """A planted step log of an earlier run: one request verifying k drafts a step, this many accepted."""
    from twinserve.backends.real.step_log import StepLog, StepRecord

    log = StepLog(path)
    for i in range(steps):
        log.append(StepRecord(i, 0.01 * i, [(k + 1, 30 + i)], [], 1, 0, 0, step_time_s=0.01,
                              num_spec_reqs=1, num_draft_tokens=k, num_accepted_tokens=accepted_per_step))
    log.close()
    return path


def test_fidelity_with_speculation_forecasts_from_an_earlier_runs_acceptance(make_engine, tmp_path,
                                                                            monkeypatch) -> None:
    _always_draft(monkeypatch)
    import json
    import os
    import time

    from twinserve.sim.speculative import rates_from_step_log
    from twinserve.twin.fidelity import run_fidelity
    from twinserve.twin.workload import FidelityOptions
    from .test_forecast import ROWS, _trace

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4, per_verify_seq_s=5e-4, per_draft_token_s=1e-4,
                    meta={"provenance": {"speed_probe_s": 0.05}}).save(prof)
    earlier = _earlier_run(tmp_path / "earlier" / "steps_real.csv", accepted_per_step=2)
    engine = make_engine(max_num_batched_tokens=128, speculative_config=SPEC)
    out = tmp_path / "out"
    seen: dict[str, float] = {}
    add = engine.add_request

    def first_request(request_id, *a, **k):
        if not request_id.startswith(("fidelity-warm-up", "cal-")) and "t" not in seen:
            seen["t"] = time.time()
            seen["forecast"] = json.loads((out / "forecast.json").read_text())
        return add(request_id, *a, **k)

    monkeypatch.setattr(engine, "add_request", first_request)
    try:
        rep = run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), repeats=2,
                                                   acceptance_from=str(earlier)),
                           out, echo=lambda s: None)
    finally:
        engine.shutdown()
    # The forecast was whole on disk before the first request, and its acceptance is the earlier run's.
    assert os.path.getmtime(out / "forecast.json") <= seen["t"]
    sp = seen["forecast"]["speculative"]
    assert sp["num_speculative_tokens"] == 3 and sp["acceptance_from"]["path"] == str(earlier.resolve())
    assert sp["acceptance_from"]["rates"] == rates_from_step_log(earlier, 3)
    import hashlib

    assert sp["acceptance_from"]["sha256"] == hashlib.sha256(earlier.read_bytes()).hexdigest()
    # The speed probe before ran plain steps, as calibration's did; the judged runs speculated.
    assert seen["forecast"]["kind"] == "forecast, probed before"
    from twinserve.backends.real.step_log import read_step_log

    assert sum(int(r["num_draft_tokens"]) for r in read_step_log(out / "steps_real.csv")) > 0
    summary = rep["summary"]
    assert summary["pass"] + summary["fail"] + summary["unresolved"] == summary["cells"] > 0
    assert len(rep["metrics"]["e2e"]["p50"]["verdict"]["real"]) == 2
    assert (out / "fidelity.md").read_text().startswith("VALIDITY: ")
    assert len(seen["forecast"]["requests"]) == len(ROWS)


def test_the_earlier_runs_acceptance_moves_the_forecast(make_engine, tmp_path) -> None:
    import json

    from twinserve.twin.fidelity import run_fidelity
    from twinserve.twin.workload import FidelityOptions
    from .test_forecast import _trace

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(prof)
    engine = make_engine(max_num_batched_tokens=128, speculative_config=SPEC)
    steps = {}
    try:
        for accepted in (0, 3):
            src = _earlier_run(tmp_path / f"run{accepted}" / "steps.csv", accepted)
            out = tmp_path / f"out{accepted}"
            run_fidelity(engine, FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), probe=False,
                                                 acceptance_from=str(src)), out, echo=lambda s: None,
                         forecast_only=True)
            steps[accepted] = json.loads((out / "forecast.json").read_text())["num_steps"]
    finally:
        engine.shutdown()
    # All drafts accepted: four tokens a verify step, so far fewer steps than with none accepted.
    assert steps[3] < 0.6 * steps[0]


def test_a_forecast_that_would_read_the_judged_runs_acceptance_is_refused(tiny_model, tmp_path, capsys,
                                                                           no_model) -> None:
    import json

    from twinserve.cli import main
    from twinserve.twin.specforecast import AcceptanceSourceError, spec_forecast
    from twinserve.core.spec_decode import SpeculativeConfig
    from .test_forecast import _common

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002).save(prof)
    out = tmp_path / "o"
    spec = ["--speculative-config", json.dumps(SPEC)]
    common = ["--profile", str(prof), "--out", str(out), *_common(tiny_model, tmp_path), *spec]
    # A step log inside --out is the judged runs' own (a rerun would overwrite it).
    own = _earlier_run(out / "steps_real.csv", 2)
    assert main(["fidelity", *common, "--acceptance-from", str(own)]) == 2
    assert "judged run's own acceptance" in capsys.readouterr().err
    with pytest.raises(AcceptanceSourceError):
        spec_forecast(SpeculativeConfig("ngram", 3), str(out / "repeat-2" / "steps_real.csv"), out)
    # A draft model's forwards are not in a calibrated profile: not forecast.
    from twinserve.twin.preflight import FidelityError

    with pytest.raises(FidelityError, match="ngram speculation only"):
        spec_forecast(SpeculativeConfig("draft_model", 3, model="draft"), str(tmp_path / "e.csv"), out)
    # A speculating engine with no earlier run, and an earlier log without drafts, are refused too.
    assert main(["fidelity", *common]) == 2
    assert "--acceptance-from" in capsys.readouterr().err
    plain = tmp_path / "plain.csv"
    plain.write_text("step,num_draft_tokens,num_accepted_tokens,num_spec_reqs\n0,0,0,0\n")
    assert main(["fidelity", *common, "--acceptance-from", str(plain)]) == 2
    assert "no verified drafts" in capsys.readouterr().err
    # --acceptance-from on an engine that does not speculate says so.
    earlier = _earlier_run(tmp_path / "e" / "steps.csv", 2)
    assert main(["fidelity", *common[:-2], "--acceptance-from", str(earlier)]) == 2
    assert "does not speculate" in capsys.readouterr().err
