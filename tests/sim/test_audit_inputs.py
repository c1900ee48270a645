"""Study inputs read in the right units and columns, or refused (docs/test-audit.md)."""

from __future__ import annotations

import pytest

from twinserve.sim.workload import Workload, WorkloadConfig


def test_azure_timestamps_count_minutes_hours_and_days(tmp_path) -> None:
    # The builtin excerpt's first rows lie inside one minute; a real trace spans minutes, hours and midnight.
    f = tmp_path / "azure.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.5000000,10,5\n"
                 "2023-11-16 18:18:04.0000000,11,6\n"     # +60.5 s
                 "2023-11-16 19:00:03.5000000,12,7\n"     # +42 min 59.5 s
                 "2023-11-17 00:00:01.5000000,13,8\n")    # across midnight
    cfg = WorkloadConfig(num_requests=4, arrival="trace", prompt_dist="trace", output_dist="trace", trace=str(f))
    items = list(Workload(cfg).items())
    assert [i.arrival_time for i in items] == pytest.approx([0.0, 60.5, 2580.0, 5 * 3600 + 42 * 60 + 58.0])
    assert [(i.num_prompt_tokens, i.num_output_tokens) for i in items] == [(10, 5), (11, 6), (12, 7), (13, 8)]
