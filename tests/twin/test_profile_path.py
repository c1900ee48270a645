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


def _plan(proj: list[str], head: list[str] | None = None) -> dict[str, list[str]]:
    return {"projections": proj, "head": head or list(proj)}


def test_a_profile_made_with_other_product_paths_is_refused_naming_the_rows() -> None:
    """Issue 54 item 3: the profile records each row count's product path; an engine whose plan differs
    anywhere refuses it, naming the rows and both paths; the same plan is accepted."""
    made_plan = _plan(["transposed"] + ["blocked"] * 15 + ["prepacked"])
    made = FittedCostModel(0.01, meta={"provenance": {"device": "cpu", "dtype": "float32", "engine": {
        "small_batch_rows": 1, "cpu_product_paths": made_plan}}})
    check_profile_code_path(made, 1, product_paths=made_plan)
    runs = _plan(["transposed"] * 2 + ["prepacked"] * 15)
    with pytest.raises(ProfileError, match=r"projections of 2-16 rows: profile 'blocked', engine "
                                           r"'transposed'.*head of 2-16 rows"):
        check_profile_code_path(made, 1, product_paths=runs)
    # Only the head differs, only above 16 rows: still refused.
    head_only = _plan(made_plan["projections"], made_plan["projections"][:-1] + ["linear"])
    with pytest.raises(ProfileError, match=r"head of above 16 rows: profile 'prepacked', engine 'linear'"):
        check_profile_code_path(made, 1, product_paths=head_only)
    check_profile_code_path(made, 1, allow_mismatch=True, product_paths=runs)


def test_a_profile_from_before_the_plan_is_read_through_small_batch_rows() -> None:
    """The shipped AMD profile (transposed up to 4 rows, sgemm above) fits an engine with that plan only."""
    legacy = _plan(["transposed"] * 4 + ["linear"] * 13)
    check_profile_code_path(AMD, 4, product_paths=legacy)
    with pytest.raises(ProfileError, match=r"projections of 5\+ rows: profile 'linear', engine 'prepacked'"):
        check_profile_code_path(AMD, 4, product_paths=_plan(["transposed"] * 4 + ["prepacked"] * 13))
