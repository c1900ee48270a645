"""A trace's arrived_at column read in its declared unit; one that looks like milliseconds read as
seconds is refused, not run 1000x slow (docs/test-audit.md, round 2)."""

from __future__ import annotations

import pytest

from twinserve.sim.build import build_workload
from twinserve.sim.config import load_config
from twinserve.sim.errors import TraceError
from twinserve.sim.workload import Workload, WorkloadConfig

from .test_user_errors import STUDY, _run_cli

# 200 requests at 5 requests/s, stamped in milliseconds (a common export: epoch ms, offsets kept).
MS_ROWS = "".join(f"{1_700_000_000_000 + 200 * i},{100 + i},20\n" for i in range(200))


def _ms_trace(tmp_path):
    f = tmp_path / "ms.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + MS_ROWS)
    return f


def _cfg(trace, **kw) -> WorkloadConfig:
    return WorkloadConfig(num_requests=200, arrival="trace", prompt_dist="trace", output_dist="trace",
                          trace=str(trace), **kw)


def test_a_trace_stamped_in_milliseconds_read_as_seconds_is_refused_saying_what_was_read(tmp_path) -> None:
    f = _ms_trace(tmp_path)
    with pytest.raises(TraceError) as e:
        next(Workload(_cfg(f)).items())
    msg = str(e.value)
    assert e.value.field == "arrived_at"
    # What was read (199 gaps of 200 "seconds" = 39,800 s = 11.1 hours, 0.005 requests/s) and the fix.
    assert "11.1 hours" in msg and "0.005 requests/s" in msg, msg
    assert "workload.trace_time_unit to 'ms'" in msg, msg


def test_the_unit_option_reads_milliseconds_and_microseconds(tmp_path) -> None:
    f = _ms_trace(tmp_path)
    items = list(Workload(_cfg(f, trace_time_unit="ms")).items())
    assert len(items) == 200
    assert [i.arrival_time for i in items[:3]] == pytest.approx([0.0, 0.2, 0.4])
    assert items[-1].arrival_time == pytest.approx(39.8)
    us = tmp_path / "us.csv"
    us.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n250000,11,5\n500000,12,5\n")
    cfg = WorkloadConfig(num_requests=3, arrival="trace", prompt_dist="trace", output_dist="trace",
                         trace=str(us), trace_time_unit="us", time_scale=2.0)
    assert [i.arrival_time for i in Workload(cfg).items()] == pytest.approx([0.0, 0.5, 1.0])


def test_a_sparse_trace_runs_when_its_unit_is_set_to_seconds_explicitly(tmp_path) -> None:
    # One request every 200 s really is a quiet service: saying so in the study lets it run as read.
    f = _ms_trace(tmp_path)
    study = tmp_path / "s.toml"
    body = STUDY.replace("num_requests = 20\n", "") + (
        f'arrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\ntrace = "{f}"\n')
    study.write_text(body)
    with pytest.raises(TraceError, match="trace_time_unit"):
        next(build_workload(load_config(study)).items())
    study.write_text(body + 'trace_time_unit = "s"\n')
    items = list(build_workload(load_config(study)).items())
    assert items[-1].arrival_time == pytest.approx(39_800.0)


def test_time_scale_that_brings_the_rate_back_is_not_refused(tmp_path) -> None:
    # The check is on the arrivals the study runs: an old study that scaled its ms trace by 1e-3 still runs.
    items = list(Workload(_cfg(_ms_trace(tmp_path), time_scale=1e-3)).items())
    assert items[1].arrival_time == pytest.approx(0.2)


def test_the_study_cli_exits_2_on_a_millisecond_trace(tmp_path, capsys) -> None:
    f = _ms_trace(tmp_path)
    study = tmp_path / "s.toml"
    study.write_text(STUDY + f'arrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\ntrace = "{f}"\n')
    rc, err = _run_cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert "arrived_at" in err and "'ms'" in err


def test_an_azure_trace_refuses_a_unit_it_does_not_use(tmp_path) -> None:
    f = tmp_path / "azure.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5000000,10,5\n")
    cfg = WorkloadConfig(num_requests=1, arrival="trace", prompt_dist="trace", output_dist="trace",
                         trace=str(f), trace_time_unit="ms")
    with pytest.raises(TraceError, match="TIMESTAMP"):
        list(Workload(cfg).items())
