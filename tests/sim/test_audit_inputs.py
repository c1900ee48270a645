"""Study inputs read in the right units and columns, or refused (docs/test-audit.md)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from twinserve.core.knobs import knob_of
from twinserve.sim import config
from twinserve.sim.config import StudyConfig
from twinserve.sim.errors import ConfigError
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
