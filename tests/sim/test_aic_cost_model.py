"""The measured backend (cost_model = "aic"): step prices are aiconfigurator-core's own per-op answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

import aiconfigurator_core.sdk.operations as ops  # noqa: E402
from aiconfigurator_core.sdk import common  # noqa: E402
from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json  # noqa: E402
from aiconfigurator_core.sdk.operations.attention import resolved_lane_order_for_op  # noqa: E402

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware, get_model  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def cost(name: str = "Llama-3.1-8B", hw: str = "H200", tp: int = 1, quant: str = "none",
         kv: str = "auto", backend: str = "vllm", version: str = "") -> AicCostModel:
    """One AicCostModel per configuration for the whole module (the database loads once)."""
    key = (name, hw, tp, quant, kv, backend, version)
    if key not in _MODELS:
        model = get_model(name).with_precision(Precision("bfloat16", quant, kv))
        _MODELS[key] = AicCostModel(model, get_hardware(hw), tp, backend, version)
    return _MODELS[key]


def sdk_step(c: AicCostModel, pt: int, ps: int, pc: int, ds: int, dc: int) -> float:
    """The same step from aic's queries, written out op by op here (dense model, GQA, no window)."""
    m, tp, db = c.model, c.tp, c.database
    h, d, L = m.hidden_size, m.head_dim, m.num_layers
    heads, kvh, inter = m.num_heads // tp, m.kv_heads_per_gpu(tp), m.intermediate_size // tp
    gq = {"none": common.GEMMQuantMode.bfloat16, "fp8": common.GEMMQuantMode.fp8_static}[m.precision.quantization]
    kvq = {"auto": common.KVCacheQuantMode.bfloat16, "fp8": common.KVCacheQuantMode.fp8}[m.precision.kv_cache_dtype]
    ev = EngineHandle.for_database(db).evaluate_ops_json

    def q(op_list: list, **kw: int) -> float:
        return sum(r[1] for r in ev(build_ops_json(op_list), **kw)) * 1e-3

    tokens, seqs = pt + ds, ps + ds
    linear = [ops.Embedding("e", 1, m.vocab_size // tp, h, 0.3), ops.ElementWise("n1", L, 2 * h, 2 * h, 0.8),
              ops.GEMM("qkv", L, heads * d + 2 * kvh * d, h, gq),
              ops.GEMM("o", L, h, heads * d, gq, low_precision_input=True),
              ops.ElementWise("n2", L, 2 * h, 2 * h, 0.8), ops.GEMM("up", L, 2 * inter, h, gq),
              ops.ElementWise("act", L, 2 * inter, inter, 0.8),
              ops.GEMM("down", L, h, inter, gq, low_precision_input=True),
              ops.CustomAllReduce("ar0", 1, h, tp), ops.CustomAllReduce("ar1", L, h, tp),
              ops.CustomAllReduce("ar2", L, h, tp)]
    t = q(linear, is_context=True, batch_size=1, s=1, x=tokens)
    t += q([ops.GEMM("lm", 1, m.vocab_size // tp, h, common.GEMMQuantMode.bfloat16)], is_context=True,
           batch_size=1, s=1, x=seqs)
    if ps:
        a = ops.ContextAttention("ca", L, heads, kvh, kvq, common.FMHAQuantMode.bfloat16, head_size=d)
        a._lane_order = resolved_lane_order_for_op(db, "_context_attention_data", None)
        t += q([a], is_context=True, batch_size=ps, s=pt // ps, prefix=pc // ps)
    if ds:
        g = ops.GenerationAttention("ga", L, heads, kvh, kvq, head_size=d)
        g._lane_order = resolved_lane_order_for_op(db, "_generation_attention_data", None)
        t += q([g], is_context=False, batch_size=ds, s=dc // ds + 1)
    return t


# Shapes whose decode context + 1 sits on the 16-token grid, where the price is the table's own.
SHAPES = [
    pytest.param("Llama-3.1-8B", 1, "none", "auto", (2048, 1, 0, 0, 0), id="prefill"),
    pytest.param("Llama-3.1-8B", 1, "none", "auto", (0, 0, 0, 32, 32 * 1023), id="decode-1k"),
    pytest.param("Llama-3.1-8B", 1, "none", "auto", (0, 0, 0, 32, 32 * 4095), id="decode-4k"),
    pytest.param("Llama-3.1-8B", 1, "none", "auto", (512, 1, 1536, 63, 63 * 2047), id="mixed"),
    pytest.param("Llama-3.1-8B", 2, "none", "auto", (512, 1, 1536, 63, 63 * 2047), id="mixed-tp2"),
    pytest.param("Llama-3.1-70B", 4, "fp8", "fp8", (1024, 2, 0, 64, 64 * 1999), id="fp8-tp4"),
]


@pytest.mark.parametrize("name,tp,quant,kv,shape", SHAPES)
def test_price_is_the_databases_sum_of_ops(name: str, tp: int, quant: str, kv: str, shape: tuple) -> None:
    pt, ps, pc, ds, dc = shape
    c = cost(name, tp=tp, quant=quant, kv=kv)
    pa = sum(pt // ps * (pc // ps + pt // ps / 2) for _ in range(ps)) if ps else 0.0
    want = sdk_step(c, pt, ps, pc, ds, dc)
    assert c.step_time(pt, ps, pc, pa, ds, dc) == pytest.approx(want, rel=1e-9)


# The tables are measurements: a neighbour's price dips up to 5.7% (Llama-3.1-8B, H200, vLLM 0.24.0);
# doubling the rows or the context never prices a step cheaper.
DIP = 0.06


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 200), extra=st.integers(1, 40), ctx=st.integers(0, 6000),
       longer=st.integers(1, 3000), prefill=st.sampled_from([0, 256]))
def test_more_rows_or_longer_context_never_cheaper(rows: int, extra: int, ctx: int, longer: int,
                                                    prefill: int) -> None:
    c = cost()
    ps = 1 if prefill else 0
    pa = prefill * prefill / 2

    def step(n: int, context: int) -> float:
        return c.step_time(prefill, ps, 0, pa, n, n * context)

    base = step(rows, ctx)
    assert step(rows + extra, ctx) >= base * (1 - DIP)
    assert step(rows, ctx + longer) >= base * (1 - DIP)
    assert step(2 * rows, ctx) >= base
    assert step(rows, 2 * ctx + 16) >= base


def test_prices_are_memoized_and_identical() -> None:
    c = cost()
    shapes = [(300, 2, 100, 300 * 250.0, 17, 17 * 900), (0, 0, 0, 0.0, 5, 12345), (64, 1, 0, 2048.0, 0, 0)]
    first = [c.step_time(*s) for s in shapes]
    size = c.cache_size()
    assert [c.step_time(*s) for s in shapes] == first
    assert c.cache_size() == size


def test_host_overheads_add_only_when_set() -> None:
    c = cost()
    shape = (0, 0, 0, 0.0, 8, 8000)
    padded = AicCostModel(c.model, c.hardware, 1, step_overhead_s=1e-3, per_seq_overhead_s=1e-5)
    assert padded.step_time(*shape) == pytest.approx(c.step_time(*shape) + 1e-3 + 8e-5)


def test_kernel_scale_multiplies_the_kernel_sum_before_host_time() -> None:
    c = cost()
    s = AicCostModel(c.model, c.hardware, 1, kernel_scale=1.07, step_overhead_s=1e-3, per_seq_overhead_s=1e-5)
    for shape, seqs in (((0, 0, 0, 0.0, 8, 8000), 8), ((512, 1, 0, 512 * 256.0, 4, 4000), 5)):
        assert s.step_time(*shape) == pytest.approx(1.07 * c.step_time(*shape) + 1e-3 + 1e-5 * seqs, rel=1e-12)
    # Consecutive decode steps priced in one call are the floats step_time gives, scale and host in.
    durations, _ = s.decode_step_times(8, 8000, 6, 0.0, 1e9)
    assert durations == [s.step_time(0, 0, 0, 0.0, 8, 8000 + 8 * i) for i in range(6)]
    with pytest.raises(AicError, match="aic_kernel_scale 0.0: must be > 0"):
        AicCostModel(c.model, c.hardware, 1, kernel_scale=0.0)


def test_each_engines_serving_terms_on_a_decode_step() -> None:
    """SERVING_TERMS (fitted on development rows): vLLM 7% over aic's kernels and no host time; SGLang
    0.8 ms a step + 10 us a sequence; TensorRT-LLM aic's kernels alone."""
    from twinserve.backends.sim.aic.cost_model import serving_terms
    c = cost()
    shape = (0, 0, 0, 0.0, 32, 32 * 2000)
    kernels = c.step_time(*shape)

    def served(backend: str) -> float:
        t = serving_terms(backend)
        return AicCostModel(c.model, c.hardware, 1, kernel_scale=t.kernel_scale, step_overhead_s=t.step_s,
                            per_seq_overhead_s=t.per_seq_s).step_time(*shape)

    assert served("vllm") == pytest.approx(1.07 * kernels, rel=1e-12)
    assert served("sglang") == pytest.approx(kernels + 0.8e-3 + 32 * 10e-6, rel=1e-12)
    assert served("trtllm") == kernels
    assert serving_terms("tgi") == serving_terms("trtllm")  # an unknown engine: kernels only


def test_missing_gpu_names_the_mapped_ones() -> None:
    with pytest.raises(AicError, match=r"hardware 'MI300X'.*h200 -> h200_sxm") as err:
        AicCostModel(get_model("Llama-3.1-8B"), get_hardware("MI300X"), 1)
    assert err.value.field == "hardware"


def test_missing_version_lists_the_installed_ones() -> None:
    with pytest.raises(AicError, match=r"no vllm version '0\.1\.0' for h200_sxm; installed: 0\.24\.0") as err:
        cost(version="0.1.0")
    assert err.value.field == "aic_version"


def test_missing_model_shape_names_it_and_what_exists() -> None:
    # SmolLM2-135M: 3 KV heads of 64, a GQA shape vLLM's attention tables were not measured on.
    with pytest.raises(AicError, match=r"no context attention timings for SmolLM2-135M.*it has .*\(8, 128, 0\)"):
        cost("SmolLM2-135M")


def test_a_missing_expert_table_is_not_called_a_linear_layer() -> None:
    # A development row aic's TensorRT-LLM 1.3.0rc20 H100 database cannot price: it holds no fp8_block MoE
    # rows for gpt-oss-120b's experts at this split. The error carries aic's own MoE key under a label that
    # covers the expert block (it read "no linear layers timings" before).
    from twinserve.core.errors import TwinserveError
    from twinserve.sim.build import build
    from twinserve.sim.validate_rows import load_rows, prepare_rows, row_study

    rows = prepare_rows(load_rows())
    row = rows[rows["id"] == "openai_gpt_oss_120b_openai_gpt_oss_120b_h100_sxm_trtllm_agg_4000x1000_c160_tp4_epnone_5"]
    with pytest.raises(TwinserveError) as err:
        build(row_study(row.iloc[0], "aic"))
    msg = str(err.value)
    assert "MoE data missing" in msg and "/ MoE /" in msg
    assert "no linear layers timings" not in msg


def test_missing_precision_names_the_tables() -> None:
    with pytest.raises(AicError, match=r"no gemm timings in int4_wo .*it has: bfloat16") as err:
        cost(quant="int4")
    assert err.value.field == "quantization"


def test_moe_prices_the_expert_block() -> None:
    c = cost("Qwen3-30B-A3B", tp=2, quant="fp8")
    assert "context_moe" in c.graph.names
    moe = [r for r in c._eval(c.graph.tokens, is_context=True, batch_size=1, s=1, x=256) if r[0] == "context_moe"]
    assert moe and moe[0][1] > 0.0


def test_simulate_run_with_aic_exits_zero(tmp_path: Path) -> None:
    study = tmp_path / "s.toml"
    study.write_text('[engine]\nmodel = "Llama-3.1-8B"\nhardware = "H200"\ncost_model = "aic"\n'
                     '[workload]\nnum_requests = 40\nrate = 8.0\nprompt_mean = 500\noutput_mean = 50\n')
    run = subprocess.run([sys.executable, "-m", "twinserve.sim.cli", "--out", str(tmp_path / "out"), "run",
                          "--config", str(study)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "aic cost model" in run.stdout


def test_simulate_run_with_unknown_aic_version_exits_two(tmp_path: Path) -> None:
    study = tmp_path / "s.toml"
    study.write_text('[engine]\nmodel = "Llama-3.1-8B"\nhardware = "H200"\ncost_model = "aic"\n'
                     'aic_version = "9.9"\n[workload]\nnum_requests = 5\n')
    run = subprocess.run([sys.executable, "-m", "twinserve.sim.cli", "--out", str(tmp_path / "out"), "run",
                          "--config", str(study)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 2
    assert "s.toml:5: field 'engine.aic_version'" in run.stderr and "installed: 0.24.0" in run.stderr


@pytest.mark.parametrize("path,tp,quant,kv", [("meta-llama/Meta-Llama-3.1-8B", 1, "none", "auto"),
                                              ("meta-llama/Meta-Llama-3.1-70B", 4, "fp8", "fp8"),
                                              ("Qwen/Qwen3-32B", 2, "none", "auto")])  # q/k norm
def test_decode_and_prefill_equal_aics_own_step_estimate(path: str, tp: int, quant: str, kv: str) -> None:
    # aic's compiled engine for the same model: its decode step at s = isl + osl // 2 + 1 and its
    # one-request prefill are the same op sums (its decode context 2,016 sits on our 16-token grid).
    from twinserve.backends.sim.aic_models import resolve_row_model
    engine = EngineHandle.compile(path, "h200_sxm", "vllm", tp_size=tp, gemm_quant_mode={"none": "bfloat16",
                                  "fp8": "fp8_static"}[quant], kvcache_quant_mode={"auto": "bfloat16"}.get(kv, kv))
    c = AicCostModel(resolve_row_model(path).with_precision(Precision("bfloat16", quant, kv)),
                     get_hardware("H200"), tp)
    for rows in (1, 64):
        sdk_ms = engine.decode_step_latency(rows, 2000, 30)
        assert c.step_time(0, 0, 0, 0.0, rows, rows * 2015) * 1e3 == pytest.approx(sdk_ms, rel=1e-9)
    for isl in (2048, 4000):
        sdk_ms = engine.predict_prefill_latency(1, isl)
        assert c.step_time(isl, 1, 0, isl * isl / 2, 0, 0) * 1e3 == pytest.approx(sdk_ms, rel=1e-9)


@pytest.mark.parametrize("system,hw,backend", [("b200_sxm", "B200", "trtllm"), ("h200_sxm", "H200", "trtllm"),
                                               ("h200_sxm", "H200", "vllm")])
def test_fp8_gemms_are_static_per_tensor_as_aics_checkpoint_reader_maps_them(system: str, hw: str,
                                                                              backend: str) -> None:
    # A per-tensor FP8 checkpoint (no dynamic activations: ModelOpt's) is aic's fp8_static, and an fp8
    # study's decode step is aic's compiled engine for that checkpoint, not for dynamic per-tensor FP8
    # (on TensorRT-LLM B200 Llama-3.1-70B TP 8 at 4 rows the dynamic one prices 1.5x the static).
    from aiconfigurator_core.sdk.models.helpers import _infer_quant_modes_from_raw_config
    from twinserve.backends.sim.aic_models import resolve_row_model
    assert _infer_quant_modes_from_raw_config({"quant_algo": "fp8"})["gemm_quant_mode"] \
        is common.GEMMQuantMode.fp8_static
    path = "meta-llama/Meta-Llama-3.1-70B"
    c = AicCostModel(resolve_row_model(path).with_precision(Precision("bfloat16", "fp8", "fp8")), get_hardware(hw),
                     8, backend)
    static, dynamic = (EngineHandle.compile(path, system, backend, tp_size=8, gemm_quant_mode=gq,
                                            kvcache_quant_mode="fp8") for gq in ("fp8_static", "fp8"))
    for rows in (4, 64):
        ours = c.step_time(0, 0, 0, 0.0, rows, rows * 2015) * 1e3
        assert ours == pytest.approx(static.decode_step_latency(rows, 2000, 30), rel=1e-9)
        if backend == "trtllm":  # vLLM's dynamic GEMMs price a few per cent over its static ones
            assert dynamic.decode_step_latency(rows, 2000, 30) > ours * 1.1


def test_fp8_is_static_only_for_static_checkpoints_the_database_can_price() -> None:
    from types import SimpleNamespace
    from twinserve.backends.sim.aic.mapping import fp8_gemm_mode, static_fp8_checkpoint
    fp8 = {"gemm": common.GEMMQuantMode.fp8}
    without = SimpleNamespace(_twinserve_modes={"gemm": ["bfloat16", "fp8"]})
    with_ = SimpleNamespace(_twinserve_modes={"gemm": ["bfloat16", "fp8", "fp8_static"]})
    assert fp8_gemm_mode(with_, fp8, True)["gemm"] is common.GEMMQuantMode.fp8_static
    assert fp8_gemm_mode(without, fp8, True)["gemm"] is common.GEMMQuantMode.fp8
    assert fp8_gemm_mode(with_, fp8, False)["gemm"] is common.GEMMQuantMode.fp8
    bf = {"gemm": common.GEMMQuantMode.bfloat16}
    assert fp8_gemm_mode(with_, bf, True) == bf
    assert static_fp8_checkpoint("Llama-3.1-70B", False) and static_fp8_checkpoint("Meta-Llama-3.1-8B", False)
    assert not any(static_fp8_checkpoint(n, moe) for n, moe in (("Qwen3-32B", False), ("DeepSeek-R1", True),
                                                                 ("Llama-4-Scout-17B-16E", True)))
    # Block-scaled checkpoints keep dynamic per-tensor FP8 GEMMs in the graph.
    assert '"fp8_static"' not in _deepseek("trtllm").graph.decode_tokens
    assert '"fp8_static"' not in cost("Qwen3-32B", tp=2, quant="fp8", kv="fp8", backend="trtllm").graph.tokens


@pytest.mark.parametrize("path,system,hw,backend,tp,ep,quant,gemm_q,moe_q", [
    pytest.param("Qwen/Qwen3-30B-A3B", "h200_sxm", "H200", "vllm", 2, 1, "none", "bfloat16", "bfloat16", id="moe"),
    pytest.param("Qwen/Qwen3-235B-A22B", "b200_sxm", "B200", "trtllm", 4, 4, "nvfp4", "nvfp4", "nvfp4",
                 id="moe-ep4-nvfp4-b200"),
    pytest.param("openai/gpt-oss-120b", "h200_sxm", "H200", "vllm", 2, 1, "mxfp4", "bfloat16", "w4a16_mxfp4",
                 id="gpt-oss-mxfp4-window"),
])
def test_moe_decode_equals_aics_own_step_estimate(path: str, system: str, hw: str, backend: str, tp: int,
                                                  ep: int, quant: str, gemm_q: str, moe_q: str) -> None:
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    kv = "bfloat16" if quant == "none" else "fp8"
    engine = EngineHandle.compile(path, system, backend, tp_size=tp, moe_tp_size=tp // ep, moe_ep_size=ep,
                                  gemm_quant_mode=gemm_q, moe_quant_mode=moe_q, kvcache_quant_mode=kv)
    model = resolve_row_model(path).with_precision(Precision("bfloat16", quant, "auto" if kv == "bfloat16" else kv))
    c = AicCostModel(model, get_hardware(hw), backend=backend, parallel=Parallelism(tp, 1, ep, 1))
    for rows in (1, 64):
        sdk_ms = engine.decode_step_latency(rows, 2000, 30)
        # Less what TensorRT-LLM's tuned NVFP4 GEMMs save over aic's untuned table (aic/nvfp4_gemm.py).
        tuned = c.nvfp4_gemm_time(rows, decode=True)
        assert (tuned < 0) == (backend == "trtllm" and gemm_q == "nvfp4")
        assert (c.step_time(0, 0, 0, 0.0, rows, rows * 2015) - tuned) * 1e3 == pytest.approx(sdk_ms, rel=1e-9)


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_mla_decompresses_kv_on_prefill_tokens_only(backend: str) -> None:
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    c = AicCostModel(m, get_hardware("B200"), backend=backend, parallel=Parallelism(8, 1, 8, 1))
    ev = EngineHandle.for_database(c.database).evaluate_ops_json
    kv_b = ops.GEMM("kv_b", m.num_layers, 16 * (128 + 128), 512, common.GEMMQuantMode.fp8)
    kv_b_ms = sum(r[1] for r in ev(build_ops_json([kv_b]), is_context=True, batch_size=1, s=512))
    rows = dict((r[0], r[1]) for r in ev(c.graph.context_attn, is_context=True, batch_size=1, s=512))
    assert rows["mla_kv_b_proj_gemm"] == pytest.approx(kv_b_ms, rel=1e-12)
    assert "mla_kv_b_proj_gemm" not in c.graph.names  # not on decode rows: absorbed into the query
    assert c.context_attention_time(1, 512, 0) > kv_b_ms * 1e-3


def test_decode_step_times_are_step_times_floats() -> None:
    c = cost()
    durations, ends = c.decode_step_times(37, 37 * 990, 300, 5.0, 1e9)
    t, context = 5.0, 37 * 990
    for d, e in zip(durations, ends):
        assert d == c.step_time(0, 0, 0, 0.0, 37, context)
        t += d
        assert e == t
        context += 37
    assert len(durations) == 300


def test_a_studys_parallel_layout_reaches_the_measured_backend() -> None:
    from twinserve.sim.build import build_cost_models
    from twinserve.sim.config import StudyConfig
    cfg = StudyConfig()
    e = cfg.engine
    e.model, e.hardware, e.cost_model = "Qwen3-30B-A3B", "H200", "aic"
    e.tensor_parallel_size, e.expert_parallel_size = 2, 2
    _, _, _, c = build_cost_models(cfg)
    assert (c.par.tensor_parallel_size, c.par.expert_parallel_size) == (2, 2)
    one = cost("Qwen3-30B-A3B", tp=2)  # the same GPUs without expert parallelism
    assert c.tokens_time(256) != one.tokens_time(256)


def _deepseek(backend: str, hw: str = "H200", tp: int = 8, ep: int = 1) -> AicCostModel:
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    return AicCostModel(m, get_hardware(hw), backend=backend, parallel=Parallelism(tp, 1, ep, 1))


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_mla_moe_decode_overlaps_shared_experts_and_routes_at_101(backend: str) -> None:
    # aic's DeepSeekModel (models/deepseek.py): a decode step runs the shared experts beside the routed
    # ones (OverlapOp: the slower of the two), tokens routed by a power law of exponent 1.01; a step
    # with prefill tokens runs them one after the other. Written out op by op from aic's ops here.
    c = _deepseek(backend)
    m, ev = c.model, EngineHandle.for_database(c.database).evaluate_ops_json
    L, h, inter, k, e = m.num_moe_layers, m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts
    fp8, q = common.GEMMQuantMode.fp8, common.MoEQuantMode.fp8_block

    def price(op_list: list, rows: int) -> float:
        return sum(r[1] for r in ev(build_ops_json(op_list), is_context=True, batch_size=1, s=1, x=rows))

    for rows in (4, 64):
        routed = price([ops.GEMM("r", L, e, h, common.GEMMQuantMode.bfloat16),
                        ops.MoEDispatch("pre", L, h, k, e, 8, 1, 1, True, quant_mode=q, is_context=False,
                                        backend=backend),
                        ops.MoE("moe", L, h, inter, k, e, 8, 1, q, "power_law_1.01", 1),
                        ops.MoEDispatch("post", L, h, k, e, 8, 1, 1, False, quant_mode=q, is_context=False,
                                        backend=backend)], rows)
        shared = price([ops.GEMM("su", L, 2 * inter // 8, h, fp8), ops.ElementWise("sa", L, 2 * inter // 8,
                        inter // 8, 0.8), ops.GEMM("sd", L, h, inter // 8, fp8)], rows)
        answer = dict((r[0], r[1]) for r in ev(c.graph.decode_tokens, is_context=True, batch_size=1, s=1, x=rows))
        assert answer["generation_moe_overlap"] == pytest.approx(max(routed, shared), rel=1e-12)
        assert routed > shared  # the overlap hides the shared experts here
        with_prefill = dict((r[0], r[1]) for r in ev(c.graph.tokens, is_context=True, batch_size=1, s=1, x=rows))
        assert "generation_moe_overlap" not in with_prefill
        assert with_prefill["context_shared_gate_up_gemm"] > 0  # shared experts in series on a prefill step
    assert c.step_time(0, 0, 0, 0.0, 64, 64 * 2015) < c.step_time(1, 1, 0, 0.5, 63, 63 * 2015)


def test_mla_moe_on_vllm_pays_two_all_reduces_a_layer() -> None:
    # aic's DeepSeekModel on vLLM: context_/generation_tp_allreduce, 2 x every layer, beside the MoE
    # dispatches; SGLang and TensorRT-LLM do not add it.
    c, s = _deepseek("vllm"), _deepseek("sglang")
    m, ev = c.model, EngineHandle.for_database(c.database).evaluate_ops_json
    ar = sum(r[1] for r in ev(build_ops_json([ops.CustomAllReduce("ar", 2 * m.num_layers, m.hidden_size, 8)]),
                              is_context=True, batch_size=1, s=1, x=32))
    for js in (c.graph.tokens, c.graph.decode_tokens):
        rows = dict((r[0], r[1]) for r in ev(js, is_context=True, batch_size=1, s=1, x=32))
        assert rows["ar_1"] + rows["ar_2"] + rows["moe_layer_tp_allreduce"] == pytest.approx(ar, rel=1e-9)
    assert "moe_layer_tp_allreduce" not in s.graph.names


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_mla_moe_decode_is_near_aics_own_deepseek_estimate(backend: str) -> None:
    # aic's compiled DeepSeek-R1 (its MLA module tables, 61 MoE layers where the checkpoint has 3 dense
    # ones, an unsharded embedding): our decode step within 4% of its own at TP 8 on H200, FP8.
    c = _deepseek(backend, ep=8 if backend == "trtllm" else 1)
    ep = c.par.expert_parallel_size
    engine = EngineHandle.compile("deepseek-ai/DeepSeek-R1", "h200_sxm", backend, backend_version=c.version,
                                  tp_size=8, moe_tp_size=8 // ep, moe_ep_size=ep, gemm_quant_mode="fp8",
                                  moe_quant_mode="fp8_block", kvcache_quant_mode="fp8")
    for rows in (8, 64):
        sdk_ms = engine.decode_step_latency(rows, 1024, 1024)
        assert c.step_time(0, 0, 0, 0.0, rows, rows * 1536) * 1e3 == pytest.approx(sdk_ms, rel=0.04)


def _wide_ep(moe_a2a: str, dp: int = 32, ep: int = 32) -> AicCostModel:
    """DeepSeek-R1 NVFP4 on GB200 SGLang, attention DP x EP (the InferenceX wide-EP decode workers)."""
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "modelopt_fp4", "fp8"))
    return AicCostModel(m, get_hardware("GB200"), backend="sglang", parallel=Parallelism(1, dp, ep, 1),
                        moe_a2a=moe_a2a)


def test_deepep_ll_decode_prices_aics_large_ep_all_to_all() -> None:
    # aic_moe_a2a 'deepep_ll': a decode-only step's dispatch and combine are aic's large-EP MoEAllToAll
    # (comm_backend deepep_ll, one rank's tokens, nodes_for(ep, 4 GPUs a GB200 node)), written out here; the
    # router, experts and shared experts stay as they were, and a step with prefill keeps aic's MoEDispatch.
    from aiconfigurator_core.sdk.operations.moe_comm import MoEAllToAll
    ll, dflt = _wide_ep("deepep_ll"), _wide_ep("default")
    m, ev = ll.model, EngineHandle.for_database(ll.database).evaluate_ops_json
    L = m.num_moe_layers

    def price(op_list: list, rows: int) -> float:
        return sum(r[1] for r in ev(build_ops_json(op_list), is_context=True, batch_size=1, s=1, x=rows))

    kw = dict(comm_backend="deepep_ll", hidden_size=m.hidden_size, topk=m.num_experts_per_tok,
              num_experts=m.num_experts, moe_ep_size=32, node_num=8, sms=0, attention_tp_size=1)
    for rows in (16, 128):
        a2a = price([MoEAllToAll("d", L, phase="dispatch", comm_dtype="default", **kw),
                     MoEAllToAll("c", L, phase="combine", comm_dtype="default", **kw)], rows)
        mine = dict((r[0], r[1]) for r in ev(ll.graph.decode_tokens, is_context=True, batch_size=1, s=1, x=rows))
        theirs = dict((r[0], r[1]) for r in ev(dflt.graph.decode_tokens, is_context=True, batch_size=1, s=1,
                                                x=rows))
        gather = (price([ops.MoEDispatch("p", L, m.hidden_size, m.num_experts_per_tok, m.num_experts, 1, 32, 32,
                                         first, quant_mode=common.MoEQuantMode.nvfp4, is_context=False,
                                         backend="sglang") for first in (True, False)], rows))
        # The routed stream is the longer one here: the overlap moves by exactly the all-to-all's change.
        assert mine["generation_moe_overlap"] == pytest.approx(theirs["generation_moe_overlap"] - gather + a2a,
                                                               rel=1e-9)
        assert a2a < gather / 2
        assert ll.tokens_time(rows) == dflt.tokens_time(rows)  # a step with prefill: aic's MoEDispatch
    assert ll.decode_tokens_time(128) < dflt.decode_tokens_time(128)


def test_deepep_ll_needs_sglang_and_split_experts() -> None:
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    with pytest.raises(AicError, match="aic_moe_a2a"):
        AicCostModel(m, get_hardware("H200"), backend="vllm", parallel=Parallelism(1, 8, 8, 1), moe_a2a="deepep_ll")
    with pytest.raises(AicError, match="aic_moe_a2a"):
        AicCostModel(m, get_hardware("H200"), 8, backend="sglang", moe_a2a="deepep_ll")  # EP 1
    with pytest.raises(AicError, match="aic_moe_a2a"):
        AicCostModel(m, get_hardware("H200"), 8, backend="sglang", moe_a2a="pplx")


def test_deepep_ll_fp8_experts_price_aics_deepep_expert_table() -> None:
    # FP8 block-scaled experts under DeepEP low-latency: aic's MoEExpertCompute (its SGLang wide-EP generation
    # MoE table, kernel_source deepepmoe) at one rank's tokens x the attention ranks, written out here with the
    # deepep_ll dispatch and combine; the layout's MoE table prices another kernel several times slower.
    # NVFP4 (no such table) keeps the MoE table.
    from aiconfigurator_core.sdk.operations.moe_comm import MoEAllToAll, MoEExpertCompute
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    ll, dflt = (AicCostModel(m, get_hardware("GB200"), backend="sglang", parallel=Parallelism(1, 32, 32, 1),
                             moe_a2a=a) for a in ("deepep_ll", "default"))
    ev = EngineHandle.for_database(ll.database).evaluate_ops_json
    L, h = m.num_moe_layers, m.hidden_size
    kw = dict(comm_backend="deepep_ll", hidden_size=h, topk=8, num_experts=256, moe_ep_size=32, node_num=8, sms=0,
              attention_tp_size=1)
    routed = [ops.GEMM("r", L, 256, h, common.GEMMQuantMode.bfloat16),
              MoEAllToAll("d", L, phase="dispatch", comm_dtype="default", **kw),
              MoEExpertCompute("x", L, hidden_size=h, inter_size=m.moe_intermediate_size, topk=8, num_experts=256,
                               moe_ep_size=32, quant_mode=common.MoEQuantMode.fp8_block,
                               workload_distribution="power_law_1.01", attention_dp_size=32,
                               inference_phase="generation", num_slots=None, is_gated=True, enable_eplb=False),
              MoEAllToAll("c", L, phase="combine", comm_dtype="default", **kw)]
    fp8 = common.GEMMQuantMode.fp8
    shared = [ops.GEMM("su", L, 2 * m.moe_intermediate_size, h, fp8),
              ops.ElementWise("sa", L, 2 * m.moe_intermediate_size, m.moe_intermediate_size, 0.8),
              ops.GEMM("sd", L, h, m.moe_intermediate_size, fp8)]
    for rows in (16, 128):
        def price(op_list: list) -> float:
            return sum(r[1] for r in ev(build_ops_json(op_list), is_context=True, batch_size=1, s=1, x=rows))
        answer = dict((r[0], r[1]) for r in ev(ll.graph.decode_tokens, is_context=True, batch_size=1, s=1, x=rows))
        assert answer["generation_moe_overlap"] == pytest.approx(max(price(routed), price(shared)), rel=1e-9)
    assert ll.decode_tokens_time(128) < dflt.decode_tokens_time(128) / 2
    assert "MoeExpertCompute" in ll.graph.decode_tokens and "MoeExpertCompute" not in dflt.graph.decode_tokens
    assert "MoeExpertCompute" not in _wide_ep("deepep_ll").graph.decode_tokens  # NVFP4: aic's MoE table


@pytest.mark.parametrize("path, kept", [
    ("deepseek-ai/DeepSeek-R1", {"mla_downscale_gemm", "mla_q_proj_gemm", "proj_gemm"}),
    ("nvidia/DeepSeek-V3.1-NVFP4", {"mla_downscale_gemm", "mla_q_proj_gemm"})])
def test_nvfp4_deepseek_prices_the_checkpoints_16_bit_attention_projections(path: str, kept: set) -> None:
    # NVIDIA's NVFP4 checkpoints keep attention in 16 bits: R1-0528-FP4 the whole self_attn block, V3.1-NVFP4
    # q / kv only (aic's helpers.py and its shipped hf_quant_config); each projection the checkpoint keeps is
    # priced as aic's bfloat16 GEMM, the others at NVFP4.
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model(path).with_precision(Precision("bfloat16", "nvfp4", "fp8"))
    c = AicCostModel(m, get_hardware("B200"), backend="trtllm", parallel=Parallelism(8, 1, 8, 1))
    ev = EngineHandle.for_database(c.database).evaluate_ops_json
    h, n, L = m.hidden_size, m.num_heads // 8, m.num_layers
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    shapes = {"mla_downscale_gemm": (m.q_lora_rank + latent, h, False), "mla_q_proj_gemm": (n * m.qk_head_dim,
              m.q_lora_rank, False), "proj_gemm": (h, n * m.v_head_dim, True)}
    for rows in (8, 256):
        got = dict((r[0], r[1]) for r in ev(c.graph.decode_tokens, is_context=True, batch_size=1, s=1, x=rows))
        for name, (nn, k, low) in shapes.items():
            mode = common.GEMMQuantMode.bfloat16 if name in kept else common.GEMMQuantMode.nvfp4
            want = ev(build_ops_json([ops.GEMM(name, L, nn, k, mode, low_precision_input=low)]), is_context=True,
                      batch_size=1, s=1, x=rows)[0][1]
            other = ev(build_ops_json([ops.GEMM(name, L, nn, k, common.GEMMQuantMode.nvfp4 if name in kept else
                                                common.GEMMQuantMode.bfloat16, low_precision_input=low)]),
                       is_context=True, batch_size=1, s=1, x=rows)[0][1]
            assert got[name] == pytest.approx(want, rel=1e-12)
            assert got[name] != pytest.approx(other, rel=1e-3)


def test_deepep_normal_prefill_prices_aics_deepep_ht_all_to_all_and_context_experts() -> None:
    # aic_moe_a2a 'deepep_normal': a step with prefill's dispatch and combine are aic's large-EP context
    # MoEAllToAll (comm_backend deepep_ht, one rank's tokens, 20 SMs, nodes_for(ep, 4 GPUs a GB200 node),
    # attention TP 1), written out here, and its FP8 experts aic's DeepEP context expert table where it has the
    # EP (16 here); at EP 8 (no such rows) the experts keep aic's MoE table. Decode-only steps do not change.
    from aiconfigurator_core.sdk.operations.moe_comm import MoEAllToAll, MoEExpertCompute
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.backends.sim.parallel import Parallelism
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    L, h = m.num_moe_layers, m.hidden_size
    for ep in (16, 8):
        hn, dflt = (AicCostModel(m, get_hardware("GB200"), backend="sglang", parallel=Parallelism(1, ep, ep, 1),
                                 moe_a2a=a) for a in ("deepep_normal", "default"))
        ev = EngineHandle.for_database(hn.database).evaluate_ops_json
        kw = dict(comm_backend="deepep_ht", hidden_size=h, topk=8, num_experts=256, moe_ep_size=ep,
                  node_num=ep // 4, sms=20, attention_tp_size=1)
        a2a = [MoEAllToAll("d", L, phase="dispatch", comm_dtype="default", **kw),
               MoEAllToAll("c", L, phase="combine", comm_dtype="default", **kw)]
        gather = [ops.MoEDispatch("p", L, h, 8, 256, 1, ep, ep, first, quant_mode=common.MoEQuantMode.fp8_block,
                                  is_context=True, backend="sglang") for first in (True, False)]
        experts = MoEExpertCompute("x", L, hidden_size=h, inter_size=m.moe_intermediate_size, topk=8,
                                   num_experts=256, moe_ep_size=ep, quant_mode=common.MoEQuantMode.fp8_block,
                                   workload_distribution="power_law_1.01", attention_dp_size=ep,
                                   inference_phase="context", num_slots=None, is_gated=True, enable_eplb=False)
        for rows in (1024, 8192):
            def price(op_list: list, x: int = rows) -> float:
                return sum(r[1] for r in ev(build_ops_json(op_list), is_context=True, batch_size=1, s=1, x=x))
            mine = dict((r[0], r[1]) for r in ev(hn.graph.tokens, is_context=True, batch_size=1, s=1, x=rows))
            theirs = dict((r[0], r[1]) for r in ev(dflt.graph.tokens, is_context=True, batch_size=1, s=1, x=rows))
            assert mine["context_moe_dispatch"] + mine["context_moe_combine"] == pytest.approx(price(a2a), rel=1e-9)
            assert (theirs["context_moe_pre_dispatch"] + theirs["context_moe_post_dispatch"]
                    == pytest.approx(price(gather), rel=1e-9))
            if ep == 16:
                assert mine["context_moe"] == pytest.approx(price([experts]), rel=1e-9)
                assert mine["context_moe"] < theirs["context_moe"] / 2
            else:
                assert mine["context_moe"] == pytest.approx(theirs["context_moe"], rel=1e-12)
            assert hn.tokens_time(rows) < dflt.tokens_time(rows)
        assert hn.decode_tokens_time(64) == dflt.decode_tokens_time(64)
    assert "MoeExpertCompute" not in hn.graph.tokens  # EP 8: aic's MoE table


def test_deepep_normal_needs_split_experts() -> None:
    from twinserve.backends.sim.aic_models import resolve_row_model
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "fp8", "fp8"))
    with pytest.raises(AicError, match="deepep_normal"):
        AicCostModel(m, get_hardware("GB200"), 8, backend="sglang", moe_a2a="deepep_normal")  # EP 1
