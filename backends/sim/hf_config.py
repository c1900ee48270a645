"""Model specs from Hugging Face config.json files (or a study's [model] table of the same keys).

Read as plain JSON, not transformers' config classes: those fill missing fields with library
defaults, and a plan built on a value the user never wrote is silently wrong. Families: Llama,
Mistral, Qwen2/2.5/3(-MoE), Gemma 3, Mixtral, gpt-oss, MiniMax-M2, DeepSeek-V3/R1 and Kimi-K2 (MLA,
leading dense layers, shared experts) and Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5: linear-attention
layers with a fixed-size state beside full-attention ones).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from twinserve.core.errors import FileFieldError, unreadable_text

from twinserve.backends.sim.catalog import MODEL_SOURCES, ModelSpec

MODELS_DIR = Path(__file__).parent / "models"


class ModelConfigError(FileFieldError):
    """A model config value is missing or wrong: names the file, the line and the key."""


def json_line_finder(text: str, start_key: str | None = None) -> Callable[[str], int | None]:
    """A function giving the 1-based line of "key": in JSON text (after start_key's, if given)."""
    offset = 0
    if start_key:
        m = re.search(rf'"{re.escape(start_key)}"\s*:', text)
        offset = m.start() if m else 0

    def line_of(key: str) -> int | None:
        m = re.compile(rf'"{re.escape(key)}"\s*:').search(text, offset)
        if m is None and offset:
            m = re.compile(rf'"{re.escape(key)}"\s*:').search(text)
        return text.count("\n", 0, m.start()) + 1 if m else None

    return line_of


def model_from_hf_dict(data: dict[str, Any], name: str, file: str | None = None,
                       line_of: Callable[[str], int | None] = lambda key: None) -> ModelSpec:
    """A ModelSpec from config.json's keys; ModelConfigError on a missing or bad value."""
    outer: dict[str, Any] = {}
    if isinstance(data.get("text_config"), dict):  # multimodal wrappers (Gemma 3)
        outer = data
        data = dict(data["text_config"])
        if "tie_word_embeddings" in outer and "tie_word_embeddings" not in data:
            data["tie_word_embeddings"] = outer["tie_word_embeddings"]

    def bad(key: str, msg: str) -> ModelConfigError:
        return ModelConfigError(key, msg, file, line_of(key) or line_of("text_config")
                                or (1 if file else None))

    def integer(key: str, default: int | None = None, required: bool = True,
                minimum: int = 1) -> int | None:
        if key not in data or data[key] is None:
            if default is not None or not required:
                return default
            raise bad(key, "missing: a model config must give it")
        v = data[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(key, f"{v!r} is not an integer")
        if v < minimum:
            raise bad(key, f"{v!r} must be >= {minimum}")
        return v

    # Shapes this spec cannot hold would be priced as a plain full-attention model: refuse them.
    types = data.get("layer_types")
    if isinstance(types, list):
        odd = sorted({str(t) for t in types} - {"full_attention", "sliding_attention", "linear_attention"})
        if odd:
            raise bad("layer_types", f"layer type(s) {', '.join(odd)} are not modelled by the simulator "
                      "(full_attention, sliding_attention and linear_attention are)")
    layers = integer("num_hidden_layers")
    linear = _linear_attention(data, layers, integer, bad)
    hidden = integer("hidden_size")
    heads = integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads", heads)
    vocab = integer("vocab_size")
    max_pos = integer("max_position_embeddings")
    if heads % kv_heads:
        raise bad("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = integer("head_dim", required=False)
    if head_dim is None:
        if hidden % heads:
            raise bad("num_attention_heads", f"{heads} does not divide hidden_size={hidden}; "
                      "give head_dim")
        head_dim = hidden // heads

    experts = integer("num_local_experts", required=False, minimum=0) or \
        integer("num_experts", required=False, minimum=0) or \
        integer("n_routed_experts", required=False, minimum=0) or 0
    per_tok = shared = moe_inter = 0
    inter = integer("intermediate_size", required=not experts)
    if experts:
        per_tok = integer("num_experts_per_tok")
        if per_tok > experts:
            raise bad("num_experts_per_tok", f"{per_tok} experts per token is more than the "
                      f"{experts} experts the model has")
        moe_inter = integer("moe_intermediate_size", required=False) or inter
        if moe_inter is None:
            raise bad("moe_intermediate_size", "missing: a mixture-of-experts config must give "
                      "moe_intermediate_size (or intermediate_size, as Mixtral does)")
        shared = integer("num_shared_experts", required=False, minimum=0) or \
            integer("n_shared_experts", required=False, minimum=0) or 0
        shared_size = integer("shared_expert_intermediate_size", required=False, minimum=0)
        if shared_size:
            shared = max(shared, math.ceil(shared_size / moe_inter))
        inter = inter or moe_inter
    dense_layers = integer("first_k_dense_replace", 0, minimum=0) if experts else 0
    if dense_layers > layers:
        raise bad("first_k_dense_replace", f"{dense_layers} dense layers is more than num_hidden_layers={layers}")
    mla = _mla(integer, data) if data.get("kv_lora_rank") else {}

    window, sliding_layers = _sliding(data, layers, bad)
    mtp = _mtp_layers(data, integer)
    qk_norm = bool(set(data.get("architectures") or ()) & QK_NORM_ARCHITECTURES)
    tie = data.get("tie_word_embeddings")
    if tie is None:  # the family's own default (transformers' Gemma configs tie, Llama's do not)
        tie = str(data.get("model_type", "")).startswith("gemma")
    if not isinstance(tie, bool):
        raise bad("tie_word_embeddings", f"{tie!r} is not true/false")
    return ModelSpec(name, layers, hidden, inter, heads, kv_heads, head_dim, vocab, max_pos,
                     tie_word_embeddings=tie, num_experts=experts, num_experts_per_tok=per_tok,
                     num_shared_experts=shared, moe_intermediate_size=moe_inter,
                     sliding_window=window, num_sliding_layers=sliding_layers,
                     num_dense_layers=dense_layers, qk_norm=qk_norm,
                     qk_norm_across_heads=qk_norm and data.get("qk_norm_type") == "per_layer",
                     num_mtp_layers=mtp, experts_only_quantization=_experts_only_quantization(data, outer),
                     **mla, **linear)


def _experts_only_quantization(data: dict[str, Any], outer: dict[str, Any]) -> str:
    """'int4' for a compressed-tensors checkpoint of 4-bit integer weights whose `ignore` list keeps
    self-attention and the shared experts in 16 bits, so only the routed experts are 4-bit
    (moonshotai/Kimi-K2.5's config.json: ignore lm_head, self_attn, shared_experts and the dense mlp
    projections); '' otherwise. aiconfigurator-core's own reader prices such a checkpoint the same way:
    16-bit GEMMs when attention is ignored, int4 weight-only experts
    (sdk/models/helpers._infer_quant_modes_from_raw_config, sdk/utils.parse_compressed_tensors_quant)."""
    q = data.get("quantization_config") or outer.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") != "compressed-tensors":
        return ""
    weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    if not any(w.get("num_bits") == 4 and str(w.get("type", "")).lower() == "int" for w in weights):
        return ""
    ignore = [str(x) for x in q.get("ignore") or ()]
    kept = any("self_attn" in x for x in ignore) and any("shared_expert" in x for x in ignore)
    return "int4" if kept else ""


def _mtp_layers(data: dict[str, Any], integer: Callable[..., int | None]) -> int:
    """Multi-token-prediction layers: DeepSeek-V3/R1, Kimi-K2 and GLM-5's num_nextn_predict_layers,
    Qwen3-Next/3.5's mtp_num_hidden_layers, MiniMax-M2's num_mtp_modules (when use_mtp is true)."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if data.get(key) is not None:
            return integer(key, minimum=0)
    if data.get("use_mtp") is True and data.get("num_mtp_modules") is not None:
        return integer("num_mtp_modules", minimum=0)
    return 0


# Bytes of config.json's mamba_ssm_dtype, the linear-attention state's dtype (float32 when absent, as
# SGLang and vLLM keep it for Qwen3-Next / Qwen3.5).
_STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _linear_attention(data: dict[str, Any], layers: int, integer: Callable[..., int | None],
                      bad: Callable[[str, str], Exception]) -> dict[str, int]:
    """Gated DeltaNet layers (Qwen3-Next, Qwen3.5): their count and head shapes; {} when none.

    The layer pattern is layer_types, else every full_attention_interval-th layer is full attention
    and the rest linear, as transformers' Qwen3-Next config builds it.
    """
    types = data.get("layer_types")
    interval = data.get("full_attention_interval")
    if isinstance(types, list):
        if "linear_attention" not in types:
            return {}
        if len(types) != layers:
            raise bad("layer_types", f"{len(types)} entries for num_hidden_layers={layers}")
        count = sum(1 for t in types if t == "linear_attention")
    elif interval is not None and "linear_num_value_heads" in data:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise bad("full_attention_interval", f"{interval!r} must be a positive integer")
        count = layers - layers // interval
    else:
        return {}
    dtype = data.get("mamba_ssm_dtype", "float32")
    if dtype not in _STATE_DTYPE_BYTES:
        raise bad("mamba_ssm_dtype", f"{dtype!r}: one of {', '.join(_STATE_DTYPE_BYTES)}")
    return {"num_linear_layers": count, "linear_num_key_heads": integer("linear_num_key_heads"),
            "linear_num_value_heads": integer("linear_num_value_heads"),
            "linear_key_head_dim": integer("linear_key_head_dim"),
            "linear_value_head_dim": integer("linear_value_head_dim"),
            "linear_conv_kernel_dim": integer("linear_conv_kernel_dim"),
            "linear_state_dtype_bytes": _STATE_DTYPE_BYTES[dtype]}


# Architectures whose attention normalizes q and k per head (transformers' Qwen3/MiniMax-M2 modules).
QK_NORM_ARCHITECTURES = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MiniMaxM2ForCausalLM"})


def _mla(integer: Callable[..., int | None], data: dict[str, Any]) -> dict[str, int]:
    """Multi-head latent attention's ranks and head widths (DeepSeek-V2/V3, Kimi-K2), and DeepSeek Sparse
    Attention's indexer where the config has one (DeepSeek-V3.2, GLM-5: index_topk)."""
    mla = {"kv_lora_rank": integer("kv_lora_rank"), "q_lora_rank": integer("q_lora_rank", 0, minimum=0),
           "qk_rope_head_dim": integer("qk_rope_head_dim"), "qk_nope_head_dim": integer("qk_nope_head_dim"),
           "v_head_dim": integer("v_head_dim")}
    if data.get("index_topk") is not None:
        mla.update(index_topk=integer("index_topk"), index_n_heads=integer("index_n_heads"),
                   index_head_dim=integer("index_head_dim"))
    return mla


# Families whose window covers every layer when the config has no layer_types (transformers' configs).
_ALL_SLIDING = ("mistral", "mixtral", "qwen3_moe", "starcoder2", "phi3")
# Families whose window is off unless use_sliding_window is true (transformers' default False).
_OPT_IN = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _sliding(data: dict[str, Any], layers: int, bad: Callable[[str, str], Exception]
             ) -> tuple[int, int]:
    """(window, layers using it), by the rule transformers' config class of the family applies."""
    window = data.get("sliding_window")
    kind = str(data.get("model_type", ""))
    use = data.get("use_sliding_window")
    # Only Qwen's config classes read use_sliding_window (Gemma's ignore it); others as written.
    known = kind in _ALL_SLIDING or kind.startswith("gemma")
    if window is None or window == 0 or (kind in _OPT_IN and not use) or (use is False and not known):
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise bad("sliding_window", f"{window!r} must be a positive number of tokens (or null)")
    types = data.get("layer_types")
    if isinstance(types, list):
        if len(types) != layers:
            raise bad("layer_types", f"{len(types)} entries for num_hidden_layers={layers}")
        return window, sum(1 for t in types if t == "sliding_attention")
    pattern = data.get("sliding_window_pattern")
    if pattern is None and kind.startswith("gemma3"):
        pattern = 6  # Gemma3TextConfig's default
    if pattern is not None:
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise bad("sliding_window_pattern", f"{pattern!r} must be a positive integer")
        return window, layers - layers // pattern  # every pattern-th layer is global
    first = data.get("max_window_layers", 28)  # Qwen2Config's default
    if kind in ("qwen2", "qwen3"):  # layers from max_window_layers on slide
        return window, max(0, layers - first)
    if kind == "qwen2_moe":  # even layers below max_window_layers slide
        return window, (min(first, layers) + 1) // 2
    if kind == "gemma2":  # even layers slide
        return window, (layers + 1) // 2
    if kind in _ALL_SLIDING:
        return window, layers
    raise bad("layer_types", f"sliding_window={window} with model_type {kind or '(none)'!r}, whose sliding "
              "layers this reader does not know: give layer_types (one 'sliding_attention' or "
              "'full_attention' per layer) or sliding_window_pattern")


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a config.json, or a folder holding one (an HF snapshot)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise ModelConfigError("model", "no such config.json (give a file or an HF model "
                               "folder; relative paths are read from the study file's folder)",
                               str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        line, why = unreadable_text(p, e)
        raise ModelConfigError("model", why, str(p), line) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelConfigError("<json>", f"not valid JSON ({e.msg})", str(p), e.lineno) from None
    if not isinstance(data, dict):
        raise ModelConfigError("<json>", "a config.json holds one object", str(p), 1)
    nested = "text_config" if isinstance(data.get("text_config"), dict) else None
    label = name or data.get("_name_or_path") or (p.parent.name if p.name == "config.json"
                                                  else p.stem)
    return model_from_hf_dict(data, str(label).rsplit("/", 1)[-1], str(p),
                              json_line_finder(text, nested))


def catalog_models() -> dict[str, ModelSpec]:
    """The shipped config files (backends/sim/models/*.json), by model name."""
    return {p.stem: load_hf_config(p, p.stem) for p in sorted(MODELS_DIR.glob("*.json"))}


MODEL_SOURCES.append(catalog_models)
