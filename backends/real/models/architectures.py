"""The architecture registry: config.json's architectures[0] -> the model class that serves it.

A config field a class does not implement is a typed error naming it, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from twinserve.core.errors import UnsupportedArchitectureError, UnsupportedConfigFieldError
from twinserve.backends.real.attention.backend import AttentionBackend, AttentionMetadata
from twinserve.backends.real.models.config import ModelConfig, common_fields, layer_windows, parse_rope, reject
from twinserve.backends.real.models.llama import _SILU, LlamaForCausalLM, _check_act, llama_config


class CausalLM(Protocol):
    """What the engine needs of a model: a forward over a flat varlen batch, logits, weight copies."""

    config: ModelConfig

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                 backend: AttentionBackend) -> torch.Tensor:
        """Token ids [T] and positions [T] -> final hidden states [T, hidden]."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, hidden] -> fp32 logits [N, vocab]."""

    def projections(self) -> Iterator[nn.Linear]:
        """Every layer's projections, layer by layer (for weight copies and tensor parallelism)."""

    def add_small_batch_weights(self, rows: int | None = None) -> None:
        """Keep [in, out] weight copies for small products."""

    def add_packed_weights(self) -> None:
        """Keep oneDNN-prepacked weights."""

    def add_int8_weights(self) -> None:
        """Keep int8 weight copies for 1-row products."""

    def add_int4_weights(self) -> None:
        """Keep int4 weight copies for 1-row products."""

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """The architecture record from a config.json dict; typed errors for what it lacks."""


def mistral_config(cfg: dict[str, Any]) -> ModelConfig:
    """MistralForCausalLM: Llama with a sliding window on every layer."""
    arch = "MistralForCausalLM"
    _check_act(arch, cfg, "hidden_act", _SILU)
    kw = common_fields(arch, cfg)
    window = cfg.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise UnsupportedConfigFieldError(arch, "sliding_window", window, "a positive integer or None")
    kw["layer_windows"] = layer_windows(arch, cfg, [window] * kw["num_hidden_layers"])
    return ModelConfig(**kw)


def _qwen_windows(arch: str, cfg: dict[str, Any], layers: int) -> list[int | None]:
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    first = cfg.get("max_window_layers", 28)  # transformers' Qwen2Config/Qwen3Config default when absent
    default = [window if window and i >= first else None for i in range(layers)]
    if not cfg.get("use_sliding_window"):
        return [None] * layers  # transformers ignores layer_types then too
    return layer_windows(arch, cfg, default)


def qwen2_config(cfg: dict[str, Any]) -> ModelConfig:
    """Qwen2ForCausalLM: biases on q, k and v (not o); optional sliding layers."""
    arch = "Qwen2ForCausalLM"
    _check_act(arch, cfg, "hidden_act", _SILU)
    kw = common_fields(arch, cfg)
    kw.update(qkv_bias=True, layer_windows=_qwen_windows(arch, cfg, kw["num_hidden_layers"]))
    return ModelConfig(**kw)


def qwen3_config(cfg: dict[str, Any]) -> ModelConfig:
    """Qwen3ForCausalLM: RMS norm over each head of q and k; optional attention bias and sliding layers."""
    arch = "Qwen3ForCausalLM"
    _check_act(arch, cfg, "hidden_act", _SILU)
    kw = common_fields(arch, cfg)
    kw.update(qk_norm=True, attention_bias=bool(cfg.get("attention_bias", False)),
              layer_windows=_qwen_windows(arch, cfg, kw["num_hidden_layers"]))
    return ModelConfig(**kw)


def gemma3_config(cfg: dict[str, Any]) -> ModelConfig:
    """Gemma3ForCausalLM: local sliding layers interleaved with global ones, each with its RoPE base."""
    arch = "Gemma3ForCausalLM"
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedConfigFieldError(arch, "hidden_activation", act, "gelu_pytorch_tanh")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        reject(arch, cfg, key, (None,), "None")
    reject(arch, cfg, "use_bidirectional_attention", (None, False), "False")
    kw = common_fields(arch, cfg)
    layers = kw["num_hidden_layers"]
    window = cfg.get("sliding_window")
    pattern = cfg.get("sliding_window_pattern") or 6  # 4.x configs: every 6th layer is global
    default = [None if (i + 1) % pattern == 0 else window for i in range(layers)]
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "sliding_attention" in rope:
        local_theta, local_scaling = parse_rope(arch, rope["sliding_attention"], {})
    else:
        local_theta, local_scaling = float(cfg.get("rope_local_base_freq", 10000.0)), None
    if local_scaling is not None:
        raise UnsupportedConfigFieldError(arch, "rope_parameters.sliding_attention", local_scaling, "default RoPE")
    kw.update(hidden_act="gelu_tanh", qk_norm=True, gemma_norms=True,
              tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
              attention_bias=bool(cfg.get("attention_bias", False)),
              query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or kw["head_dim"]),
              local_rope_theta=local_theta,
              layer_windows=layer_windows(arch, cfg, default),
              rms_norm_eps=cfg.get("rms_norm_eps", 1e-6))
    return ModelConfig(**kw)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: every layer attends within its sliding window."""

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """See mistral_config."""
        return mistral_config(cfg)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: q/k/v biases."""

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """See qwen2_config."""
        return qwen2_config(cfg)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: q/k RMS norms."""

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """See qwen3_config."""
        return qwen3_config(cfg)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 (text): interleaved local/global layers, q/k norms, GeGLU, scaled embeddings, sandwich norms."""

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """See gemma3_config."""
        return gemma3_config(cfg)


ARCHITECTURES: dict[str, type] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}
# Configs without an architectures list name their family by model_type.
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def architecture_of(cfg: dict[str, Any]) -> str:
    """architectures[0], else the family model_type names; a typed error when neither is served."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else _BY_MODEL_TYPE.get(cfg.get("model_type"))
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(arch if archs else None, sorted(ARCHITECTURES), cfg.get("model_type"))
    return arch


def model_class_for(cfg: dict[str, Any]) -> type:
    """The registered model class for a config.json dict."""
    return ARCHITECTURES[architecture_of(cfg)]


def config_from_hf_dict(cfg: dict[str, Any]) -> ModelConfig:
    """Read a config.json dict through the class its architectures[0] names."""
    return model_class_for(cfg).config_from_hf(cfg)


def model_class(config: ModelConfig) -> type:
    """The registered model class a parsed config was read for."""
    cls = ARCHITECTURES.get(config.architecture)
    if cls is None:
        raise UnsupportedArchitectureError(config.architecture, sorted(ARCHITECTURES))
    return cls
