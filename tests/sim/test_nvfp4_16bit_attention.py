"""NVIDIA's NVFP4 DeepSeek-family checkpoints keep their attention projections in 16 bits
(catalog.NVFP4_16BIT_ATTENTION): their weight bytes are counted at 2 bytes a parameter wherever memory is sized (the KV pool, the roofline's weight read,
the capacity check), and the measured backend prices those GEMMs at bfloat16, both from the one declaration."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from twinserve.backends.sim import catalog
from twinserve.backends.sim.capacity import kv_capacity
from twinserve.backends.sim.catalog import get_hardware
from twinserve.backends.sim.cost_model import RooflineCostModel
from twinserve.backends.sim.hf_config import model_from_hf_dict
from twinserve.backends.sim.parallel import Parallelism
from twinserve.backends.sim.precision import NVFP4_BYTES, Precision

_NVFP4 = Precision("bfloat16", "nvfp4", "fp8")


def _mla(name: str):
    """A small DeepSeek-shaped MLA MoE spec under `name`, NVFP4."""
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
           "max_position_embeddings": 4096, "n_routed_experts": 16, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64, "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 96,
           "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}
    return model_from_hf_dict(cfg, name).with_precision(_NVFP4)


def _bytes_at_4_bits(m) -> float:
    """Every layer weight at NVFP4's bytes, embeddings 16-bit: what was counted before."""
    return m.always_params * NVFP4_BYTES + m.routed_params * NVFP4_BYTES + m.embedding_params * m.dtype_bytes


def test_group_params_add_up_to_the_attention_weights() -> None:
    m = _mla("DeepSeek-R1")
    h, n = 256, 8
    assert m.attn_group_params_per_layer("q") == h * 96 + 96 * n * 48
    assert m.attn_group_params_per_layer("kv") == h * (64 + 16) + 64 * n * (32 + 32)
    assert m.attn_group_params_per_layer("o") == n * 32 * h
    assert m.attention_group_params(catalog.ATTENTION_GROUPS) == m.attention_params
    gqa = catalog.get_model("Llama-3.1-8B")
    assert gqa.attention_group_params(catalog.ATTENTION_GROUPS) == gqa.num_layers * gqa.attn_params_per_layer


def test_deepseek_r1_nvfp4_counts_its_attention_projections_at_2_bytes() -> None:
    m = _mla("DeepSeek-R1")
    assert m.sixteen_bit_attention == {"q", "kv", "o"}
    want = (m.attention_params * 2.0 + (m.always_params - m.attention_params) * NVFP4_BYTES
            + m.routed_params * NVFP4_BYTES + m.embedding_params * 2)
    assert m.weight_bytes == int(want)
    assert m.weight_bytes - _bytes_at_4_bits(m) == pytest.approx(m.attention_params * (2.0 - NVFP4_BYTES), abs=1)
    # V3.1-NVFP4 keeps q / kv only: o_proj stays 4-bit.
    v31 = _mla("DeepSeek-V3.1")
    kept = v31.attention_group_params(("q", "kv"))
    assert 0 < kept < v31.attention_params
    assert v31.weight_bytes - _bytes_at_4_bits(v31) == pytest.approx(kept * (2.0 - NVFP4_BYTES), abs=1)
    # Another checkpoint, or another quantization of R1 (its FP8 checkpoint excludes nothing): no change.
    assert _mla("Some-NVFP4-model").weight_bytes == int(_bytes_at_4_bits(_mla("Some-NVFP4-model")))
    fp8 = m.with_precision(Precision("bfloat16", "fp8", "fp8"))
    assert fp8.sixteen_bit_attention == frozenset()
    assert fp8.always_weight_bytes == fp8.always_params * 1.0


@pytest.mark.parametrize("par", [Parallelism(8, 1, 8, 1), Parallelism(1, 8, 8, 1)], ids=["tp8", "attention-dp8"])
def test_the_kv_pool_of_a_deepseek_r1_fp4_engine_loses_exactly_those_bytes_a_rank(par: Parallelism) -> None:
    """The real R1 shape on B200: at TP 8 each GPU holds 1/8 of the 16-bit projections, under attention DP (TP 1 a
    rank) each holds all of them; the pool's bytes a GPU shrink by exactly that, the blocks by the whole count."""
    pytest.importorskip("aiconfigurator_core")  # R1's config.json ships with aiconfigurator-core
    from twinserve.backends.sim.aic_models import resolve_row_model
    r1 = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(_NVFP4)
    unkept = replace(r1, name="DeepSeek-R1-all-NVFP4")  # the same shape, no checkpoint entry
    hw = get_hardware("B200")
    kw = dict(block_size=64, gpu_memory_utilization=0.85, max_num_batched_tokens=8192, max_num_seqs=256,
              parallel=par)
    tp = par.tensor_parallel_size
    after, before = kv_capacity(r1, hw, tp, **kw), kv_capacity(unkept, hw, tp, **kw)
    extra = r1.attention_params * (2.0 - NVFP4_BYTES) / tp
    assert extra > 1.9e9  # 11.4 B parameters: ~2 GB a GPU at TP 8, ~16 GB each under attention DP
    assert after.weight_bytes - before.weight_bytes == pytest.approx(extra, rel=1e-9)
    assert before.usable_bytes - after.usable_bytes == pytest.approx(extra, rel=1e-9)
    assert after.num_blocks < before.num_blocks


def test_the_roofline_reads_the_16_bit_projections_every_step() -> None:
    m = _mla("DeepSeek-R1")
    hw = get_hardware("B200")
    kept, plain = RooflineCostModel(m, hw, tp=2), RooflineCostModel(replace(m, name="Other"), hw, tp=2)
    assert kept._w_time - plain._w_time == pytest.approx(
        m.attention_params * (2.0 - NVFP4_BYTES) / 2 / (hw.mem_bandwidth * kept.eff.memory), rel=1e-9)


def test_the_aic_graph_and_the_byte_count_read_the_same_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Change the one entry: the graph's projection GEMM modes and the weight bytes both follow it."""
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.aic_models import resolve_row_model
    r1 = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(_NVFP4)
    names = ("mla_downscale_gemm", "mla_q_proj_gemm", "proj_gemm")

    def gemm_modes() -> dict[str, str]:
        c = AicCostModel(r1, get_hardware("B200"), tp=8, backend="trtllm")
        ops = [next(iter(op.items())) for op in json.loads(c.graph.decode_tokens)]
        return {f["name"]: f["quant_mode"] for kind, f in ops if kind == "Gemm" and f["name"] in names}

    assert gemm_modes() == dict.fromkeys(names, "bfloat16")
    whole = r1.weight_bytes
    monkeypatch.setitem(catalog.NVFP4_16BIT_ATTENTION, "DeepSeek-R1", frozenset({"o"}))
    assert gemm_modes() == {"mla_downscale_gemm": "nvfp4", "mla_q_proj_gemm": "nvfp4", "proj_gemm": "bfloat16"}
    assert whole - r1.weight_bytes == pytest.approx(r1.attention_group_params(("q", "kv")) * (2.0 - NVFP4_BYTES), abs=2)
    monkeypatch.delitem(catalog.NVFP4_16BIT_ATTENTION, "DeepSeek-R1")
    assert set(gemm_modes().values()) == {"nvfp4"}
    assert whole - r1.weight_bytes == pytest.approx(r1.attention_params * (2.0 - NVFP4_BYTES), abs=2)
