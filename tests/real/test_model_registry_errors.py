"""Bad model input is a typed error naming what is wrong: architecture, config field or checkpoint tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinserve.core.errors import (CheckpointMismatchError, UnsupportedArchitectureError,
                                   UnsupportedConfigFieldError, UnsupportedModelError)
from twinserve.backends.real.models.architectures import ARCHITECTURES
from twinserve.backends.real.models.loader import load_hf_folder, read_hf_config

from .arch_helpers import make_arch_dir


def _edit_config(src: Path, dst: Path, **changes) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 folder."""
    return make_arch_dir(tmp_path_factory.mktemp("gemma"), "Gemma3ForCausalLM")


def test_unknown_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"], "model_type": "falcon"}))
    with pytest.raises(UnsupportedArchitectureError) as e:
        read_hf_config(tmp_path)
    assert "FalconForCausalLM" in str(e.value)
    assert all(a in str(e.value) for a in ARCHITECTURES)
    assert isinstance(e.value, UnsupportedModelError)


@pytest.mark.parametrize("changes, field", [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0}}, "rope_scaling.rope_type"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"hidden_activation": "relu"}, "hidden_activation"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer_types"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
])
def test_unimplemented_config_field_is_named(gemma_dir: Path, tmp_path: Path, changes: dict, field: str) -> None:
    folder = _edit_config(gemma_dir, tmp_path / "m", **changes)
    with pytest.raises(UnsupportedConfigFieldError) as e:
        load_hf_folder(folder, 64, torch.float32)
    assert e.value.field == field and field in str(e.value)


def test_llama_with_a_sliding_window_is_refused(tmp_path: Path) -> None:
    src = make_arch_dir(tmp_path / "llama", "LlamaForCausalLM")
    folder = _edit_config(src, tmp_path / "m", sliding_window=16)
    with pytest.raises(UnsupportedConfigFieldError, match="sliding_window"):
        read_hf_config(folder)


def test_checkpoint_tensor_shape_mismatch_names_the_tensor(gemma_dir: Path, tmp_path: Path) -> None:
    folder = _edit_config(gemma_dir, tmp_path / "m", intermediate_size=96)
    with pytest.raises(CheckpointMismatchError) as e:
        load_hf_folder(folder, 64, torch.float32)
    assert ".mlp." in e.value.tensor and e.value.tensor in str(e.value)


@pytest.mark.parametrize("drop", ["model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                                  "model.layers.2.post_feedforward_layernorm.weight"])
def test_checkpoint_missing_tensor_is_named(gemma_dir: Path, tmp_path: Path, drop: str) -> None:
    # k_proj and gate_proj are shards of fused parameters: without the check their slices kept
    # their initial values and the model ran.
    from safetensors.torch import load_file, save_file

    folder = _edit_config(gemma_dir, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    tensors = load_file(str(gemma_dir / "model.safetensors"))
    assert drop in tensors
    save_file({k: v for k, v in tensors.items() if k != drop}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError) as e:
        load_hf_folder(folder, 64, torch.float32)
    assert e.value.tensor == drop and "missing" in str(e.value)


def test_llama_rope_scaling_of_an_unknown_type_is_named(tmp_path: Path) -> None:
    # Older config.json files write rope_scaling (with "type"), newer ones rope_parameters.
    src = make_arch_dir(tmp_path / "llama", "LlamaForCausalLM")
    for key, value in (("rope_scaling", {"type": "su", "factor": 2.0}),
                       ("rope_scaling", {"rope_type": "longrope", "factor": 2.0})):
        cfg = json.loads((src / "config.json").read_text())
        cfg.pop("rope_parameters", None)
        cfg[key] = value
        folder = _edit_config(src, tmp_path / f"m-{len(list(tmp_path.iterdir()))}", **cfg)
        with pytest.raises(UnsupportedConfigFieldError) as e:
            read_hf_config(folder)
        assert e.value.field.startswith("rope_scaling") and str(value.get("type") or value["rope_type"]) in str(e.value)


def test_serve_of_an_unsupported_architecture_is_a_clear_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from twinserve.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"], "model_type": "falcon"}))
    # Only a config.json: the architecture is the error, before any tokenizer or weights are looked for.
    rc = main(["generate", "--model", str(tmp_path), "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "FalconForCausalLM" in err and "LlamaForCausalLM" in err and "Traceback" not in err


def test_errors_survive_pickling() -> None:
    import pickle

    for err in (UnsupportedArchitectureError("X", ["A"], "x"), UnsupportedConfigFieldError("A", "f", 1, "none"),
                CheckpointMismatchError("t", "bad")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
