"""The twin's trace-rate check judges the rows it serves, after --trace-offset skips the first ones."""

from __future__ import annotations

import pytest

from twinserve.sim.errors import TraceError
from twinserve.twin.workload import FidelityOptions, workload_factory

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _rows(start: int, gap: float, n: int, prompt: int) -> str:
    return "".join(f"{start + gap * i},{prompt},5\n" for i in range(n))


def test_the_twins_trace_offset_judges_the_rows_after_the_offset(tmp_path) -> None:
    # 30 dense rows, then 20 sparse ones: with trace_offset = 30 the twin serves only the sparse ones.
    f = tmp_path / "t.csv"
    f.write_text(HEADER + _rows(0, 1, 30, 10) + _rows(100, 200, 20, 10))
    make = workload_factory(FidelityOptions("p", trace=str(f), num_requests=20, trace_offset=30), 4096, 1000)
    with pytest.raises(TraceError, match="trace_time_unit"):
        next(make().items())
    # And the other way round: sparse rows skipped, the dense ones served run.
    f.write_text(HEADER + _rows(0, 200, 30, 10) + _rows(10_000, 1, 20, 10))
    make = workload_factory(FidelityOptions("p", trace=str(f), num_requests=20, trace_offset=30), 4096, 1000)
    times = [i.arrival_time for i in make().items()]
    assert len(times) == 20 and times[-1] == pytest.approx(19.0)
