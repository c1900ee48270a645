"""Hypothesis over StudyConfig: any field set to anything, through --set-style strings or directly in
code, gives a typed error or a finished simulation; never a crash or a hang (an alarm guards each run)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from twinserve.core.errors import TwinserveError
from twinserve.sim.build import simulate
from twinserve.core.knobs import knob_of
from twinserve.sim.config import SECTIONS, StudyConfig, all_fields, set_field, validate

from .helpers import small_config, time_limit

# num_requests is pinned (it sets the run's length); everything else is fair game.
FIELDS = sorted(f for f in all_fields() if f != "workload.num_requests")
VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 5), st.sampled_from([0, 1, 2 ** 31, 10 ** 9, -(10 ** 9)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, 1e-9, 0.5, 1.0, 1.5, 1e300]),
    st.sampled_from(["", "nan", "inf", "-1", "0", "1e9", "true", "fcfs", "sjf", "trace", "fixed", "uniform",
                     "builtin:azure_conv", "builtin:nope", ".", "x"]),
    st.text(max_size=4),
)


def _plausible(name: str) -> st.SearchStrategy[Any]:
    """Values near the field's default (mostly valid), so many runs get as far as simulating."""
    section, field = name.split(".", 1)
    default = getattr(getattr(StudyConfig(), section), field)
    k = knob_of(SECTIONS[section].__dataclass_fields__[field])
    choices = k.choice_list() if k is not None else None
    if choices:
        return st.sampled_from(choices)
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.integers(0, max(2 * default, 8))
    if isinstance(default, float):
        return st.floats(0.0, max(2.0 * default, 1.0))
    return st.just(default)


@st.composite
def field_changes(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=4))
    return {n: draw(VALUE if draw(st.integers(0, 3)) == 0 else _plausible(n)) for n in names}


@given(changes=field_changes(), as_text=st.booleans())
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_any_field_value_is_a_typed_error_or_a_finished_run(changes: dict[str, Any], as_text: bool) -> None:
    cfg = small_config()
    cfg.workload.num_requests = 20
    cfg.workload.rate = 50.0
    try:
        with time_limit(20):
            for name, value in changes.items():
                if as_text:  # the --set path: strings through coerce()
                    set_field(cfg, name, "" if value is None else str(value))
                else:  # set in code: only validate() stands between the value and the run
                    section, field = name.split(".", 1)
                    setattr(getattr(cfg, section), field, value)
            validate(cfg)
            result = simulate(cfg)[1]
    except (TwinserveError, OSError) as e:
        event(f"refused: {type(e).__name__}")
        return  # typed (OSError: a path that is a folder or unreadable, reported as such by `simulate`)
    event("simulated")
    finished = [r for r in result.records if r.finish_reason in ("length", "stop")]
    refused = [r for r in result.records if r.finish_reason == "refused"]
    assert len(finished) + len(refused) == len(result.records) >= 1
