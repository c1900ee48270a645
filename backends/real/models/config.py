"""The architecture record a decoder is built from, and the HF config.json readers the model classes share.

One record covers every registered architecture: the Llama shapes plus the others' switches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinserve.core.errors import UnsupportedConfigFieldError, UnsupportedModelError

# RoPE variants rope.py implements (HF's rope_type names).
ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn")


@dataclass(slots=True)
class ModelConfig:
    """Shapes and constants of a decoder-only transformer."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None: plain RoPE; else HF's dict with "rope_type" and its keys.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q, k, v and o projections (Llama's flag)
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    architecture: str = "LlamaForCausalLM"
    # Per layer: sliding window W (last W positions), or None for full attention.
    layer_windows: list[int | None] = field(default_factory=list)
    qkv_bias: bool = False  # q, k, v only (Qwen2)
    qk_norm: bool = False  # RMS norm over each head of q and k before RoPE (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    # Gemma: norms scale by (1 + weight), embeddings by sqrt(hidden), sandwich norms.
    gemma_norms: bool = False
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (default head_dim)
    local_rope_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3), None = rope_theta

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if not self.layer_windows:
            self.layer_windows = [None] * self.num_hidden_layers
        if len(self.layer_windows) != self.num_hidden_layers:
            raise UnsupportedConfigFieldError(self.architecture, "layer_types", self.layer_windows,
                                              f"one entry per layer ({self.num_hidden_layers})")

    @property
    def q_size(self) -> int:
        """Width of the query projection."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection."""
        return self.num_key_value_heads * self.head_dim

    @property
    def sliding_window(self) -> int | None:
        """The largest window of any sliding layer (None: all full attention)."""
        windows = [w for w in self.layer_windows if w is not None]
        return max(windows) if windows else None


def model_context(cfg: Any) -> int:
    """Positions the model was trained for, stretched by its RoPE scaling factor if it has one."""
    scaling = getattr(cfg, "rope_scaling", None) or {}
    factor = scaling.get("factor", 1.0) if isinstance(scaling, dict) else 1.0
    return int(cfg.max_position_embeddings * max(1.0, float(factor or 1.0)))


# The Llama-only code's name; every architecture shares the record.
LlamaConfig = ModelConfig


def reject(arch: str, cfg: dict[str, Any], name: str, allowed: tuple[Any, ...], supported: str) -> None:
    """A typed error when cfg[name] is set outside `allowed` (a missing key is allowed)."""
    if name in cfg and cfg[name] not in allowed:
        raise UnsupportedConfigFieldError(arch, name, cfg[name], supported)


def parse_rope(arch: str, params: dict[str, Any] | None, cfg: dict[str, Any]
               ) -> tuple[float, dict[str, Any] | None]:
    """(base, scaling) from a transformers 5 RoPE dict or 4.x rope_theta/rope_scaling keys."""
    params = dict(params or {})
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
        scaling = params
    if scaling is not None:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.get("type", "default"))
        if scaling["rope_type"] not in ROPE_TYPES:
            raise UnsupportedConfigFieldError(arch, "rope_scaling.rope_type", scaling["rope_type"],
                                              ", ".join(ROPE_TYPES))
        if scaling["rope_type"] == "default":
            scaling = None
    return float(theta), scaling


def layer_windows(arch: str, cfg: dict[str, Any], default: list[int | None]) -> list[int | None]:
    """Per-layer windows from layer_types ("full_attention" / "sliding_attention"), else `default`."""
    types = cfg.get("layer_types")
    if not types:
        return default
    window = cfg.get("sliding_window")
    out: list[int | None] = []
    for t in types:
        if t == "full_attention":
            out.append(None)
        elif t == "sliding_attention" and isinstance(window, int) and window > 0:
            out.append(window)
        else:
            raise UnsupportedConfigFieldError(arch, "layer_types", t,
                                              "full_attention, or sliding_attention with sliding_window > 0")
    return out


def common_fields(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig keywords every architecture reads the same way."""
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "full_attention" in rope:
        rope = rope["full_attention"]  # per-layer-type RoPE (Gemma 3): the global layers' here
    theta, scaling = parse_rope(arch, rope, cfg)
    eos = cfg.get("eos_token_id")
    eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    heads = cfg["num_attention_heads"]
    layers = cfg["num_hidden_layers"]
    return dict(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=eos_list,
        layer_windows=[None] * layers,
    )
