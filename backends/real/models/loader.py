"""Weights into a registered model: from an HF folder (config.json + safetensors) or a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from twinserve.core.errors import (CheckpointMismatchError, TwinserveError, UnsupportedModelError, short_repr,
                                   unreadable_text)
from twinserve.backends.real.models.architectures import CausalLM, config_from_hf_dict, model_class
from twinserve.backends.real.models.config import LlamaConfig, ModelConfig
from twinserve.backends.real.models.llama import LlamaForCausalLM

# HF name (after "model.layers.N.") -> (fused parameter, shard index) for the fused projections.
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


# config.json's sizes every architecture reads as integers (each checked where present).
_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim")


def read_hf_config(folder: Path) -> ModelConfig:
    """Parse folder/config.json through the registered class of its architecture; a broken file is an
    UnsupportedModelError naming it (and the line or field)."""
    path = folder / "config.json"
    if not path.exists():
        raise UnsupportedModelError(f"{folder} has no config.json; give an HF model folder or a .gguf file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        line, why = unreadable_text(path, e)
        raise UnsupportedModelError(f"{path}{f':{line}' if line else ''}: {why}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise UnsupportedModelError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); is the download complete?") from None
    if not isinstance(cfg, dict):
        raise UnsupportedModelError(f"{path}: a config.json holds one JSON object, not {type(cfg).__name__}")
    for key in _INT_FIELDS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UnsupportedModelError(f"{path}: field {key!r} is {short_repr(value)}: an integer >= 1")
    try:
        return config_from_hf_dict(cfg)
    except TwinserveError:
        raise
    except KeyError as e:
        raise UnsupportedModelError(f"{path}: field {e.args[0]!r} is missing (the model class reads it)") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise UnsupportedModelError(f"{path}: a field holds a value of the wrong kind ({e})") from None


def _hf_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{folder} has no *.safetensors weights (only safetensors are read)")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    yield name, sf.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise UnsupportedModelError(f"{f}: not a readable safetensors file ({e}); is the download "
                                        "complete?") from None


def _shard_slices(cfg: LlamaConfig, fused: str) -> list[slice]:
    if "qkv_proj" in fused:
        q, kv = cfg.q_size, cfg.kv_size
        return [slice(0, q), slice(q, q + kv), slice(q + kv, q + 2 * kv)]
    i = cfg.intermediate_size
    return [slice(0, i), slice(i, 2 * i)]


def load_named_weights(model: CausalLM, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into the model's (partly fused) parameters; every parameter must be set."""
    cfg = model.config
    params = dict(model.named_parameters())
    filled: dict[str, set[int | None]] = {}
    with torch.no_grad():
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            key = name[len("model."):] if name.startswith("model.") else name
            if key == "lm_head.weight" and model.lm_head is None:
                continue  # tied: the embedding is the head
            target, shard = key, None
            for hf, (ours, idx) in _FUSED.items():
                if f".{hf}." in f".{key}":
                    target, shard = key.replace(hf, ours), idx
                    break
            if target not in params:
                raise CheckpointMismatchError(name, f"has no place in the {cfg.architecture} model")
            p = params[target]
            if shard is None:
                dst = p
            else:
                dst = p[_shard_slices(cfg, target)[shard]]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise CheckpointMismatchError(name, f"shape {tuple(tensor.shape)} != the model's {tuple(dst.shape)}")
            dst.copy_(tensor.to(p.dtype))
            filled.setdefault(target, set()).add(shard)
    # A fused parameter is whole only with every shard: one missing (say k_proj) would leave
    # that slice at its initial values and the model would run, wrong.
    missing = [_hf_name(n, idx) for n in params for idx in _shards(n) if idx not in filled.get(n, ())]
    if missing:
        raise CheckpointMismatchError(missing[0], f"is missing from the checkpoint ({len(missing)} missing in all)")


def _shards(param: str) -> tuple[int | None, ...]:
    """The shard indices a parameter is filled from (None: one unfused tensor)."""
    idx = tuple(i for hf, (ours, i) in _FUSED.items() if f".{ours}." in f".{param}")
    return idx or (None,)


def _hf_name(param: str, shard: int | None) -> str:
    """The checkpoint's name of one shard of a parameter (lm_head sits outside model.)."""
    for hf, (ours, i) in _FUSED.items():
        if i == shard and f".{ours}." in f".{param}":
            param = param.replace(ours, hf)
            break
    return param if param.startswith("lm_head.") else f"model.{param}"


