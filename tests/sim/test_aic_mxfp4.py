"""gpt-oss's MXFP4 experts on the measured backend: each engine's activation mode, and MoE-TP layouts that
aic's TensorRT-LLM tables hold only as EP layouts priced at the EP layout over the same GPUs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

import aiconfigurator_core.sdk.operations as ops  # noqa: E402
from aiconfigurator_core.sdk import common  # noqa: E402
from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json  # noqa: E402

from twinserve.backends.sim.aic import AicCostModel  # noqa: E402
from twinserve.backends.sim.aic.mapping import held_mxfp4_mode, mxfp4_moe_mode  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def gpt_oss(hw: str, backend: str, tp: int, dp: int = 1, ep: int = 1) -> AicCostModel:
    key = (hw, backend, tp, dp, ep)
    if key not in _MODELS:
        m = resolve_row_model("openai/gpt-oss-120b").with_precision(Precision("bfloat16", "mxfp4", "auto"))
        _MODELS[key] = AicCostModel(m, get_hardware(hw), backend=backend, parallel=Parallelism(tp, dp, ep, 1))
    return _MODELS[key]


def moe_ops(graph_json: str) -> dict[str, dict]:
    """The graph's MoE ops by name: {'generation_moe': {...fields}, ...}."""
    out = {}
    for op in json.loads(graph_json):
        (kind, fields), = op.items()
        if kind in ("Moe", "MoeDispatch"):
            out[fields["name"]] = fields
    return out


# The development rows' failing layouts (simulate validate --rows dev): vLLM on B200 asked for MXFP8
# activations its tables do not hold; TensorRT-LLM's tables hold gpt-oss's experts at moe_tp 1 only.
@pytest.mark.parametrize("hw,backend,tp,dp,ep,mode", [
    pytest.param("B200", "vllm", 4, 1, 1, "w4a16_mxfp4", id="b200-vllm-tp4"),
    pytest.param("B200", "vllm", 1, 1, 1, "w4a16_mxfp4", id="b200-vllm-tp1"),
    pytest.param("B200", "trtllm", 4, 1, 1, "w4a8_mxfp4_mxfp8", id="b200-trtllm-tp4"),
    pytest.param("GB200", "trtllm", 2, 1, 1, "w4a8_mxfp4_mxfp8", id="gb200-trtllm-tp2"),
    pytest.param("H200", "trtllm", 8, 1, 1, "w4a16_mxfp4", id="h200-trtllm-tp8"),
    pytest.param("H200", "trtllm", 4, 1, 2, "w4a16_mxfp4", id="h200-trtllm-tp4-ep2"),
    pytest.param("B200", "trtllm", 1, 4, 2, "w4a8_mxfp4_mxfp8", id="b200-trtllm-adp4-ep2"),
])
def test_gpt_oss_layouts_price(hw: str, backend: str, tp: int, dp: int, ep: int, mode: str) -> None:
    c = gpt_oss(hw, backend, tp, dp, ep)
    par = c.par
    width = par.moe_tensor_parallel_size * par.expert_parallel_size
    for graph, phase in ((c.graph.tokens, "context"), (c.graph.decode_tokens, "generation")):
        found = moe_ops(graph)
        expert, pre = found[f"{phase}_moe"], found[f"{phase}_moe_pre_dispatch"]
        assert expert["quant_mode"] == mode
        # Dispatch and combine keep the layout's own sizes.
        assert (pre["moe_tp_size"], pre["moe_ep_size"]) == (par.moe_tensor_parallel_size, par.expert_parallel_size)
        db_layout = (expert["moe_tp_size"], expert["moe_ep_size"])
        if backend == "trtllm":
            assert db_layout == (1, width)  # the EP layout over the same GPUs
        else:
            assert db_layout == (par.moe_tensor_parallel_size, par.expert_parallel_size)
    # The expert row is aic's own answer at that key.
    m = c.model
    op = ops.MoE("q", m.num_moe_layers, m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok,
                 m.num_experts, *db_layout, common.MoEQuantMode[mode], "power_law_1.2", dp)
    want = EngineHandle.for_database(c.database).evaluate_ops_json(build_ops_json([op]), is_context=True,
                                                                     batch_size=1, s=1, x=64)[0][1]
    rows = dict(r[:2] for r in c._eval(c.graph.decode_tokens, is_context=True, batch_size=1, s=1, x=64))
    assert rows["generation_moe"] == pytest.approx(want, rel=1e-12)
    assert c.decode_tokens_time(64) > c.decode_tokens_time(1) > 0.0


