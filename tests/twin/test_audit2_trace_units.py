"""The fidelity twin's workload reads a trace's unit as the study states it (docs/test-audit.md, round 2)."""

from __future__ import annotations

import pytest

from twinserve.sim.errors import TraceError
from twinserve.twin.workload import FidelityOptions, workload_factory

# One request every 200 (seconds, or milliseconds misread).
ROWS = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{200 * i},{10 + i},5\n" for i in range(20))


def test_a_study_that_states_its_trace_unit_runs_and_one_that_does_not_is_refused(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(ROWS)
    body = (f'[workload]\narrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\n'
            f'trace = "{trace}"\n')
    for unit, first_gaps in (('"s"', [200.0, 200.0]), ('"ms"', [0.2, 0.2])):
        study = tmp_path / f"s{len(first_gaps)}{unit[1:-1]}.toml"
        study.write_text(body + f"trace_time_unit = {unit}\n")
        items = list(workload_factory(FidelityOptions("p", config=str(study), num_requests=20), 4096, 1000)().items())
        times = [i.arrival_time for i in items]
        assert [b - a for a, b in zip(times, times[1:3])] == pytest.approx(first_gaps)
    unstated = tmp_path / "u.toml"
    unstated.write_text(body)
    with pytest.raises(TraceError, match="trace_time_unit"):
        next(workload_factory(FidelityOptions("p", config=str(unstated), num_requests=20), 4096, 1000)().items())
    with pytest.raises(TraceError, match="trace_time_unit"):  # --trace alone: seconds, checked
        next(workload_factory(FidelityOptions("p", trace=str(trace), num_requests=20), 4096, 1000)().items())
