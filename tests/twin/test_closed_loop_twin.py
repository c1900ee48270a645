"""The twin serves and forecasts the same closed-loop clients ([workload] concurrency)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.sim.workload import Workload, WorkloadConfig
from twinserve.twin.realrun import run_real
from twinserve.twin.schedule import schedule_equivalence

ROWS = [(0.0, 30, 6), (0.01, 12, 9), (0.02, 44, 4), (0.05, 20, 7), (0.06, 9, 12),
        (0.07, 33, 5), (0.09, 16, 8), (0.12, 25, 6), (0.13, 40, 3), (0.2, 11, 10)]


def _trace(path: Path) -> Path:
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{a},{p},{d}\n" for a, p, d in ROWS))
    return path


def _sequential(records, n: int, think: float) -> None:
    """At most n in flight at any send; each client's next send think after its last finish."""
    for r in records:
        assert sum(1 for o in records if o.arrival_time <= r.arrival_time < (o.finish_time or 0)) <= n
    by: dict[int, list] = {}
    for r in records:
        by.setdefault(r.client, []).append(r)
    assert set(by) <= set(range(n))
    for rs in by.values():
        rs.sort(key=lambda r: r.arrival_time)
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt.arrival_time == pytest.approx(prev.finish_time + think, abs=1e-9)


def test_real_run_clients_are_the_simulators_and_the_schedule_replays(make_engine) -> None:
    engine = make_engine(max_num_batched_tokens=24, max_num_seqs=4)
    cfg = WorkloadConfig(num_requests=10, prompt_dist="uniform", prompt_min=8, prompt_max=40,
                         output_dist="uniform", output_min=3, output_max=12, vocab_size=engine.vocab_size,
                         concurrency=3, think_time_s=0.005, warmup_requests=3)
    make = lambda: Workload(cfg, 2, engine.max_model_len)  # noqa: E731
    real = run_real(engine, make())
    assert len(real.records) == 13 and sum(r.warmup for r in real.records) == 3
    _sequential(real.records, 3, 0.005)
    # On the real step times the simulator's clients send when the real ones did: the same schedule.
    check = schedule_equivalence(real, make, engine.scheduler_config)
    assert check.equivalent, check.first_mismatch
    engine.shutdown()


def test_a_core_process_closed_loop_replays_with_the_real_finishes(make_engine) -> None:
    from twinserve.backends.real.step_log import StepLog

    # The front end hears of a finish after the core's step ends: the clients must be freed when it did.
    engine = make_engine(max_num_batched_tokens=24, max_num_seqs=4, engine_core_mode="process")
    try:
        cfg = WorkloadConfig(num_requests=12, prompt_dist="uniform", prompt_min=8, prompt_max=40,
                             output_dist="uniform", output_min=3, output_max=12,
                             vocab_size=engine.vocab_size, concurrency=3, warmup_requests=2)
        make = lambda: Workload(cfg, 5, engine.max_model_len)  # noqa: E731
        engine.set_step_log(StepLog(keep=True, record_schedule=True))
        real = run_real(engine, make())
        _sequential(real.records, 3, 0.0)
        check = schedule_equivalence(real, make, engine.scheduler_config)
        assert check.equivalent, check.first_mismatch
    finally:
        engine.shutdown()


def test_fidelity_forecasts_and_serves_the_same_closed_loop(make_engine, tmp_path) -> None:
    from twinserve.twin.fidelity import run_fidelity
    from twinserve.twin.workload import FidelityOptions

    prof = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.002, per_token_s=1e-4).save(prof)
    engine = make_engine(max_num_batched_tokens=128)
    out = tmp_path / "out"
    opts = FidelityOptions(str(prof), trace=str(_trace(tmp_path / "t.csv")), num_requests=8, repeats=1,
                           probe=False, max_concurrency=2, think_time_s=0.01, warmup_requests=2)
    rep = run_fidelity(engine, opts, out, echo=lambda s: None)
    engine.shutdown()
    fc = json.loads((out / "forecast.json").read_text())
    # The forecast simulated the closed loop: 2 warm-up requests, 8 judged, clients in turn.
    assert fc["num_requests"] == 8 and len(fc["warmup_request_ids"]) == 2 and len(fc["requests"]) == 10
    assert fc["workload"]["max_concurrency"] == 2 and fc["workload"]["think_time_s"] == 0.01
    rows = sorted(fc["requests"], key=lambda r: r["arrival_s"])
    assert rows[0]["arrival_s"] == rows[1]["arrival_s"] == 0.0 and rows[2]["arrival_s"] > 0.01
    assert rep["closed_loop"] == {"concurrency": 2, "think_time_s": 0.01, "warmup_requests": 2}
    assert rep["repeats"]["runs"][0]["schedule"]["equivalent"]
    md = (out / "fidelity.md").read_text()
    assert "closed loop: 2 clients, think 0.01 s, 2 warm-up requests, in the forecast and in every run" in md


def test_fidelity_refuses_a_rate_with_clients(tiny_model, tmp_path, capsys) -> None:
    from twinserve.cli import main

    ok = tmp_path / "ok.json"
    FittedCostModel(intercept_s=0.002).save(ok)
    common = ["--profile", str(ok), "--out", str(tmp_path / "o"), "--model", str(tiny_model), "--dtype",
              "float64", "--max-model-len", "128", "--trace", str(_trace(tmp_path / "t.csv"))]
    for flags, want in ((["--rate", "2", "--max-concurrency", "4"], "--rate 2"),
                        (["--max-concurrency", "0"], "--max-concurrency 0"),
                        (["--warmup-requests", "3"], "--max-concurrency N")):
        assert main(["fidelity", *flags, *common]) == 2
        assert want in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