def open_gguf(path: Path):
    """A GGUFReader of path; a file that is not a readable GGUF is an UnsupportedModelError naming it."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # the gguf package's parser: whatever a file that is not GGUF makes it raise
        raise UnsupportedModelError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); is the download "
                                    "complete?") from None


def peek_model_config(source) -> ModelConfig:
    """The architecture record of a ModelSource (HF folder or GGUF file), without loading weights."""
    if source.is_gguf:
        return gguf_config(open_gguf(source.path))
    return read_hf_config(source.path)


def load_hf_folder(folder: Path, max_len: int, dtype: torch.dtype) -> CausalLM:
    """Build and fill a model from an HF folder, with the class its architecture names."""
    cfg = read_hf_config(folder)
    model = model_class(cfg)(cfg, max_len, dtype).to(dtype)
    load_named_weights(model, _hf_tensors(folder))
    return model.eval()


# ---------------------------------------------------------------- GGUF
_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if v.dtype == np.uint8 else v.item()


def gguf_config(reader) -> LlamaConfig:
    """Architecture from GGUF metadata (llama.* keys)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not read directly (only llama); convert the file to an HF "
            "folder with transformers (from_pretrained(..., gguf_file=...), then save_pretrained) and serve that")
    names = {t.name for t in reader.tensors}
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise CheckpointMismatchError("token_embd.weight", "is missing from the GGUF file")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    scaling = None
    kind = _field(reader, "llama.rope.scaling.type")
    if kind and kind != "none":
        scaling = {"rope_type": kind, "factor": float(_field(reader, "llama.rope.scaling.factor", 1.0))}
    return LlamaConfig(
        vocab_size=int(emb.shape[1]),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.attention.key_length", hidden // heads)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=[] if eos is None else [int(eos)],
    )


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter reorders each head's rows from two halves to interleaved pairs
    # (its GGML RoPE rotates adjacent pairs); this restores the half-split order HF uses.
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF tensors a llama model file may carry that hold no weights (precomputed RoPE factors).
_GGUF_IGNORED = {"rope_freqs.weight"}


def _gguf_tensors(reader, cfg: LlamaConfig, origin: dict[str, str]) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors of a llama GGUF; origin maps each HF name back to its GGUF name."""
    from gguf.quants import dequantize

    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type)
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            if parts[2] in ("attn_q", "attn_k"):
                heads = cfg.num_attention_heads if parts[2] == "attn_q" else cfg.num_key_value_heads
                if arr.shape[0] != heads * cfg.head_dim:  # checked here: the unpermute needs whole heads
                    raise CheckpointMismatchError(
                        t.name, f"shape {arr.shape} != the model's ({heads * cfg.head_dim}, ...)")
                arr = _unpermute_rope(arr, heads)
            name = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
        elif t.name in _GGUF_IGNORED:
            continue
        else:
            raise CheckpointMismatchError(t.name, "is not a tensor of a llama model")
        origin[name] = t.name
        yield name, torch.from_numpy(np.array(arr, copy=True))


def _gguf_name(hf_name: str) -> str | None:
    """The GGUF name of an HF tensor name of a llama model (None if it has none)."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    parts = hf_name.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 5:
        return None
    module = ".".join(parts[3:-1])
    kind = next((g for g, hf in _GGUF_NAMES.items() if hf == module), None)
    return f"blk.{parts[2]}.{kind}.{parts[-1]}" if kind else None


def load_gguf(path: Path, max_len: int, dtype: torch.dtype) -> LlamaForCausalLM:
    """Build and fill a model from a GGUF file (quantized tensors are dequantized)."""
    reader = open_gguf(path)
    cfg = gguf_config(reader)
    model = LlamaForCausalLM(cfg, max_len, dtype).to(dtype)
    origin: dict[str, str] = {}
    try:
        load_named_weights(model, _gguf_tensors(reader, cfg, origin))
    except CheckpointMismatchError as e:
        # Name the tensor as the GGUF file does (or would, for one it lacks).
        gguf_name = origin.get(e.tensor) or _gguf_name(e.tensor)
        if gguf_name:
            raise CheckpointMismatchError(f"{gguf_name} ({e.tensor})", e.args[1]) from None
        raise
    return model.eval()
