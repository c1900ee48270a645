"""`simulate validate` keeps what a stopped run finished (OUT/rows.jsonl) and `--resume` runs only the
rest: the full set is an hour of two cores, and a run killed at minute 59 must not lose 59 minutes."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import twinserve.sim.validate_cli as vc
from twinserve.sim.cli import main

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")

FLAGS = ["validate", "--silicon", "--model", "Llama-3.1-8B", "--system", "h100_sxm", "--backend", "trtllm",
         "--limit", "4", "--workers", "1"]
TIMING = ["sim_wall_s", "sim_cpu_s"]
REAL_ROW = vc.simulate_row


def _stopping_after(n: int, monkeypatch) -> list[str]:
    """simulate_row that raises KeyboardInterrupt (Ctrl-C) on its (n+1)-th study; the ids it ran."""
    ran: list[str] = []

    def row(job):
        if len(ran) == n:
            raise KeyboardInterrupt
        ran.append(job[0]["id"])
        return REAL_ROW(job)

    monkeypatch.setattr(vc, "simulate_row", row)
    return ran


def test_a_stopped_run_keeps_its_studies_and_resume_runs_only_the_rest(tmp_path, monkeypatch, capsys) -> None:
    whole = tmp_path / "whole"
    assert main([*FLAGS, "--out", str(whole)]) == 0
    assert not (whole / vc.JOURNAL).exists()  # done: the journal has served
    expected = pd.read_csv(whole / "validation.csv")
    assert expected["sim_cpu_s"].gt(0).sum() == 4

    out = tmp_path / "v"
    first = _stopping_after(2, monkeypatch)
    assert main([*FLAGS, "--out", str(out)]) == 130
    assert "--resume" in capsys.readouterr().err
    assert not (out / "validation.csv").exists()
    lines = (out / vc.JOURNAL).read_text().splitlines()
    assert len(lines) == 3 and [json.loads(x)["row"] for x in lines[1:]] == first

    # Without --resume the journal is not overwritten: exit 2, the studies stay.
    assert main([*FLAGS, "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err and len((out / vc.JOURNAL).read_text().splitlines()) == 3

    second = _stopping_after(99, monkeypatch)
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 0
    assert len(second) == 2 and not set(second) & set(first)  # only the rest ran
    got = pd.read_csv(out / "validation.csv")
    pd.testing.assert_frame_equal(got.drop(columns=TIMING), expected.drop(columns=TIMING))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["studies_resumed"] == 2
    # Resumed studies' CPU seconds count in the run's total.
    assert summary["run"]["studies_cpu_s"] == pytest.approx(got["sim_cpu_s"].sum(), abs=0.1)
    assert not (out / vc.JOURNAL).exists()


def test_a_half_written_last_line_reruns_that_study_only(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "v"
    _stopping_after(3, monkeypatch)
    assert main([*FLAGS, "--out", str(out)]) == 130
    path = out / vc.JOURNAL
    text = path.read_text()
    path.write_text(text[:-40])  # the kill came mid-write
    again = _stopping_after(99, monkeypatch)
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 0
    assert len(again) == 2  # the cut study and the one never started
    assert len(pd.read_csv(out / "validation.csv")) == 4


@pytest.mark.parametrize("change, says", [
    (["--window", "steady"], "settings"),
    (["--estimate-waves", "3"], "settings"),
])
def test_resume_with_other_settings_is_refused_and_keeps_the_journal(tmp_path, monkeypatch, capsys,
                                                                     change, says) -> None:
    out = tmp_path / "v"
    _stopping_after(1, monkeypatch)
    assert main([*FLAGS, "--out", str(out)]) == 130
    before = (out / vc.JOURNAL).read_text()
    ran = _stopping_after(99, monkeypatch)
    assert main([*FLAGS, *change, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and ran == []
    assert (out / vc.JOURNAL).read_text() == before


def test_resume_on_other_code_is_refused(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "v"
    _stopping_after(1, monkeypatch)
    monkeypatch.setenv("TWINSERVE_GIT_COMMIT", "aaaaaaa")
    assert main([*FLAGS, "--out", str(out)]) == 130
    monkeypatch.setenv("TWINSERVE_GIT_COMMIT", "bbbbbbb")
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 2
    assert "git_commit 'aaaaaaa'" in capsys.readouterr().err


def test_a_corrupt_journal_line_is_a_clear_error(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "v"
    _stopping_after(2, monkeypatch)
    assert main([*FLAGS, "--out", str(out)]) == 130
    path = out / vc.JOURNAL
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2" in err and "Traceback" not in err


def test_failed_studies_keep_the_journal_and_resume_reruns_only_them(tmp_path, monkeypatch, capsys) -> None:
    # A worker killed for memory fails every study queued on its pool: they must not be lost.
    ran: list[str] = []
    first: list[str] = []

    def row(job):
        ran.append(job[0]["id"])
        if len(ran) == 2:
            raise RuntimeError("BrokenProcessPool: a worker was killed")
        first.append(job[0]["id"])
        return REAL_ROW(job)

    monkeypatch.setattr(vc, "simulate_row", row)
    out = tmp_path / "v"
    assert main([*FLAGS, "--out", str(out)]) == 0
    assert "--resume" in capsys.readouterr().err and (out / vc.JOURNAL).exists()
    bad = pd.read_csv(out / "validation.csv")["sim_error"].fillna("").astype(str).str.len().gt(0)
    assert bad.sum() == 1
    again = _stopping_after(99, monkeypatch)
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 0
    assert again == [ran[1]]  # only the failed study ran again
    assert pd.read_csv(out / "validation.csv")["sim_error"].isna().all()  # empty cells: no error
    assert not (out / vc.JOURNAL).exists()


def test_an_unreadable_journal_is_a_clear_error(tmp_path, capsys) -> None:
    out = tmp_path / "v"
    out.mkdir()
    (out / vc.JOURNAL).write_bytes(b"\xff\xfe\x00binary")
    assert main([*FLAGS, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "not a readable validate journal" in err and "Traceback" not in err
