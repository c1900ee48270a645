"""experiments/real_vs_real.py: one recorded real run judged as a prediction of another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.twin.compare import compare
from twinserve.twin.fidelity import write_requests
from twinserve.sim.world import RequestRecord


@pytest.fixture(scope="module")
def rvr(experiment):
    return experiment("real_vs_real")


def _records(slow: float = 1.0, tpot_slow: float = 1.0, shift_arrival: float = 0.0) -> list[RequestRecord]:
    """Twenty requests: a first token `slow` times later after arrival, the rest spaced by
    tpot_slow times the base inter-token gap; each request's lengths differ."""
    out = []
    for i in range(20):
        arrival = 2.0 * i + (shift_arrival if i == 3 else 0.0)
        first = arrival + slow * (0.1 + 0.01 * i)
        times = [first + tpot_slow * 0.05 * (1 + 0.02 * i) * k for k in range(4 + i % 5)]
        out.append(RequestRecord(f"r{i}", arrival, 30 + i, len(times), None, times[0], times[-1], 0, 0,
                                 times, finish_reason="length"))
    return out


def _run(path: Path, records: list[RequestRecord], sim_met: int, speed: float,
         sim: list[RequestRecord] | None = None) -> Path:
    """A recorded fidelity run; its simulator's percentiles are those of `sim` (default: the
    real records themselves, a simulator that predicted the run exactly)."""
    path.mkdir(parents=True)
    write_requests(records, path / "requests_real.csv")
    write_requests(sim if sim is not None else records, path / "requests_sim.csv")
    metrics = compare(records, sim if sim is not None else records)["metrics"]
    (path / "fidelity.json").write_text(json.dumps({"targets": {"met": sim_met, "of": 6}, "metrics": metrics,
                                                    "speed": {"sampled": {"mean_factor": speed}}}))
    return path


def test_the_same_run_twice_meets_every_cell(rvr, tmp_path) -> None:
    a = _run(tmp_path / "a", _records(), 4, 1.0)
    b = _run(tmp_path / "b", _records(), 5, 0.97)
    res = rvr.judge(a, b)
    cell = res["runs"]["."]
    assert (cell["met"], cell["of"]) == (6, 6)
    assert all(abs(e) < 1e-12 for per in cell["real_b_vs_a"].values() for e in per.values())
    assert (res["sim_met_a"], res["sim_met_b"]) == (4, 5)
    assert (cell["sampled_speed_a"], cell["sampled_speed_b"]) == (1.0, 0.97)


def test_a_slower_second_run_misses_by_its_slowdown(rvr, tmp_path) -> None:
    # B's first tokens come 20% later after arrival and its tokens 3% further apart: TTFT misses
    # at +20% at both percentiles, TPOT stays inside the limits at +3%.
    a = _run(tmp_path / "a", _records(), 6, 1.0)
    b = _run(tmp_path / "b", _records(slow=1.2, tpot_slow=1.03), 6, 1.0)
    cell = rvr.judge(a, b)["runs"]["."]
    errs = cell["real_b_vs_a"]
    assert errs["ttft"]["p50"] == pytest.approx(0.2) and errs["ttft"]["p99"] == pytest.approx(0.2)
    assert errs["tpot"]["p50"] == pytest.approx(0.03) and errs["tpot"]["p99"] == pytest.approx(0.03)
    assert 0.03 < errs["e2e"]["p50"] < 0.2
    assert cell["met"] == 6 - 2 - sum(abs(errs["e2e"][q]) > lim for q, lim in (("p50", 0.05), ("p99", 0.10)))


def test_the_simulators_change_is_set_beside_the_real_change(rvr, tmp_path) -> None:
    # Two cells whose second real run is slower in different measures. A twin that saw each
    # run exactly follows every change; one whose prediction for B is its prediction for A
    # follows none of it, and what is left is the whole real change.
    for side, sim_sees in (("exact", True), ("blind", False)):
        for name, slow, tpot in (("c1", 1.25, 1.0), ("c2", 1.0, 1.15)):
            _run(tmp_path / side / "A" / name, _records(), 6, 1.0)
            _run(tmp_path / side / "B" / name, _records(slow=slow, tpot_slow=tpot), 6, 1.0,
                 sim=None if sim_sees else _records())
    exact = rvr.judge(tmp_path / "exact" / "A", tmp_path / "exact" / "B")["followed"]
    blind = rvr.judge(tmp_path / "blind" / "A", tmp_path / "blind" / "B")["followed"]
    assert exact["values"] == blind["values"] == 12
    assert exact["correlation"] == pytest.approx(1.0) and exact["left_rms"] == pytest.approx(0.0, abs=1e-12)
    assert exact["real_rms"] == pytest.approx(blind["real_rms"]) and exact["real_rms"] > 0.05
    assert blind["left_rms"] == pytest.approx(blind["real_rms"])
    cell = rvr.judge(tmp_path / "blind" / "A", tmp_path / "blind" / "B")["runs"]["c1"]
    assert cell["sim_b_vs_a"]["ttft"]["p50"] == pytest.approx(0.0) and cell["real_b_vs_a"]["ttft"]["p50"] > 0.2