@pytest.mark.parametrize("hw,backend,tp,ep", [
    pytest.param("H200", "vllm", 4, 1, id="h200-vllm-tp4"),      # moe_tp 4: vLLM's table holds it
    pytest.param("H200", "trtllm", 4, 4, id="h200-trtllm-tep4"),  # moe_ep 4: the table's own key
    pytest.param("H200", "trtllm", 1, 1, id="h200-trtllm-tp1"),
])
def test_a_layout_the_table_holds_is_queried_at_its_own_key(hw: str, backend: str, tp: int, ep: int) -> None:
    c = gpt_oss(hw, backend, tp, 1, ep)
    expert = moe_ops(c.graph.decode_tokens)["generation_moe"]
    assert (expert["moe_tp_size"], expert["moe_ep_size"]) == (tp // ep, ep)
    assert expert["quant_mode"] == "w4a16_mxfp4"


def test_other_moe_models_keep_their_layout() -> None:
    m = resolve_row_model("Qwen/Qwen3-235B-A22B").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
    c = AicCostModel(m, get_hardware("B200"), backend="trtllm", parallel=Parallelism(4, 1, 1, 1))
    expert = moe_ops(c.graph.decode_tokens)["generation_moe"]
    assert (expert["moe_tp_size"], expert["moe_ep_size"], expert["quant_mode"]) == (4, 1, "nvfp4")


def test_each_engines_mxfp4_activations() -> None:
    assert mxfp4_moe_mode("b200_sxm", "vllm") == "w4a16_mxfp4"
    assert mxfp4_moe_mode("b200_sxm", "trtllm") == "w4a8_mxfp4_mxfp8"
    assert mxfp4_moe_mode("gb300", "sglang") == "w4a8_mxfp4_mxfp8"
    assert mxfp4_moe_mode("rtx_pro_6000_server", "trtllm") == "w4a8_mxfp4_mxfp8"  # SM 120 is Blackwell
    assert mxfp4_moe_mode("h200_sxm", "trtllm") == "w4a16_mxfp4"
    assert mxfp4_moe_mode("b60", "vllm") == "w4a16_mxfp4"


def test_the_held_mxfp4_mode_stands_in() -> None:
    w4a8, w4a16 = common.MoEQuantMode.w4a8_mxfp4_mxfp8, common.MoEQuantMode.w4a16_mxfp4
    only_w4a16 = SimpleNamespace(_twinserve_modes={"moe": ["bfloat16", "w4a16_mxfp4"]})
    both = SimpleNamespace(_twinserve_modes={"moe": ["w4a16_mxfp4", "w4a8_mxfp4_mxfp8"]})
    neither = SimpleNamespace(_twinserve_modes={"moe": ["fp8"]})
    assert held_mxfp4_mode(only_w4a16, {"moe": w4a8})["moe"] is w4a16
    assert held_mxfp4_mode(both, {"moe": w4a8})["moe"] is w4a8
    assert held_mxfp4_mode(neither, {"moe": w4a8})["moe"] is w4a8  # check_precision names what exists
    nvfp4 = {"moe": common.MoEQuantMode.nvfp4}
    assert held_mxfp4_mode(only_w4a16, nvfp4) == nvfp4
