"""Multi-token prediction: a model's MTP layers read from its config.json, the module as a draft model
(draft_model = "mtp"), and the measured backend pricing the draft and the verify rows."""

from __future__ import annotations

import pytest

from twinserve.backends.sim.hf_config import model_from_hf_dict
from twinserve.sim.config import StudyConfig
from twinserve.sim.errors import ConfigError
from twinserve.sim.specs import MTP_DRAFT, resolve_draft_model

# DeepSeek-V3/R1's config.json (deepseek-ai/DeepSeek-R1, also in aiconfigurator-core's model_configs).
DSR1 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
        "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "num_nextn_predict_layers": 1}
LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


@pytest.mark.parametrize("extra, layers", [
    ({}, 1),  # DeepSeek-V3/R1, GLM-5: num_nextn_predict_layers
    ({"num_nextn_predict_layers": 0}, 0),  # Kimi-K2.5 ships none
    ({"num_nextn_predict_layers": None, "mtp_num_hidden_layers": 1}, 1),  # Qwen3-Next / Qwen3.5
    ({"num_nextn_predict_layers": None, "use_mtp": True, "num_mtp_modules": 3}, 3),  # MiniMax-M2
    ({"num_nextn_predict_layers": None, "use_mtp": False, "num_mtp_modules": 3}, 0),
])
def test_mtp_layers_come_from_the_config(extra: dict, layers: int) -> None:
    assert model_from_hf_dict({**DSR1, **extra}, "m").num_mtp_layers == layers


def test_the_shipped_deepseek_r1_config_has_its_nextn_layer() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic_models import resolve_row_model
    assert resolve_row_model("deepseek-ai/DeepSeek-R1").num_mtp_layers == 1
    assert resolve_row_model("meta-llama/Llama-3.1-70B").num_mtp_layers == 0


def test_the_mtp_draft_is_one_routed_layer_of_the_target() -> None:
    target = model_from_hf_dict(DSR1, "DeepSeek-R1")
    draft = target.mtp_draft()
    assert (draft.num_layers, draft.num_dense_layers, draft.num_moe_layers) == (1, 0, 1)
    assert (draft.hidden_size, draft.vocab_size, draft.kv_lora_rank, draft.num_experts) == (7168, 129280, 512, 256)
    assert draft.num_params < target.num_params / 30
    with pytest.raises(ValueError, match="no multi-token-prediction"):
        model_from_hf_dict(LLAMA, "tiny").mtp_draft()


def test_draft_model_mtp_names_the_targets_own_module() -> None:
    cfg = StudyConfig()
    cfg.speculative.method, cfg.speculative.draft_model = "draft_model", MTP_DRAFT
    target = model_from_hf_dict(DSR1, "DeepSeek-R1")
    assert resolve_draft_model(cfg, target) == target.mtp_draft().with_precision(target.precision)
    with pytest.raises(ConfigError, match="speculative.draft_model.*no multi-token-prediction"):
        resolve_draft_model(cfg, model_from_hf_dict(LLAMA, "tiny"))


def test_the_measured_backend_prices_the_mtp_draft_and_verify_rows_itself() -> None:
    """An aic study speculating with its MTP layer: the draft is priced from aic's kernels at the target's
    layout (not the roofline), and the verify rows as k + 1 decode rows (aic's own MTP batch scaling)."""
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.sim.build import build_engine
    cfg = StudyConfig()
    cfg.custom_model = model_from_hf_dict(DSR1, "DeepSeek-R1")
    e = cfg.engine
    e.model, e.hardware, e.cost_model, e.aic_backend = "DeepSeek-R1", "B200", "aic", "trtllm"
    e.tensor_parallel_size, e.quantization, e.kv_cache_dtype = 8, "fp8", "fp8"
    cfg.speculative.method, cfg.speculative.draft_model = "draft_model", MTP_DRAFT
    cfg.speculative.num_speculative_tokens, cfg.speculative.acceptance_rates = 3, [0.85] * 3
    built = build_engine(cfg)
    draft = built.executor.draft.cost
    assert isinstance(draft, AicCostModel) and draft.model.num_layers == 1 and draft.tp == 8
    target = built.cost_model
    assert target.prices_verify and target.verify_time(4, 12) == 0.0
    # One MTP layer's step is a small fraction of the 61-layer target's at the same shape.
    assert 0 < draft.step_time(0, 0, 0, 0.0, 32, 32 * 2048) < target.step_time(0, 0, 0, 0.0, 32, 32 * 2048) / 10


