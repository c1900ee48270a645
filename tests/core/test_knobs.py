"""core.knobs: a value is accepted exactly when its declaration allows it, and every edge says so the same way."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from twinserve.core.knob_gen import add_knob_flags, knob_table
from twinserve.core.knobs import KnobError, check_value, knob


@dataclasses.dataclass(slots=True)
class Sample:
    """A dataclass with one knob of each shape."""

    share: float = knob(0.5, help="a share", range=(0.0, 1.0), open="hi")
    count: int = knob(4, help="a count", unit="blocks", range=(1, 64), special={0: "off"})
    name: str = knob("a", help="a name", choices=("a", "b"))
    on: bool = knob(True, help="a switch")
    limit: int | None = knob(None, help="a limit", range=(1, None), special={None: "none"})


F = {f.name: f for f in dataclasses.fields(Sample)}


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(1.0)
@example(0.0)
def test_a_number_is_accepted_iff_it_is_in_its_range(x: float) -> None:
    ok = not math.isnan(x) and 0.0 <= x < 1.0
    try:
        assert check_value("share", x, F["share"]) == x and ok
    except KnobError as e:
        assert not ok and e.field == "share" and "[0, 1)" in str(e)


@given(st.integers(-5, 100))
def test_an_integer_outside_its_range_is_allowed_only_as_a_special_value(n: int) -> None:
    ok = 1 <= n <= 64 or n == 0
    try:
        check_value("count", n, F["count"])
        assert ok
    except KnobError as e:
        assert not ok and "[1, 64] (blocks), or 0 (off)" in str(e)


@pytest.mark.parametrize("name,value", [("count", True), ("count", 2.0), ("name", "c"), ("on", 1),
                                        ("share", "0.5"), ("limit", 0)])
def test_a_wrong_type_or_choice_is_refused(name: str, value: object) -> None:
    with pytest.raises(KnobError, match=name):
        check_value(name, value, F[name])


def test_text_is_parsed_by_the_field_type_and_none_where_optional() -> None:
    assert check_value("count", "7", F["count"], from_text=True) == 7
    assert check_value("on", "off", F["on"], from_text=True) is False
    assert check_value("limit", "none", F["limit"], from_text=True) is None
    with pytest.raises(KnobError, match="flag --count"):
        check_value("count", "x", F["count"], where="flag --count", from_text=True)


def test_flags_carry_help_range_and_default_and_refuse_with_the_knobs_message(capsys) -> None:
    p = argparse.ArgumentParser()
    add_knob_flags(p, Sample)
    text = p.format_help()
    assert "a share; a number in [0, 1) (default: 0.5)" in text and "--no-on" in text
    assert p.parse_args(["--count", "0", "--name", "b", "--no-on"]).count == 0
    with pytest.raises(SystemExit):
        p.parse_args(["--share", "1"])
    assert "flag --share: config share=1.0 is invalid: allowed a number in [0, 1)" in capsys.readouterr().err


def test_the_table_lists_every_knob() -> None:
    rows = knob_table(Sample).splitlines()
    assert len(rows) == 2 + len(F) and rows[2].startswith("| `share` | `0.5` | a number in [0, 1)")


def test_one_bad_value_reads_the_same_from_a_flag_a_study_and_llm(tmp_path, capsys) -> None:
    from twinserve.backends.real.config import EngineArgs
    from twinserve.cli import build_parser
    from twinserve.sim.config import load_config
    from twinserve.sim.errors import ConfigError

    allowed = "allowed a number in [0, 1)"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--watermark", "1.5"])
    assert f"flag --watermark: config watermark=1.5 is invalid: {allowed}" in capsys.readouterr().err
    study = tmp_path / "s.toml"
    study.write_text("[scheduler]\nwatermark = 1.5\n")
    with pytest.raises(ConfigError, match=rf"s\.toml:2: field 'scheduler\.watermark': 1\.5 is invalid: "
                                          rf"{allowed.replace('[', '.').replace(')', '.')}"):
        load_config(study)
    with pytest.raises(KnobError, match=r"LLM\(watermark=\.\.\.\): config watermark=1\.5 is invalid"):
        EngineArgs.from_kwargs(watermark=1.5)
