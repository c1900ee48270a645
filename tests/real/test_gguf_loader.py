"""A llama GGUF written from a tiny HF model loads to the same logits; a tensor that does not fit is named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from twinserve.core.errors import CheckpointMismatchError
from twinserve.backends.real.models.loader import load_gguf, load_hf_folder

_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter order for q/k rows (the loader undoes it).
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_dir: Path, path: Path, bad: str | None = None, extra: str | None = None,
               drop: str | None = None, block_count: int | None = None) -> Path:
    """A float32 llama GGUF of the folder's weights; `bad` gets one row too many, `extra` is an unknown
    tensor, `drop` is left out, `block_count` overrides the layer count its metadata says."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"] if block_count is None else block_count)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(10000.0)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for name, t in tensors.items():
        arr = t.float().numpy()
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            _, _, layer, *rest = name.split(".")
            mod, kind = ".".join(rest[:-1]), rest[-1]
            g = f"blk.{layer}.{_NAMES[mod]}.{kind}"
            if mod == "self_attn.q_proj":
                arr = _permute(arr, cfg["num_attention_heads"])
            elif mod == "self_attn.k_proj":
                arr = _permute(arr, cfg["num_key_value_heads"])
        if g == drop:
            continue
        if g == bad:
            arr = np.concatenate([arr, arr[:1]])
        w.add_tensor(g, np.ascontiguousarray(arr))
    if extra:
        w.add_tensor(extra, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama folder."""
    from .arch_helpers import make_arch_dir

    return make_arch_dir(tmp_path_factory.mktemp("llama"), "LlamaForCausalLM")


def test_gguf_loads_to_the_hf_folders_logits(llama_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(llama_dir, tmp_path / "m.gguf")
    model = load_gguf(path, 64, torch.float32)
    ref = load_hf_folder(llama_dir, 64, torch.float32)
    for (n, p), (n2, p2) in zip(sorted(model.state_dict().items()), sorted(ref.state_dict().items())):
        assert n == n2 and torch.equal(p, p2), n


@pytest.mark.parametrize("bad", ["blk.1.attn_k.weight", "blk.0.ffn_down.weight", "output_norm.weight"])
def test_gguf_tensor_of_the_wrong_shape_is_named(llama_dir: Path, tmp_path: Path, bad: str) -> None:
    path = write_gguf(llama_dir, tmp_path / "bad.gguf", bad=bad)
    with pytest.raises(CheckpointMismatchError) as e:
        load_gguf(path, 64, torch.float32)
    assert bad in str(e.value) and "shape" in str(e.value)


def test_gguf_unknown_tensor_is_named(llama_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(llama_dir, tmp_path / "extra.gguf", extra="blk.0.attn_q_norm.weight")
    with pytest.raises(CheckpointMismatchError, match="blk.0.attn_q_norm.weight"):
        load_gguf(path, 64, torch.float32)


@pytest.mark.parametrize("drop, hf", [("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
                                      ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
                                      ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight")])
def test_gguf_missing_tensor_is_named(llama_dir: Path, tmp_path: Path, drop: str, hf: str) -> None:
    # One shard of a fused projection missing would leave its slice at initial values.
    path = write_gguf(llama_dir, tmp_path / "short.gguf", drop=drop)
    with pytest.raises(CheckpointMismatchError) as e:
        load_gguf(path, 64, torch.float32)
    assert e.value.tensor == f"{drop} ({hf})" and "missing" in str(e.value)


@pytest.mark.parametrize("blocks, named", [(3, "blk.2."), (1, "blk.1.")])
def test_gguf_whose_layer_count_does_not_match_its_tensors_names_a_tensor(llama_dir: Path, tmp_path: Path,
                                                                          blocks: int, named: str) -> None:
    # The tiny model has 2 layers: metadata saying 3 lacks layer 2's tensors; saying 1, layer 1's have no place.
    path = write_gguf(llama_dir, tmp_path / "layers.gguf", block_count=blocks)
    with pytest.raises(CheckpointMismatchError) as e:
        load_gguf(path, 64, torch.float32)
    assert e.value.tensor.startswith(named)