@pytest.mark.parametrize("tp, dp, ep", [(8, 1, 1), (8, 1, 8), (1, 8, 8)])
def test_the_mtp_draft_takes_one_layers_share_of_the_pool_under_any_layout(tp: int, dp: int, ep: int) -> None:
    """The MTP layer is laid out as the target's layers are (experts over the EP group, each attention-DP
    rank its own K/V) and shares the target's embedding and LM head: the pool loses about one layer's
    share of 61, whatever the layout (it lost 8x under attention DP 8 when the draft's weights were cut
    by TP only and the DP ranks' pools were not counted)."""
    from twinserve.sim.build import engine_capacity
    cfg = StudyConfig()
    cfg.custom_model = model_from_hf_dict(DSR1, "DeepSeek-R1")
    e = cfg.engine
    e.model, e.hardware, e.quantization, e.kv_cache_dtype = "DeepSeek-R1", "H200", "fp8", "fp8"
    e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size = tp, dp, ep
    model = cfg.custom_model.with_precision(cfg.custom_model.precision.__class__("bfloat16", "fp8", "fp8"))
    plain = engine_capacity(cfg, model, _h200())
    cfg.speculative.method, cfg.speculative.draft_model = "draft_model", MTP_DRAFT
    cfg.speculative.num_speculative_tokens, cfg.speculative.acceptance_rates = 1, [0.85]
    drafted = engine_capacity(cfg, model, _h200())
    assert 0.9 * plain.num_blocks < drafted.num_blocks < plain.num_blocks
    assert drafted.block_bytes == pytest.approx(plain.block_bytes * 62 / 61)


def _h200():
    from twinserve.backends.sim.catalog import get_hardware
    return get_hardware("H200")


def test_an_nvfp4_checkpoints_mtp_layer_drafts_in_sixteen_bits() -> None:
    """NVIDIA's NVFP4 DeepSeek checkpoints exclude the MTP layer from quantization (catalog.NVFP4_16BIT_MTP): the
    draft is a bfloat16 layer (its K/V as the target's pool), where an FP8 checkpoint's stays FP8 and a model the
    declaration does not name stays NVFP4."""
    from twinserve.backends.sim.precision import Precision
    r1 = model_from_hf_dict(DSR1, "DeepSeek-R1")
    draft = r1.with_precision(Precision("bfloat16", "nvfp4", "fp8")).mtp_draft()
    assert draft.precision == Precision("bfloat16", "none", "fp8")
    assert r1.with_precision(Precision("bfloat16", "fp8", "fp8")).mtp_draft().precision.quantization == "fp8"
    other = model_from_hf_dict(DSR1, "Some-DeepSeek-Finetune").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
    assert other.mtp_draft().precision.quantization == "nvfp4"


def test_the_measured_backend_prices_a_sixteen_bit_mtp_draft_from_the_nearest_held_expert_shape(monkeypatch) -> None:
    """aic holds no bfloat16 MoE rows at DeepSeek's hidden 7168 (graph.moe_stand_in_hidden): the BF16 draft's
    experts are priced from the nearest held hidden size (6144, same experts, top-k and intermediate size) scaled
    by 7168 / 6144, and the draft step costs more than the NVFP4 draft's it replaces."""
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim import catalog
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.aic.graph import moe_stand_in_hidden
    from twinserve.backends.sim.aic.mapping import quant_modes
    from twinserve.sim.build import build_engine

    def draft_cost() -> AicCostModel:
        cfg = StudyConfig()
        cfg.custom_model = model_from_hf_dict(DSR1, "DeepSeek-R1")
        e = cfg.engine
        e.model, e.hardware, e.cost_model, e.aic_backend = "DeepSeek-R1", "B200", "aic", "trtllm"
        e.tensor_parallel_size, e.expert_parallel_size, e.quantization, e.kv_cache_dtype = 8, 8, "nvfp4", "fp8"
        cfg.speculative.method, cfg.speculative.draft_model = "draft_model", MTP_DRAFT
        cfg.speculative.num_speculative_tokens, cfg.speculative.acceptance_rates = 3, [0.85] * 3
        return build_engine(cfg).executor.draft.cost

    bf16 = draft_cost()
    assert bf16.model.precision.quantization == "none"
    db, par = bf16.database, bf16.par
    q = quant_modes(bf16.model.precision, True)["moe"]
    assert moe_stand_in_hidden(db, bf16.model, 1, 8, 1, q, "power_law_1.01") == 6144
    monkeypatch.setattr(catalog, "NVFP4_16BIT_MTP", frozenset())
    fp4 = draft_cost()
    assert fp4.model.precision.quantization == "nvfp4"
    for tokens in (8, 64, 512):
        assert bf16.step_time(0, 0, 0, 0.0, tokens, tokens * 2048) > fp4.step_time(0, 0, 0, 0.0, tokens, tokens * 2048)


def test_a_target_model_missing_from_the_moe_table_is_an_error_not_a_stand_in() -> None:
    """The nearest-hidden stand-in is for the 16-bit MTP draft alone: DeepSeek-R1 itself served at bfloat16 on B200
    TensorRT-LLM (aic holds no bfloat16 MoE rows at hidden 7168) keeps its own shape, and the study is refused with
    aic's missing key named, as for any model the database lacks."""
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_engine

    cfg = StudyConfig()
    cfg.custom_model = model_from_hf_dict(DSR1, "DeepSeek-R1")
    e = cfg.engine
    e.model, e.hardware, e.cost_model, e.aic_backend = "DeepSeek-R1", "B200", "aic", "trtllm"
    e.tensor_parallel_size, e.expert_parallel_size, e.quantization, e.kv_cache_dtype = 8, 8, "none", "fp8"
    with pytest.raises(ConfigError, match="7168"):
        build_engine(cfg)
