"""experiments/aic_rows_side_by_side.py names each row's model as AIConfigurator ships it: a row whose
model it cannot find is refused by its SDK (a download it cannot make), and the side-by-side then judged
AIConfigurator on fewer rows than it could price (195 Llama-3.1-8B-Instruct and 86 GLM-5 held-out rows)."""

from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core", reason="the estimate is aiconfigurator-core's (extra 'aic')")


@pytest.mark.parametrize("row_model, shipped", [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-8B"),
    ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
    ("zhipuai/GLM-5", "zai-org/GLM-5"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"),  # shipped as named
])
def test_each_row_model_maps_to_a_config_the_package_ships(experiment, row_model, shipped) -> None:
    sbs = experiment("aic_rows_side_by_side")
    assert sbs.aic_model_path(row_model) == shipped


def test_a_model_the_package_lacks_keeps_its_name_for_the_sdk_to_refuse(experiment) -> None:
    assert experiment("aic_rows_side_by_side").aic_model_path("acme/NoSuchModel-7B") == "acme/NoSuchModel-7B"
