"""The quant modes a study checks against aic's database, read without building aic's Python tables
(backends/sim/aic/mapping.supported_modes)."""
from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core")

from aiconfigurator_core.sdk import common  # noqa: E402

from twinserve.backends.sim.aic.cost_model import AicCostModel, _load  # noqa: E402
from twinserve.backends.sim.aic.mapping import (AicError, check_precision, resolve_version, sdk,  # noqa: E402
                                                supported_modes)
from twinserve.backends.sim.catalog import get_hardware, get_model  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402


def _db(system: str, backend: str):
    return _load(sdk(), system, backend, resolve_version(system, backend, ""))


def test_the_listing_is_aics_own() -> None:
    # TensorRT-LLM on B200: GEMMs in fp8 with its scale tables (so fp8_static is listed), nvfp4 and fp8_block,
    # MoE in MXFP4 lanes beside nvfp4 / fp8; the same names aic's own support matrix gives.
    db = _db("b200_sxm", "trtllm")
    for table in ("gemm", "moe", "generation_attention"):
        assert supported_modes(db, table) == sorted(db.supported_quant_mode[table]), table
    assert "fp8_static" in supported_modes(db, "gemm")


class _Refuse:
    """Stands in for aic's support matrix: any read means aic's Python tables are being built."""

    def __getitem__(self, table: str):
        raise AssertionError(f"aic's supported_quant_mode[{table!r}] was read")


@pytest.mark.parametrize("name,quant,backend", [("Llama-3.1-8B", "fp8", "trtllm"),  # fp8_gemm_mode's check
                                                ("Llama-3.1-8B", "none", "vllm")])
def test_a_cost_model_does_not_build_aics_python_tables(monkeypatch: pytest.MonkeyPatch, name: str, quant: str,
                                                        backend: str) -> None:
    db = _db("h200_sxm", backend)
    monkeypatch.setattr(db, "supported_quant_mode", _Refuse())
    monkeypatch.setitem(db.__dict__, "_twinserve_modes", {})  # listed afresh from the engine's table views
    model = get_model(name).with_precision(Precision("bfloat16", quant, "auto"))
    c = AicCostModel(model, get_hardware("H200"), 1, backend)
    assert c.step_time(0, 0, 0, 0.0, 8, 1000) > 0
    assert db.__dict__["_twinserve_modes"]["gemm"]  # it did check the precision


def test_a_mode_the_database_lacks_is_named_with_what_it_has() -> None:
    db = _db("h200_sxm", "vllm")
    with pytest.raises(AicError) as err:
        check_precision(db, {"gemm": common.GEMMQuantMode.int4_wo}, Precision("bfloat16", "int4", "auto"))
    assert "no gemm timings in int4_wo" in str(err.value) and "bfloat16" in str(err.value)
