"""Study inputs read in the right units and columns, or refused (docs/test-audit.md)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from twinserve.core.knobs import knob_of
from twinserve.sim import config
from twinserve.sim.build import build
from twinserve.sim.config import StudyConfig, load_config
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.traces import read_trace
from twinserve.sim.workload import Workload, WorkloadConfig

from .test_user_errors import STUDY, _run_cli


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


def test_a_bare_name_in_two_sections_is_refused_not_guessed(monkeypatch) -> None:
    # No bare name is in two sections today; when one is (a new field), `--set name=...` must not pick one.
    known = config.all_fields()
    monkeypatch.setattr(config, "all_fields", lambda: {**known, "run.rate": "float"})
    with pytest.raises(ConfigError, match="ambiguous"):
        config.resolve_field("rate")
    assert config.resolve_field("workload.rate") == "workload.rate"


@pytest.mark.parametrize("setting,name", [
    ("engine.max_num_seq=8", "engine.max_num_seq"),   # a typo in a dotted name
    ("max_num_seq=8", "max_num_seq"),                 # and in a bare one
    ("enigne.model=x", "enigne.model"),               # a section that does not exist
])
def test_a_set_of_a_field_that_does_not_exist_exits_2_naming_it(tmp_path, capsys, setting: str, name: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY)
    rc, err = _run_cli(["run", "--config", str(f), "--set", setting, "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert name in err and "no such field" in err


def _open_lower_bounds() -> list[tuple[str, float]]:
    out = []
    for section, cls in config.SECTIONS.items():
        for f in fields(cls):
            k = knob_of(f)
            if k is not None and k.range and k.range[0] is not None and k.open in ("lo", "both") \
                    and k.range[0] not in k.special:
                out.append((f"{section}.{f.name}", k.range[0]))
    return out


@pytest.mark.parametrize("dotted,bound", _open_lower_bounds())
def test_every_open_lower_bound_is_refused(dotted: str, bound: float) -> None:
    # e.g. search.tolerance = 0 would never end a bisection; a range declared "(0, ...)" must refuse 0.
    with pytest.raises(ConfigError, match=dotted.replace(".", r"\.")):
        config.set_field(StudyConfig(), dotted, bound)


def test_open_lower_bounds_exist_to_check() -> None:
    assert {"search.tolerance", "search.convergence"} <= {d for d, _ in _open_lower_bounds()}


HARDWARE = ('[engine]\nnum_gpu_blocks = 2000\nhardware = "MyGPU"\n[hardware]\nname = "MyGPU"\npeak_flops = 500e12\n'
            'mem_bandwidth = 2.0e12\nmem_gib = 96\ninterconnect_bandwidth = 200e9\n')


def test_a_hardware_table_key_that_does_not_exist_is_refused(tmp_path) -> None:
    # A misspelt optional key (price_per_hr for price_per_hour) must not be dropped in silence.
    f = tmp_path / "s.toml"
    f.write_text(HARDWARE + "price_per_hr = 2.0\n")
    with pytest.raises(ConfigError, match=r"hardware\.price_per_hr.*no such field"):
        load_config(f)


def test_a_hardware_table_reads_mem_gib_in_gibibytes(tmp_path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(HARDWARE)
    assert build(load_config(f)).hardware.mem_bytes == 96 * 2 ** 30


@pytest.mark.parametrize("row,column", [("2023-11-16 18:17:04.0,12,0", "GeneratedTokens"),
                                        ("2023-11-16 18:17:04.0,0,6", "ContextTokens")])
def test_an_azure_row_with_no_tokens_is_refused_naming_line_and_column(tmp_path, row: str, column: str) -> None:
    f = tmp_path / "azure.csv"
    f.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.5,10,5\n{row}\n")
    with pytest.raises(TraceError, match=rf"azure\.csv:3: column '{column}'"):
        list(read_trace(f))