def test_studies_are_matched_by_run_name_and_totalled(rvr, tmp_path, capsys) -> None:
    for side, slow in (("A", 1.0), ("B", 1.3)):
        _run(tmp_path / side / "conv-0.3", _records(), 5, 1.0)
        _run(tmp_path / side / "code-0.3", _records(slow=slow), 3, 1.0)
    _run(tmp_path / "A" / "only-in-a", _records(), 6, 1.0)
    res = rvr.judge(tmp_path / "A", tmp_path / "B")
    assert sorted(res["runs"]) == ["code-0.3", "conv-0.3"]
    assert res["runs"]["conv-0.3"]["met"] == 6 and res["runs"]["code-0.3"]["met"] < 6
    assert res["met"] == 6 + res["runs"]["code-0.3"]["met"] and res["of"] == 12
    assert (res["sim_met_a"], res["sim_met_b"]) == (8, 8)
    assert rvr.main([str(tmp_path / "A"), str(tmp_path / "B"), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert f"{res['met']} of 12 target cells met" in out and "| code-0.3 |" in out
    assert json.loads((tmp_path / "r.json").read_text())["met"] == res["met"]


def test_runs_of_different_workloads_are_refused(rvr, tmp_path, capsys) -> None:
    a = _run(tmp_path / "a", _records(), 6, 1.0)
    b = _run(tmp_path / "b", _records(shift_arrival=0.5), 6, 1.0)
    with pytest.raises(rvr.RunMismatch, match="same requests"):
        rvr.judge(a, b)
    assert rvr.main([str(a), str(b)]) == 2
    assert "same requests" in capsys.readouterr().err
    assert rvr.main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "no fidelity.json" in capsys.readouterr().err


def _repeat(run: Path, j: int, records: list[RequestRecord], sim: list[RequestRecord] | None = None) -> None:
    """A repeat-J/ directory in a recorded run, as fidelity --repeats writes it."""
    d = run / f"repeat-{j}"
    d.mkdir()
    write_requests(records, d / "requests_real.csv")
    write_requests(sim if sim is not None else records, d / "requests_sim.csv")


def test_pooled_takes_every_run_of_every_study_repeats_included(rvr, tmp_path, capsys) -> None:
    _run(tmp_path / "A" / "c1", _records(), 6, 1.0)
    b = _run(tmp_path / "B" / "c1", _records(slow=1.2), 6, 1.0)
    _repeat(b, 2, _records(tpot_slow=1.1))
    _run(tmp_path / "B" / "only-in-b", _records(), 6, 1.0)
    res = rvr.pooled([tmp_path / "A", tmp_path / "B"])
    assert list(res["runs"]) == ["c1"] and res["runs"]["c1"]["runs"] == 3
    # Three runs each predicted exactly: pooled, every cell is met at zero error.
    assert (res["met"], res["of"]) == (6, 6)
    assert all(abs(e) < 1e-12 for per in res["runs"]["c1"]["err"].values() for e in per.values())
    assert rvr.main(["--pool", str(tmp_path / "A"), str(tmp_path / "B")]) == 0
    assert "| c1 | 3 |" in capsys.readouterr().out


def test_pooled_error_is_the_runs_together_not_one_of_them(rvr, tmp_path) -> None:
    # One run predicted with first tokens 30% late, the other exactly: pooled, TTFT p50 is off
    # by less than the one run's 30% but not nothing, and the untouched TPOT stays exact.
    _run(tmp_path / "A" / "c1", _records(), 0, 1.0, sim=_records(slow=1.3))
    _run(tmp_path / "B" / "c1", _records(), 6, 1.0)
    err = rvr.pooled([tmp_path / "A", tmp_path / "B"])["runs"]["c1"]["err"]
    assert 0.0 < err["ttft"]["p50"] < 0.3
    assert err["tpot"]["p50"] == pytest.approx(0.0) and err["tpot"]["p99"] == pytest.approx(0.0)
    alone = rvr.pooled([tmp_path / "A"])["runs"]["c1"]["err"]
    assert alone["ttft"]["p50"] == pytest.approx(0.3)


def test_pooled_refuses_other_workloads_and_runs_without_a_prediction(rvr, tmp_path, capsys) -> None:
    _run(tmp_path / "A" / "c1", _records(), 6, 1.0)
    _run(tmp_path / "B" / "c1", _records(shift_arrival=0.5), 6, 1.0)
    with pytest.raises(rvr.RunMismatch, match="same requests"):
        rvr.pooled([tmp_path / "A", tmp_path / "B"])
    (tmp_path / "A" / "c1" / "requests_sim.csv").unlink()
    assert rvr.main(["--pool", str(tmp_path / "A")]) == 2
    assert "no requests_sim.csv" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rvr.main([str(tmp_path / "A")])
