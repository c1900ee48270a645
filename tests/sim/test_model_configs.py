"""Models from HF config.json: the shipped configs against their published sizes, the MoE,
sliding-window and precision arithmetic, and what a config's shape does to a step's cost."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim import get_hardware, get_model, kv_capacity
from twinserve.backends.sim.cost_model import RooflineCostModel
from twinserve.backends.sim.hf_config import MODELS_DIR, ModelConfigError, load_hf_config
from twinserve.backends.sim.precision import Precision

# Published totals (model cards / the safetensors totals Hugging Face shows; sources in
# backends/sim/models/README.md): (total, active per token) in billions.
PUBLISHED = {
    "Llama-3.1-8B": (8.03, None), "Llama-3.1-70B": (70.6, None), "Llama-3.1-405B": (406.0, None),
    "Qwen2.5-7B": (7.61, None), "Qwen2.5-72B": (72.7, None), "Qwen3-8B": (8.2, None),
    "Qwen3-32B": (32.8, None), "Qwen3-30B-A3B": (30.5, 3.3), "Mixtral-8x7B": (46.7, 12.9),
    "Mistral-7B-v0.1": (7.24, None),
    "Gemma-3-27B": (27.4 - 0.42, None),  # text decoder only: less the 0.42B SigLIP encoder
}
# Published totals are rounded to 2-3 digits and leave out norms and biases: 2%.
TOLERANCE = 0.02


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_config_matches_its_published_parameter_count(name: str) -> None:
    m = get_model(name)
    total, active = PUBLISHED[name]
    assert m.num_params / 1e9 == pytest.approx(total, rel=TOLERANCE)
    if active is not None:
        assert m.is_moe and m.num_active_params / 1e9 == pytest.approx(active, rel=0.03)
    else:
        assert m.num_active_params == m.num_params


def test_every_shipped_config_is_in_the_readme_and_the_table_above() -> None:
    files = {p.stem for p in MODELS_DIR.glob("*.json")}
    assert files == set(PUBLISHED)
    readme = (MODELS_DIR / "README.md").read_text()
    assert all(f"{f}.json" in readme for f in files)


def test_sliding_window_layouts_follow_each_family() -> None:
    gemma, mistral, qwen = get_model("Gemma-3-27B"), get_model("Mistral-7B-v0.1"), get_model("Qwen2.5-7B")
    assert (gemma.sliding_window, gemma.num_sliding_layers) == (1024, 52)  # 5 of every 6 of 62
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 32)
    assert qwen.num_sliding_layers == 0  # use_sliding_window = false
    assert gemma.tie_word_embeddings  # not written in the file: Gemma's default


def test_a_folder_and_a_file_give_the_same_spec(tmp_path) -> None:
    folder = tmp_path / "Llama-3.1-70B"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS_DIR / "Llama-3.1-70B.json").read_text())
    assert load_hf_config(folder) == get_model("Llama-3.1-70B")


@pytest.mark.parametrize("edit, field, message", [
    (lambda c: c.pop("hidden_size"), "hidden_size", "missing"),
    (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers", ">= 1"),
    (lambda c: c.update(intermediate_size=-5), "intermediate_size", ">= 1"),
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok", "more than the 8"),
    (lambda c: c.update(num_key_value_heads=5), "num_key_value_heads", "does not divide"),
    (lambda c: c.update(vocab_size="big"), "vocab_size", "not an integer"),
    (lambda c: c.update(layer_types=["mamba"] * 32), "layer_types", "not modelled"),
    (lambda c: c.update(layer_types=["linear_attention"] * 32), "linear_num_key_heads", "missing"),
    (lambda c: c.update(first_k_dense_replace=33), "first_k_dense_replace", "more than num_hidden_layers"),
    (lambda c: c.update(kv_lora_rank=512), "qk_rope_head_dim", "missing"),
])
def test_bad_config_names_file_line_and_field(tmp_path, edit, field: str, message: str) -> None:
    cfg = json.loads((MODELS_DIR / "Mixtral-8x7B.json").read_text())
    edit(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg, indent=2))
    with pytest.raises(ModelConfigError) as got:
        load_hf_config(p)
    e = got.value
    assert e.field == field and e.file == str(p) and message in str(e)
    lines = p.read_text().splitlines()
    assert e.line is not None and (field in lines[e.line - 1] or "missing" in message)


def test_precision_moves_bytes_and_peaks() -> None:
    m, h = get_model("Llama-3.1-70B"), get_hardware("H100-SXM")
    fp8 = m.with_precision(Precision(quantization="fp8", kv_cache_dtype="fp8"))
    int4 = m.with_precision(Precision(quantization="int4"))
    assert fp8.kv_bytes_per_token * 2 == m.kv_bytes_per_token
    # Layer weights halve; the 16-bit embeddings and LM head do not.
    emb = m.embedding_params * 2
    assert fp8.weight_bytes - emb == pytest.approx((m.weight_bytes - emb) / 2)
    assert 0.25 < (int4.weight_bytes - emb) / (m.weight_bytes - emb) < 0.30
    bf, f8 = RooflineCostModel(m, h, 2), RooflineCostModel(fp8, h, 2)
    # Prefill is GEMM-bound: FP8 tensor cores make it nearly twice as fast.
    assert 1.6 < bf.step_time(4096, 1, 0, 4096 * 2048.0, 0, 0) / f8.step_time(4096, 1, 0, 4096 * 2048.0, 0, 0) < 2.0
    # Decode at batch 1 is a weight read: about half the bytes, not quite half the time.
    assert 1.5 < bf.step_time(0, 0, 0, 0.0, 1, 1000) / f8.step_time(0, 0, 0, 0.0, 1, 1000) < 2.0
    # A100 has no FP8 tensor cores: FP8 weights are read faster, GEMMs stay at the 16-bit peak.
    a = get_hardware("A100-80GB")
    assert a.gemm_peak(fp8.precision) == a.peak_flops and h.gemm_peak(fp8.precision) == h.peak_flops_fp8
    # More room for KV: the capacity gain FP8 buys at TP 2.
    assert kv_capacity(fp8, h, 2, 16).num_blocks > 3 * kv_capacity(m, h, 2, 16).num_blocks


@settings(max_examples=60, deadline=None)
@given(experts=st.integers(1, 256), k=st.integers(1, 16), tokens=st.integers(0, 100_000))
def test_expected_distinct_experts_is_bounded_and_grows(experts: int, k: int, tokens: int) -> None:
    k = min(k, experts)
    m = get_model("Mixtral-8x7B")
    from dataclasses import replace
    m = replace(m, num_experts=experts, num_experts_per_tok=k)
    d = m.expected_experts(tokens)
    assert 0.0 <= d <= experts + 1e-9
    if tokens >= 1:
        assert d >= k - 1e-9 and m.expected_experts(tokens + 1) >= d - 1e-12
    assert m.expected_experts(1) == pytest.approx(k)


def test_moe_decode_costs_more_at_small_batches_and_converges_with_its_dense_twin() -> None:
    """Mixtral against a dense model of the same active parameters (its top-2 MLPs fused)."""
    moe = get_model("Mixtral-8x7B")
    from dataclasses import replace
    dense = replace(moe, name="dense-twin", num_experts=0, num_experts_per_tok=0,
                    intermediate_size=2 * moe.moe_intermediate_size, moe_intermediate_size=0)
    assert dense.num_active_params == pytest.approx(moe.num_active_params, rel=1e-4)
    h = get_hardware("H100-SXM")
    cm, cd = RooflineCostModel(moe, h, 2), RooflineCostModel(dense, h, 2)
    ratio = {b: cm.step_time(0, 0, 0, 0.0, b, b * 500) / cd.step_time(0, 0, 0, 0.0, b, b * 500)
             for b in (1, 8, 64, 4096)}
    assert ratio[1] > 1.0                  # the router and its kernels
    assert ratio[8] > 1.5 and ratio[64] > 1.5  # a batch touches most experts: ~4x the bytes
    assert ratio[4096] < 1.1               # compute-bound: the same FLOPs per token


def test_sliding_window_caps_the_kv_read_of_long_contexts() -> None:
    m = get_model("Mistral-7B-v0.1")
    from dataclasses import replace
    full = replace(m, sliding_window=0, num_sliding_layers=0)
    h = get_hardware("A100-80GB")
    win, ful = RooflineCostModel(m, h), RooflineCostModel(full, h)
    short = (0, 0, 0, 0.0, 32, 32 * 1000)
    long = (0, 0, 0, 0.0, 32, 32 * 30_000)
    assert win.step_time(*short) == ful.step_time(*short)  # inside the window: identical
    assert win.step_time(*long) < 0.5 * ful.step_time(*long)
