"""Which layers slide, three ways that must agree: transformers' own config class (built here, no
download), the engine's architecture records (backends/real) and the simulator's reader
(backends/sim/hf_config) -- issue 53 item 18."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.real.models.architectures import ARCHITECTURES
from twinserve.backends.sim.hf_config import MODELS_DIR, model_from_hf_dict

WINDOW_KEYS = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")


def _base(name: str) -> dict:
    """A shipped config.json without its window keys (each test gives its own, or leaves them out)."""
    data = json.loads((MODELS_DIR / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if k not in WINDOW_KEYS}


QWEN, MISTRAL = _base("Qwen2.5-7B"), _base("Mistral-7B-v0.1")
KINDS = {"qwen2": ("Qwen2ForCausalLM", QWEN), "qwen3": ("Qwen3ForCausalLM", QWEN),
         "mistral": ("MistralForCausalLM", MISTRAL)}


def _transformers_windows(kind: str, kw: dict) -> list[int | None]:
    """Per-layer windows as transformers' config class derives them (None: full attention)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(kind, **kw)
    types = getattr(cfg, "layer_types", None)
    if types is None:  # Mistral's class has no layer_types: every layer takes sliding_window
        return [cfg.sliding_window] * cfg.num_hidden_layers
    return [cfg.sliding_window if t == "sliding_attention" and cfg.sliding_window else None for t in types]


def _engine_windows(kind: str, data: dict) -> list[int | None]:
    arch, _ = KINDS[kind]
    return list(ARCHITECTURES[arch].config_from_hf({**data, "architectures": [arch]}).layer_windows)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), layers=st.integers(1, 48), window=st.integers(1, 8192),
       use=st.sampled_from([True, False, None]), first=st.one_of(st.none(), st.integers(0, 48)))
def test_engine_simulator_and_transformers_slide_the_same_layers(kind: str, layers: int, window: int,
                                                                 use: bool | None, first: int | None) -> None:
    kw: dict = {"num_hidden_layers": layers, "sliding_window": window}
    if use is not None:
        kw["use_sliding_window"] = use
    if first is not None:
        kw["max_window_layers"] = first
    want = _transformers_windows(kind, kw)
    data = {**KINDS[kind][1], **kw, "model_type": kind}
    assert _engine_windows(kind, data) == want
    spec = model_from_hf_dict(data, "m")
    assert spec.num_sliding_layers == sum(w is not None for w in want)
    assert spec.sliding_window == next((w for w in want if w is not None), spec.sliding_window)


@pytest.mark.parametrize("layers, first", [(28, 21), (32, None), (40, 28)])
def test_qwen2_max_window_layers_per_layer(layers: int, first: int | None) -> None:
    """Layers below max_window_layers (Qwen2Config's default 28 when absent) are full, the rest slide."""
    kw = {"num_hidden_layers": layers, "sliding_window": 4096, "use_sliding_window": True}
    if first is not None:
        kw["max_window_layers"] = first
    want = _transformers_windows("qwen2", kw)
    edge = 28 if first is None else first
    assert want == [None] * min(edge, layers) + [4096] * max(0, layers - edge)
    assert _engine_windows("qwen2", {**QWEN, **kw}) == want
