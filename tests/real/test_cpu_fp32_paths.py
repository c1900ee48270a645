"""CPU fp32 products' code paths: products of 9-15 rows run padded to 16 (MKL is faster there), and
products of at most small_batch_rows rows through transposed weight copies: same rows, same tokens."""

from __future__ import annotations

import pytest
import torch

import twinserve.backends.real.models.llama as llama
from twinserve.core.sampling_params import SamplingParams

from .conftest import prompts_ids


@pytest.mark.parametrize("rows", [1, 4, 8, 9, 13, 15, 16, 40])
def test_padded_product_gives_the_unpadded_rows(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, w, b = (torch.randn(rows, 48, generator=g), torch.randn(96, 48, generator=g),
               torch.randn(96, generator=g))
    padded = llama._padded(x)
    assert padded == (16 if 9 <= rows <= 15 else 0)
    out = llama._dense(x, w, b)
    assert out.shape == (rows, 96) and out.is_contiguous()
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    # Other dtypes are never padded (bf16 has its own kernels; float64 tests stay exact).
    assert llama._padded(x.double()) == 0 and llama._padded(x.bfloat16()) == 0


def test_a_batch_in_the_padded_range_decodes_the_tokens_of_an_unpadded_run(make_llm, monkeypatch) -> None:
    # Twelve sequences decode together: every product of every decode step has 12 rows.
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(12, seed=5, lo=6, hi=20)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    # The copies up to 4 rows (the AVX2 rule), no prepacked weights (as on Intel): the 12-row
    # products go to F.linear, padded.
    llm = make_llm(dtype="float32", max_num_seqs=16, small_batch_rows=4, cpu_product_paths="linear")
    calls: list[int] = []
    real = llama._padded
    monkeypatch.setattr(llama, "_padded", lambda x: calls.append(real(x)) or real(x))
    padded = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert 16 in calls  # the padded path ran
    monkeypatch.setattr(llama, "PAD_ROWS", 0)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert padded == plain


def test_small_batch_rows_follow_the_cpu_unless_set() -> None:
    from twinserve.backends.real.config import EngineArgs
    from twinserve.core.errors import InvalidConfigError

    cpu = torch.device("cpu")
    auto = EngineArgs(dtype="float32")
    assert auto.resolve_small_batch_rows(cpu) == llama.default_small_batch_rows()
    assert EngineArgs(dtype="float32", small_batch_rows=12).resolve_small_batch_rows(cpu) == 12
    # No copies: off, or not fp32 (bf16 has its own kernels), or not the CPU.
    assert EngineArgs(dtype="float32", small_batch_weights=False).resolve_small_batch_rows(cpu) == 0
    assert EngineArgs(dtype="bfloat16", small_batch_rows=12).resolve_small_batch_rows(cpu) == 0
    assert auto.resolve_small_batch_rows(torch.device("meta")) == 0
    for bad in (0, -1, True, "4", 2.0):
        with pytest.raises(InvalidConfigError) as e:
            EngineArgs(small_batch_rows=bad)
        assert e.value.field == "small_batch_rows"


@pytest.mark.parametrize("vendor, capability, rows", [
    ("GenuineIntel", "AVX512", 64), ("GenuineIntel", "AVX2", 4), ("", "DEFAULT", 4),
    ("AuthenticAMD", "AVX512", 1), ("AuthenticAMD", "AVX2", 1)])
def test_default_small_batch_rows_by_vendor_and_vector_isa(monkeypatch, vendor: str, capability: str,
                                                           rows: int) -> None:
    monkeypatch.setattr(llama, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert llama.default_small_batch_rows() == rows
    assert llama.fp32_prepack_preferred() == (vendor == "AuthenticAMD")


def test_prepacked_fp32_products_decode_the_tokens_of_plain_products(make_llm, monkeypatch) -> None:
    """1-row products on the transposed copies, the rest on oneDNN's prepacked fp32 weights (none
    through F.linear); a verify step's 5-row products among them."""
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(12, seed=7, lo=6, hi=20)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    dense_rows: list[int] = []
    real = llama._dense
    monkeypatch.setattr(llama, "_dense", lambda x, *a: dense_rows.append(x.shape[0]) or real(x, *a))
    llm = make_llm(dtype="float32", max_num_seqs=16, small_batch_rows=1, cpu_product_paths="prepacked")
    model = llm.llm_engine.worker.model
    assert model.layers[0].mlp.down_proj.__dict__.get("weight_packed") is not None
    packed = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert not dense_rows  # prefill and 12-row decode products all took the prepacked weights
    spec = make_llm(dtype="float32", max_num_seqs=16, small_batch_rows=1, cpu_product_paths="prepacked",
                    speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    drafted = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    plain_llm = make_llm(dtype="float32", max_num_seqs=16, small_batch_weights=False, cpu_product_paths="linear")
    assert plain_llm.llm_engine.worker.model.layers[0].mlp.down_proj.__dict__.get("weight_packed") is None
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    assert dense_rows
    assert packed == plain == drafted and all(len(t) == 6 for t in packed)


def test_copies_up_to_more_rows_decode_the_tokens_of_plain_products(make_llm, monkeypatch) -> None:
    """Twelve sequences decode with the copies up to 64 rows: no 12-row product reaches F.linear,
    and the tokens are those of an engine without copies."""
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(12, seed=7, lo=6, hi=20)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    dense_rows: list[int] = []
    real = llama._dense
    monkeypatch.setattr(llama, "_dense", lambda x, *a: dense_rows.append(x.shape[0]) or real(x, *a))
    llm = make_llm(dtype="float32", max_num_seqs=16, small_batch_rows=64, prepack_weights=False)
    plan = llm.llm_engine.worker.product_plan
    assert plan.source == "small_batch_rows" and set(plan.paths()) == {"transposed"}
    copies = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert 12 not in dense_rows  # every decode step's products took the copies
    plain_llm = make_llm(dtype="float32", max_num_seqs=16, small_batch_weights=False, cpu_product_paths="linear")
    dense_rows.clear()
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    assert 12 in dense_rows
    assert copies == plain and all(len(t) == 6 for t in copies)
