"""TensorRT-LLM's WIDEEP MoE backend on the measured backend: a decode step's MoE block is aic's large-EP one (the
NVLink two-sided all-to-all and its wide-EP expert compute; backends/sim/aic/graph.py _wide_ep_generation_ops), for
DeepSeek-R1 NVFP4 decode workers on GB200 NVL72 at EP > 8 and NVFP4 / FP8 ones on GB300 (whose all-to-all GB200's
tables price: WIDE_EP_A2A_PROXY) (sim/validate_recipes.py WIDE_EP_WORKERS)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def dsr1(wide: bool, ep: int = 32, backend: str = "trtllm", kernel: str = "default",
         hw: str = "GB200", quant: str = "nvfp4") -> AicCostModel:
    key = (wide, ep, backend, kernel, hw, quant)
    if key not in _MODELS:
        m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", quant, "fp8"))
        _MODELS[key] = AicCostModel(m, get_hardware(hw), backend=backend,
                                    parallel=Parallelism(1, ep, ep, 1), trtllm_wide_ep=wide, fp8_moe_kernel=kernel)
    return _MODELS[key]


def _ops(graph: str) -> dict[str, dict]:
    out = {}
    for entry in json.loads(graph):
        (kind, fields), = entry.items()
        if kind == "Overlap":
            for part in fields["group_a"] + fields["group_b"]:
                (k, f), = part.items()
                out[f["name"]] = {"kind": k, **f}
        out[fields["name"]] = {"kind": kind, **fields}
    return out


def test_both_graphs_hold_aics_large_ep_block() -> None:
    wide, fused = dsr1(True), dsr1(False)
    ops = _ops(wide.graph.decode_tokens)
    a2a = [f for f in ops.values() if f["kind"] == "MoeAllToAll"]
    assert {f["phase"] for f in a2a} == {"prepare", "dispatch", "combine"}
    # GB200: 4 GPUs a node in aic's system file, so EP 32 spans 8 of them
    assert all(f["comm_backend"] == "nvlink_two_sided" and f["node_num"] == 8 and f["moe_ep_size"] == 32
               for f in a2a)
    assert any(f["kind"] == "MoeExpertCompute" for f in ops.values())
    assert not any(f["kind"] == "MoeDispatch" for f in ops.values())
    assert any(f["kind"] == "MoeDispatch" for f in _ops(fused.graph.decode_tokens).values())
    # a decode worker's token graph (its MTP verify steps) carries the same generation block
    assert _ops(wide.graph.tokens).keys() >= {f["name"] for f in a2a} | {"generation_moe"}
    assert "context_moe" in _ops(fused.graph.tokens)
    # the routed experts' share (attention-DP steps rebalance it) is the large-EP expert compute's
    (part,) = [p for e in json.loads(wide.graph.tokens) if "Overlap" in e
               for p in e["Overlap"]["group_a"] if p.get("MoeExpertCompute", {}).get("name") == "generation_moe"]
    ms = sum(r[1] for r in wide._eval(json.dumps([part]), is_context=True, batch_size=1, s=1, x=32))
    assert ms > 0 and wide.expert_time(32) == pytest.approx(ms * 1e-3, rel=1e-12)


@pytest.mark.parametrize("rows", [8, 32, 64])
def test_a_decode_step_prices_the_large_ep_block_where_the_fused_one_was(rows: int) -> None:
    # The difference between the two decode prices is all in the MoE block: aic's large-EP block evaluated alone
    # against the fused Overlap evaluated alone.
    wide, fused = dsr1(True), dsr1(False)

    def block(cost: AicCostModel, kinds: tuple[str, ...]) -> float:
        g = [e for e in json.loads(cost.graph.decode_tokens) if next(iter(e)) in kinds]
        return sum(r[1] for r in cost._eval(json.dumps(g), is_context=True, batch_size=1, s=1, x=rows)) * 1e-3
    large = block(wide, ("Overlap", "Elementwise")) - block(fused, ("Elementwise",))
    fused_moe = block(fused, ("Overlap",))
    assert wide.decode_tokens_time(rows) - fused.decode_tokens_time(rows) == pytest.approx(large - fused_moe,
                                                                                          rel=1e-9)
    # the WIDEEP block is the cheaper one at these rows a rank (GB200 FP4, EP 32: 7.9-11.5 ms against 9.6-19.1)
    assert wide.decode_tokens_time(rows) < fused.decode_tokens_time(rows)


@pytest.mark.parametrize("ep, rows", [(32, 8), (32, 64), (16, 32), (16, 128)])
def test_a_gb300_wide_ep_step_prices_its_all_to_all_on_gb200s_tables_and_the_rest_on_gb300s(ep: int,
                                                                                            rows: int) -> None:
    # aic's GB300 TensorRT-LLM tables hold no NVLink all-to-all (graph.py WIDE_EP_A2A_PROXY): the block's
    # prepare / dispatch / combine are read from GB200's, the router, expert compute, shared expert and every
    # other op from GB300's, and the Overlap is the slower of its two sides, as aic prices it.
    gb300, gb200 = dsr1(True, ep, hw="GB300"), dsr1(True, ep)
    assert gb300.a2a_system == "gb200" and gb200.a2a_system == "gb200" and "gb200 tables" in gb300.describe()
    on300, on200 = dsr1(False, ep, hw="GB300")._eval, gb200._eval  # one evaluator per database

    def ms(ev, entries: list) -> float:
        return sum(r[1] for r in ev(json.dumps(entries), is_context=True, batch_size=1, s=1, x=rows))
    graph = json.loads(gb200.graph.decode_tokens)  # the same op list on both systems (4 GPUs a node in each)
    (ov,) = [e["Overlap"] for e in graph if "Overlap" in e]
    a2a = [p for p in ov["group_a"] if "MoeAllToAll" in p]
    routed = [p for p in ov["group_a"] if "MoeAllToAll" not in p]
    assert len(a2a) == 3 and all(p["MoeAllToAll"]["comm_backend"] == "nvlink_two_sided" for p in a2a)
    expect = (ms(on300, [e for e in graph if "Overlap" not in e])
              + max(ms(on300, routed) + ms(on200, a2a), ms(on300, ov["group_b"])))
    # ... with the NVFP4 dense GEMMs outside the block at their tuned price (aic/nvfp4_gemm.py: 0 or a saving)
    tuned = gb300.nvfp4_gemm_time(rows, decode=True)
    assert tuned <= 0.0 and tuned == gb300.nvfp4_gemm_time(rows, decode=False)
    assert gb300.decode_tokens_time(rows) == pytest.approx(expect * 1e-3 + tuned, rel=1e-9)
    assert gb300.tokens_time(rows) == pytest.approx(expect * 1e-3 + tuned, rel=1e-9)  # the token graph holds the same
    # GB300's own expert compute (its wide-EP table), not GB200's, and the experts' share is that op alone
    (experts,) = [p for p in routed if "MoeExpertCompute" in p]
    assert gb300.expert_time(rows) == pytest.approx(ms(on300, [experts]) * 1e-3, rel=1e-12)
    assert ms(on300, [experts]) != ms(on200, [experts])
    # past a few rows a rank the large-EP block is the cheaper one on GB300 too (at 8 rows, EP 32: 13.1 ms against
    # the fused block's 12.8)
    if rows >= 32:
        assert gb300.decode_tokens_time(rows) < dsr1(False, ep, hw="GB300").decode_tokens_time(rows)


@pytest.mark.parametrize("ep, rows", [(32, 32), (16, 128)])
def test_gb300_fp8_experts_keep_aics_moe_table_and_take_the_nvlink_all_to_all(ep: int, rows: int) -> None:
    # FP8 block-scaled experts (DEEPGEMM under ConfigurableMoE, TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED): aic's
    # generation block with its fused dispatch pair replaced by the NVLink two-sided prepare / dispatch / combine
    # (FP8 on the wire, GB200's tables), the experts, router and shared expert as the fused block prices them.
    wide, fused = dsr1(True, ep, hw="GB300", quant="fp8"), dsr1(False, ep, hw="GB300", quant="fp8")
    on200 = dsr1(True, ep)._eval  # GB200's database

    def ms(ev, entries: list) -> float:
        return sum(r[1] for r in ev(json.dumps(entries), is_context=True, batch_size=1, s=1, x=rows))
    (ov,) = [e["Overlap"] for e in json.loads(fused.graph.decode_tokens) if "Overlap" in e]
    kept = [p for p in ov["group_a"] if "MoeDispatch" not in p]
    assert len(kept) == len(ov["group_a"]) - 2 and any("Moe" in p for p in kept)  # router, experts
    a2a = json.loads(wide.graph.wide_a2a)
    assert [(p["MoeAllToAll"]["phase"], p["MoeAllToAll"]["comm_dtype"]) for p in a2a] == [
        ("prepare", "fp8"), ("dispatch", "fp8"), ("combine", "fp8")]
    assert json.loads(wide.graph.wide_routed) == kept and wide.graph.wide_shared == json.dumps(ov["group_b"])
    rest = [e for e in json.loads(fused.graph.decode_tokens) if "Overlap" not in e]
    expect = ms(fused._eval, rest) + max(ms(fused._eval, kept) + ms(on200, a2a), ms(fused._eval, ov["group_b"]))
    assert wide.decode_tokens_time(rows) == pytest.approx(expect * 1e-3, rel=1e-9)
    assert wide.tokens_time(rows) == pytest.approx(expect * 1e-3, rel=1e-9)
    assert wide.expert_time(rows) == fused.expert_time(rows)  # aic's DeepGEMM experts either way
    assert wide.decode_tokens_time(rows) < fused.decode_tokens_time(rows)


def test_wide_ep_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(AicError, match="aic_trtllm_wide_ep"):
        dsr1(True, backend="sglang")
    with pytest.raises(AicError, match="aic_trtllm_wide_ep"):
        dsr1(True, ep=1)  # TP 1 x 1 rank: no expert split
    with pytest.raises(AicError, match="aic_trtllm_wide_ep"):
        dsr1(True, kernel="trtllm")  # the TRTLLM MoE backend is another backend


@pytest.mark.parametrize("system, precision, ep, wide", [
    ("gb200", "fp4", 32, True), ("gb200", "fp4", 16, True),
    ("gb200", "fp4", 8, False),   # EP <= 8: CUTLASS / TRTLLM in the deployment guide's matrix
    ("gb200", "fp8", 32, False),  # WIDEEP without EPLB there, but aic holds no Blackwell FP8 wide-EP table
    ("gb300", "fp4", 32, True), ("gb300", "fp4", 16, True),  # CUTEDSL over NVLink (all-to-all: GB200's tables)
    ("gb300", "fp4", 8, False),   # the DEP 4 / DEP 8 recipes run CUTLASS
    ("gb300", "fp8", 32, True), ("gb300", "fp8", 16, True),  # DEEPGEMM under NVLINK_TWO_SIDED
    ("gb300", "fp8", 8, False),
    ("b200_sxm", "fp4", 8, False),
])
def test_gb200_gb300_fp4_decode_workers_past_ep8_run_wideep(system, precision, ep, wide) -> None:
    from twinserve.sim.validate_recipes import disagg_wide_ep
    row = pd.Series({"backend": "trtllm", "model": "DeepSeek-R1", "system": system, "precision": precision})
    assert disagg_wide_ep(row, ep) is wide


def test_a_gb200_fp4_disagg_rows_decode_replicas_run_wideep_under_aic_only() -> None:
    from twinserve.sim.validate_rows import load_rows, row_plan
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "disagg")
                & (rows["system"] == "gb200") & (rows["precision"] == "fp4") & (rows["isl"] == 1024)
                & (rows["osl"] == 1024) & (rows["concurrency"] == 666)]
    plan = row_plan(pick.iloc[0], "aic")
    reps = plan.cfg.cluster.replicas
    assert [r.get("engine.aic_trtllm_wide_ep", False) for r in reps][-1] is True  # the decode worker (EP 32)
    assert not reps[0].get("engine.aic_trtllm_wide_ep", False)  # the prefill worker (EP 4)
    roof = row_plan(pick.iloc[0], "roofline").cfg.cluster.replicas
    assert not any(r.get("engine.aic_trtllm_wide_ep", False) for r in roof)
