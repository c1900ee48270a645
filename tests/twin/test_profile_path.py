"""The profile check sees the CPU fp32 product kernel, and never names a refused profile as the one to use."""

from __future__ import annotations

import pytest

from twinserve.backends.sim.fitted import FittedCostModel, ProfileError, check_profile_code_path
from twinserve.twin.preflight import EngineFacts, NoFittingProfileError, check_profile

AMD = FittedCostModel.load("builtin:smollm2-135m-cpu-1t")  # AMD EPYC fp32, made before the prepacked path


def _facts(path: str, rows: int = 4) -> EngineFacts:
    prov = AMD.meta["provenance"]
    return EngineFacts("SmolLM2-135M", 2048, 49152, "cpu", "float32", 1, "inproc", rows, None, AMD.meta["hardware"],
                       prov["cpu"], None, path)


def test_a_profile_made_on_sgemm_is_refused_by_an_engine_on_prepacked_weights() -> None:
    """Issue 53 item 23: the AMD fp32 prepacked path is a 2x kernel change the check did not see."""
    with pytest.raises(ProfileError, match="fp32 products on 'sgemm' but the engine runs them on 'onednn-prepacked'"):
        check_profile_code_path(AMD, 4, product_path="onednn-prepacked")
    check_profile_code_path(AMD, 4, product_path="sgemm")  # what it was made on
    made = FittedCostModel(0.01, meta={"provenance": {"device": "cpu", "dtype": "float32", "engine": {
        "small_batch_rows": 1, "fp32_product_path": "onednn-prepacked"}}})
    check_profile_code_path(made, 1, product_path="onednn-prepacked")
    with pytest.raises(ProfileError, match="'onednn-prepacked' but the engine runs them on 'sgemm'"):
        check_profile_code_path(made, 1, product_path="sgemm")


def test_with_no_valid_shipped_profile_the_refusal_names_none() -> None:
    # The shipped AMD profile is refused on this engine (prepacked products): it is not offered.
    with pytest.raises(NoFittingProfileError) as e:
        check_profile(AMD, _facts("onednn-prepacked"), "builtin:smollm2-135m-cpu-1t")
    msg = str(e.value)
    assert "no shipped profile fits this machine" in msg and "shipped for it" not in msg
    assert "shipped for this machine: builtin:smollm2-135m-cpu-1t" not in msg
    # An engine the shipped profile does fit, given another (refused) profile, is offered it.
    other = FittedCostModel(0.01, meta={"model": "Llama-2-7B"})
    with pytest.raises(NoFittingProfileError, match="shipped for this machine: builtin:smollm2-135m-cpu-1t"):
        check_profile(other, _facts("sgemm"), "p.json")
