"""SGLang DeepSeek-R1 FP4 B200 rows with no image: InferenceX's script before PR #204 passed --enable-ep-moe
(SGLang: ep_size = tp_size), so their experts run expert-parallel over the TP ranks although the export says
EP 1 (sim/validate_recipes.py _dsr1_fp4_b200_ep_moe)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pandas as pd
import pytest

from twinserve.sim.validate_recipes import row_recipe, row_version

_IX = "source_file=2026-04-06.csv"  # an InferenceX export (sim/validate_protocol.harness)


def _row(**kw) -> pd.Series:
    base = dict(silicon_data_source=_IX, backend="sglang", model="DeepSeek-R1", system="b200_sxm",
                precision="fp4", mode="agg", isl=1024, osl=1024, concurrency=32, tp_size=4,
                backend_version=float("nan"))
    base.update(kw)
    return pd.Series(base)


@pytest.mark.parametrize("version", [float("nan"), None, "", " "])
def test_a_row_without_an_image_keys_the_image_tables_as_empty(version) -> None:
    assert row_version(_row(backend_version=version)) == ""
    assert row_version(_row(backend_version="0.5.9")) == "0.5.9"


def test_the_no_image_fp4_rows_ran_the_pre_204_script_with_ep_moe() -> None:
    r = row_recipe(_row())
    assert r.expert_parallel and "--enable-ep-moe" in r.source
    # The pre-#204 script's other flags are @1fc5d73's.
    assert (r.stream_interval, r.recv_interval, r.chunked_prefill_size, r.max_running_requests,
            r.mem_fraction) == (10, 30, 16384, 256, 0.85)


@pytest.mark.parametrize("kw", [
    {"backend_version": "0.5.9"},  # @1fc5d73 with --ep-size $EP_SIZE: the row's own EP
    {"precision": "fp8"},  # the FP8 script never passed --enable-ep-moe (InferenceX PR #242)
    {"system": "b300_sxm"},  # the B300 copy (@5632483) passes --ep-size $EP_SIZE
    {"mode": "disagg"},
])
def test_other_sglang_dsr1_rows_keep_their_layout(kw) -> None:
    assert not row_recipe(_row(**kw)).expert_parallel


def _ops(node: Any) -> Iterator[tuple[str, dict]]:
    """Every (kind, fields) op of an aic graph's JSON, those nested in overlap groups too."""
    if isinstance(node, list):
        for item in node:
            yield from _ops(item)
    elif isinstance(node, dict):
        for kind, fields in node.items():
            if isinstance(fields, dict) and "name" in fields:
                yield kind, fields
                for inner in fields.values():
                    yield from _ops(inner)


def _dev_no_image_row(tp: int) -> pd.Series:
    from twinserve.sim.validate_cli import select_rows
    from twinserve.sim.validate_rows import load_rows
    rows = select_rows(load_rows(), backend="sglang", model="DeepSeek-R1", rows="dev")
    pick = rows[(rows["system"] == "b200_sxm") & (rows["precision"] == "fp4") & (rows["mode"] == "agg")
                & rows["backend_version"].isna() & (pd.to_numeric(rows["tp_size"], errors="coerce") == tp)]
    return pick.iloc[0]


@pytest.mark.parametrize("tp", [4, 8])
def test_a_no_image_fp4_rows_experts_are_priced_expert_parallel_by_aics_sglang_table(tp: int) -> None:
    pytest.importorskip("aiconfigurator_core")
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json

    from twinserve.sim.build import build_cost_models
    from twinserve.sim.validate_rows import row_plan
    row = _dev_no_image_row(tp)
    assert (int(row["moe_tp_size"]), int(row["moe_ep_size"])) == (tp, 1)  # what the export says
    plan = row_plan(row, "aic")
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (tp, 1, tp)
    assert "--enable-ep-moe" in plan.layout
    _, _, _, cost = build_cost_models(plan.cfg)
    assert cost.backend == "sglang"
    expert = next(f for kind, f in _ops(json.loads(cost.graph.decode_tokens))
                  if kind == "Moe" and f["name"] == "generation_moe")
    # The experts at moe_tp 1 x moe_ep TP, NVFP4: aic's SGLang B200 table holds them only from the FlashInfer
    # TRTLLM kernel (kernel_source sglang_flashinfer_trtllm_moe), the runner the script selects.
    assert (expert["moe_tp_size"], expert["moe_ep_size"], expert["quant_mode"]) == (1, tp, "nvfp4")
    m = cost.model
    op = ops.MoE("q", m.num_moe_layers, m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok,
                 m.num_experts, 1, tp, common.MoEQuantMode.nvfp4, expert["workload_distribution"], 1)
    want = EngineHandle.for_database(cost.database).evaluate_ops_json(build_ops_json([op]), is_context=True,
                                                                        batch_size=1, s=1, x=64)[0][1]
    # The graph's expert op (inside its shared-expert overlap group), priced alone, is aic's answer at that key.
    got = cost._eval(json.dumps([{"Moe": expert}]), is_context=True, batch_size=1, s=1, x=64)[0][1]
    assert got == pytest.approx(want, rel=1e-12) and got > 0.0
