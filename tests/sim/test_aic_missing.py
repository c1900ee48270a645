"""cost_model = "aic" without aiconfigurator-core installed: a clear error naming the extra, exit 2."""

from __future__ import annotations

import sys

import pytest

from twinserve.backends.sim.aic import AicCostModel, AicError
from twinserve.backends.sim.aic import mapping
from twinserve.backends.sim.catalog import get_hardware, get_model
from twinserve.sim.config import StudyConfig
from twinserve.sim.build import build_cost_models
from twinserve.sim.errors import ConfigError


@pytest.fixture
def no_aic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import aiconfigurator_core...` fail as it does when the extra is not installed."""
    for name in list(sys.modules):
        if name.startswith("aiconfigurator_core"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    mapping.supported.cache_clear()
    mapping.version_slots.cache_clear()
    yield
    mapping.supported.cache_clear()
    mapping.version_slots.cache_clear()


def test_missing_package_names_the_extra(no_aic: None) -> None:
    with pytest.raises(AicError, match=r"needs aiconfigurator-core.*pip install 'twinserve\[aic\]'") as err:
        AicCostModel(get_model("Llama-3.1-8B"), get_hardware("H200"), 1)
    assert err.value.field == "cost_model"


def test_missing_package_is_a_config_error_in_a_study(no_aic: None) -> None:
    cfg = StudyConfig()
    cfg.engine.cost_model = "aic"
    with pytest.raises(ConfigError, match=r"field 'engine.cost_model'.*twinserve\[aic\]"):
        build_cost_models(cfg)
