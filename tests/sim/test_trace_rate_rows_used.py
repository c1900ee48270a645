"""The trace-rate check (a trace slower than 1 request/minute with no stated unit) judges the rows the
study runs: after over-long rows are dropped and after the twin's trace_offset, not the file's first rows."""

from __future__ import annotations

import pytest

from twinserve.sim.errors import TraceError
from twinserve.sim.workload import Workload, WorkloadConfig

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _rows(start: int, gap: float, n: int, prompt: int) -> str:
    return "".join(f"{start + gap * i},{prompt},5\n" for i in range(n))


def _cfg(trace, **kw) -> WorkloadConfig:
    return WorkloadConfig(num_requests=20, arrival="trace", prompt_dist="trace", output_dist="trace",
                          trace=str(trace), **kw)


def test_dropped_dense_rows_do_not_hide_a_sparse_trace(tmp_path) -> None:
    # 20 over-long rows one second apart (all dropped), then the 20 the study runs: one every 200 "s".
    f = tmp_path / "t.csv"
    f.write_text(HEADER + _rows(0, 1, 20, 5000) + _rows(100, 200, 20, 10))
    w = Workload(_cfg(f, on_overlong="drop"), max_model_len=4096)
    with pytest.raises(TraceError) as e:
        next(w.items())
    assert e.value.field == "arrived_at"
    assert "20 requests" in str(e.value) and "trace_time_unit" in str(e.value)


def test_dropped_sparse_rows_do_not_refuse_a_dense_study(tmp_path) -> None:
    # One over-long row an hour before the rest (dropped): the 20 rows run arrive 1 s apart.
    f = tmp_path / "t.csv"
    f.write_text(HEADER + "0,5000,5\n" + _rows(3600, 1, 20, 10))
    items = list(Workload(_cfg(f, on_overlong="drop"), max_model_len=4096).items())
    assert len(items) == 20
    assert items[1].arrival_time - items[0].arrival_time == pytest.approx(1.0)


def test_the_check_leaves_the_run_it_judged_unchanged(tmp_path) -> None:
    # Drawn lengths (some dropped as over-long) and shared-prompt draws: the run is the same with the check.
    f = tmp_path / "t.csv"
    f.write_text(HEADER + _rows(0, 0.5, 60, 10))
    cfg = WorkloadConfig(num_requests=40, arrival="trace", prompt_dist="uniform", prompt_min=10, prompt_max=120,
                         output_dist="trace", trace=str(f), num_system_prompts=3, system_prompt_len=8,
                         on_overlong="drop")
    runs = []
    for check in (True, False):
        w = Workload(cfg, seed=3, max_model_len=100)
        w.check_trace_rate = check
        items = list(w.items())
        runs.append(([(i.request_id, i.arrival_time, i.num_prompt_tokens, i.system_prompt, i.index) for i in items],
                     w.length_stats.dropped, w.prompt_tokens(items[-1])))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0 and len(runs[0][0]) == 40  # some were dropped, and the run still has its 40
