"""A model folder whose config.json is broken (a download cut short, a hand edit, not text) is an
UnsupportedModelError naming the file (and line or field), and `twinserve generate` exits 2 without a
traceback: it let a raw JSONDecodeError, AttributeError, KeyError, TypeError or UnicodeDecodeError out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.backends.real.models.loader import read_hf_config
from twinserve.core.errors import UnsupportedModelError

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-5}


def _missing(key: str) -> str:
    return json.dumps({k: v for k, v in LLAMA.items() if k != key})


@pytest.mark.parametrize("body, expect", [
    (b'{"architectures": ["LlamaForCausalLM"],\n  "hidden_size": 64,\n  "num_hidden',
     r"config\.json:3: not valid JSON"),
    (b"[1, 2]", r"config\.json: a config\.json holds one JSON object, not list"),
    (_missing("num_attention_heads").encode(), r"config\.json: field 'num_attention_heads' is missing"),
    (json.dumps({**LLAMA, "hidden_size": "64"}).encode(), r"config\.json: field 'hidden_size' is '64': an integer"),
    (json.dumps({**LLAMA, "num_hidden_layers": 2.5}).encode(), r"config\.json: field 'num_hidden_layers' is 2\.5"),
    (b"\xff\xfe{\x00", r"config\.json:1: not UTF-8 text"),
], ids=["cut-short", "not-object", "missing-field", "text-size", "float-layers", "binary"])
def test_a_broken_config_json_is_a_typed_error_naming_the_file(tmp_path: Path, body: bytes, expect: str) -> None:
    (tmp_path / "config.json").write_bytes(body)
    with pytest.raises(UnsupportedModelError, match=expect):
        read_hf_config(tmp_path)


def test_the_good_config_still_reads(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    cfg = read_hf_config(tmp_path)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 2, 256)


def test_generate_exits_2_on_a_broken_config_json(tmp_path: Path, capsys) -> None:
    from twinserve.cli import main

    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_')
    rc = main(["generate", "hi", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert f"{tmp_path / 'config.json'}:1: not valid JSON" in err, err


@pytest.mark.parametrize("body", [b"not a gguf file at all", b"GGUF\x03\x00\x00\x00cut short"],
                         ids=["magic", "cut-short"])
def test_a_file_named_gguf_that_is_not_one_is_a_typed_error(tmp_path: Path, capsys, body: bytes) -> None:
    from twinserve.backends.real.models.loader import peek_model_config
    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.cli import main

    f = tmp_path / "m.gguf"
    f.write_bytes(body)
    with pytest.raises(UnsupportedModelError, match=rf"{f}: not a readable GGUF file"):
        peek_model_config(resolve_model(str(f)))
    rc = main(["generate", "hi", "--model", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and f"{f}: not a readable GGUF file" in err, err


@pytest.mark.parametrize("body", ['{"version": "1.0", "model": 3}',
                                  '{"version": "1.0", "added_tokens": [], "model": {"type": "Nope"}}'],
                         ids=["no-added-tokens", "unknown-model"])
def test_a_tokenizer_json_of_the_wrong_shape_is_a_typed_error(tmp_path: Path, body: str) -> None:
    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.backends.real.tokenizer import load_tokenizer

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    (tmp_path / "tokenizer.json").write_text(body)
    with pytest.raises(UnsupportedModelError, match=rf"cannot load a tokenizer for {tmp_path}"):
        load_tokenizer(resolve_model(str(tmp_path)))


@pytest.mark.parametrize("body", [b"garbage", b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a": 1}' + b" " * 8],
                         ids=["too-small", "bad-header"])
def test_a_safetensors_file_that_is_not_one_is_a_typed_error_naming_it(tmp_path: Path, body: bytes) -> None:
    import torch

    from twinserve.backends.real.models.loader import load_hf_folder

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    f = tmp_path / "model.safetensors"
    f.write_bytes(body)
    with pytest.raises(UnsupportedModelError, match=rf"{f}: not a readable safetensors file"):
        load_hf_folder(tmp_path, 64, torch.float32)
