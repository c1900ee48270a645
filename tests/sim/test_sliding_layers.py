"""Which layers of an HF config slide: the simulator's reader against transformers' own layer_types."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim.hf_config import MODELS_DIR, ModelConfigError, model_from_hf_dict

BASE = json.loads((MODELS_DIR / "Qwen2.5-7B.json").read_text())
# Families whose transformers config class derives layer_types from the window keys.
FAMILIES = ("qwen2", "qwen3", "qwen2_moe", "gemma2", "gemma3_text")


def _transformers_sliding(kind: str, kw: dict) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(kind, **kw)
    return sum(t == "sliding_attention" for t in cfg.layer_types) if cfg.sliding_window else 0


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(FAMILIES), layers=st.integers(1, 40), window=st.integers(1, 8192),
       use=st.sampled_from([True, False, None]), first=st.one_of(st.none(), st.integers(0, 48)))
def test_sliding_layers_match_transformers(kind: str, layers: int, window: int, use: bool | None,
                                           first: int | None) -> None:
    kw = {"num_hidden_layers": layers, "sliding_window": window}
    if use is not None:
        kw["use_sliding_window"] = use
    if first is not None:
        kw["max_window_layers"] = first
    spec = model_from_hf_dict({**BASE, **kw, "model_type": kind}, "m")
    assert spec.num_sliding_layers == _transformers_sliding(kind, kw)
    assert spec.sliding_window == (window if spec.num_sliding_layers else spec.sliding_window)


def test_qwen2_max_window_layers_leaves_the_first_layers_full() -> None:
    """Issue 53 item 18: 28 layers, max_window_layers 21: 7 slide (it read all 28)."""
    spec = model_from_hf_dict({**BASE, "use_sliding_window": True, "sliding_window": 4096,
                               "max_window_layers": 21}, "m")
    assert (spec.sliding_window, spec.num_sliding_layers) == (4096, 7)


def test_a_window_of_an_unknown_family_without_layer_types_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="layer_types"):
        model_from_hf_dict({**BASE, "model_type": "somefamily", "sliding_window": 512,
                            "use_sliding_window": True}, "m")
    # With layer_types it is read as written.
    spec = model_from_hf_dict({**BASE, "model_type": "somefamily", "sliding_window": 512, "use_sliding_window": True,
                               "layer_types": ["sliding_attention", "full_attention"] * 14}, "m")
    assert spec.num_sliding_layers == 14
