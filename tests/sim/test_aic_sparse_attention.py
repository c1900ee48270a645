"""DeepSeek Sparse Attention (GLM-5, DeepSeek-V3.2): the indexer's fields read from config.json, and the
measured backend pricing the attention block from aiconfigurator-core's DSA module tables, not as dense MLA."""

from __future__ import annotations

import dataclasses

import pytest

from twinserve.backends.sim.hf_config import model_from_hf_dict

# zai-org/GLM-5's config.json (aiconfigurator-core ships it as model_configs/zai-org--GLM-5_config.json).
GLM5 = {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 78,
        "hidden_size": 6144, "intermediate_size": 12288, "num_attention_heads": 64, "num_key_value_heads": 64,
        "head_dim": 64, "vocab_size": 154880, "max_position_embeddings": 202752, "n_routed_experts": 256,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 192, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32,
        "index_head_dim": 128, "num_nextn_predict_layers": 1}


def test_the_indexer_comes_from_the_config() -> None:
    m = model_from_hf_dict(GLM5, "GLM-5")
    assert (m.index_topk, m.index_n_heads, m.index_head_dim) == (2048, 32, 128)
    dense = model_from_hf_dict({k: v for k, v in GLM5.items() if not k.startswith("index_")}, "dense")
    assert (dense.index_topk, dense.index_n_heads, dense.index_head_dim) == (0, 0, 0)


@pytest.fixture(scope="module")
def glm5_b200():
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.catalog import get_hardware
    from twinserve.backends.sim.precision import Precision
    model = model_from_hf_dict(GLM5, "GLM-5").with_precision(Precision("bfloat16", "fp8", "fp8"))
    return AicCostModel(model, get_hardware("B200"), 8, "sglang")


@pytest.mark.parametrize("rows, kv", [(1, 1024), (16, 3008), (64, 9008)])  # multiples of KV_GRID: priced as given
def test_decode_attention_is_aics_dsa_module(glm5_b200, rows: int, kv: int) -> None:
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
    c = glm5_b200
    op = ops.GenerationDSAModule("g", 78, 64 // 8, common.KVCacheQuantMode.fp8, common.GEMMQuantMode.fp8_block,
                                 architecture="GlmMoeDsaForCausalLM", dsa_full_layer_fraction=1.0)
    ev = EngineHandle.for_database(c.database).evaluate_ops_json
    want = sum(r[1] for r in ev(build_ops_json([op]), is_context=False, batch_size=rows, s=kv)) * 1e-3
    assert c.generation_attention_time(rows, kv) == pytest.approx(want, rel=1e-9)


def test_the_dsa_modules_hold_the_attention_projections(glm5_b200) -> None:
    names = glm5_b200.graph.names
    assert not {"mla_downscale_gemm", "mla_q_proj_gemm", "proj_gemm", "mla_kv_b_proj_gemm"} & set(names)
    assert "DsaContext" in glm5_b200.graph.context_attn and "DsaGeneration" in glm5_b200.graph.generation_attn


def test_a_dsa_shape_aic_never_measured_is_refused_by_name(glm5_b200) -> None:
    from twinserve.backends.sim.aic import AicCostModel, AicError
    odd = dataclasses.replace(glm5_b200.model, index_n_heads=16)
    with pytest.raises(AicError, match="DeepSeek Sparse Attention.*GlmMoeDsaForCausalLM"):
        AicCostModel(odd, glm5_b200.hardware, 8, "sglang")


@pytest.mark.parametrize("kv, latent_bytes", [("fp8", 1), ("auto", 2)])
def test_the_kv_pool_holds_the_indexers_keys(kv: str, latent_bytes: int) -> None:
    """Per token and layer: MLA's latent and rotary key (576 values at the KV dtype) plus the indexer's 128
    FP8 keys and one 4-byte scale (aiconfigurator-core's indexer_cache_entry_bytes(128) = 132)."""
    from twinserve.backends.sim.precision import Precision
    m = model_from_hf_dict(GLM5, "GLM-5").with_precision(Precision("bfloat16", "fp8", kv))
    assert m.kv_bytes_per_token == 78 * (576 * latent_bytes + 132)
    assert m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token  # the latent is whole on every GPU
    dense = model_from_hf_dict({k: v for k, v in GLM5.items() if not k.startswith("index_")}, "dense")
    assert dense.with_precision(m.precision).kv_bytes_per_token == 78 * 576 * latent_bytes
