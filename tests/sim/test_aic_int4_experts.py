"""A checkpoint that quantizes only its routed experts (Kimi-K2.5's native INT4): its attention, shared
experts and dense MLP are priced 16-bit, on the measured backend and in the roofline's weight bytes."""

from __future__ import annotations

import json

import pytest

from twinserve.backends.sim.catalog import get_hardware
from twinserve.backends.sim.hf_config import model_from_hf_dict
from twinserve.backends.sim.precision import _WEIGHT_BYTES, Precision

_INT4 = Precision("bfloat16", "int4", "auto")


def _config(ignore: list[str]) -> dict:
    """A small DeepSeek-shaped MoE config.json with a compressed-tensors INT4 quantization_config."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
            "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
            "vocab_size": 1000, "max_position_embeddings": 4096, "n_routed_experts": 16,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                        "num_bits": 4, "type": "int", "group_size": 32}}},
                                    "ignore": ignore}}


_KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]


def test_the_experts_only_checkpoint_is_read_from_its_ignore_list() -> None:
    assert model_from_hf_dict(_config(_KIMI_IGNORE), "k").experts_only_quantization == "int4"
    # Every linear layer 4-bit (an AWQ/GPTQ-style checkpoint): nothing kept 16-bit.
    assert model_from_hf_dict(_config(["lm_head"]), "k").experts_only_quantization == ""


def test_roofline_weights_keep_the_layers_outside_the_experts_16_bit() -> None:
    m = model_from_hf_dict(_config(_KIMI_IGNORE), "k").with_precision(_INT4)
    every = model_from_hf_dict(_config(["lm_head"]), "k").with_precision(_INT4)
    assert m.layer_weight_bytes == 2.0
    assert m.weight_bytes == int(m.always_params * 2.0 + m.routed_params * _WEIGHT_BYTES["int4"]
                                 + m.embedding_params * m.dtype_bytes)
    assert every.layer_weight_bytes == _WEIGHT_BYTES["int4"] and every.weight_bytes < m.weight_bytes
    # Another quantization of the same model (an FP8 study): that checkpoint's rule does not apply.
    assert m.with_precision(Precision("bfloat16", "fp8", "auto")).layer_weight_bytes == 1.0


pytest.importorskip("aiconfigurator_core")  # the rest needs the [aic] extra; CI installs it

from twinserve.backends.sim.aic import AicCostModel  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402


def test_kimi_k25_int4_reads_its_shipped_checkpoint() -> None:
    assert resolve_row_model("moonshotai/Kimi-K2.5").experts_only_quantization == "int4"
    assert resolve_row_model("deepseek-ai/DeepSeek-R1").experts_only_quantization == ""


@pytest.mark.parametrize("hw", ["H200", "B200"])
def test_kimi_k25_int4_prices_16_bit_gemms_and_int4_experts(hw: str) -> None:
    """Before, every GEMM asked for aic's int4_wo table, which vLLM's databases lack: all 90 Kimi-K2.5
    INT4 rows failed under --cost-model aic."""
    m = resolve_row_model("moonshotai/Kimi-K2.5").with_precision(_INT4)
    c = AicCostModel(m, get_hardware(hw), tp=8, backend="vllm")
    ops = [next(iter(op.items())) for op in json.loads(c.graph.decode_tokens)]
    gemms = {f["name"]: f["quant_mode"] for kind, f in ops if kind == "Gemm"}
    assert gemms and set(gemms.values()) == {"bfloat16"}, gemms
    assert "int4_wo" in c.graph.decode_tokens  # the routed experts stay 4-bit
    assert c.decode_tokens_time(16) > c.decode_tokens_time(1) > 0
