"""CPU fp32 products of 9-15 rows run padded to 16 (MKL is faster there): same rows, same tokens."""

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
    llm = make_llm(dtype="float32", max_num_seqs=16)
    calls: list[int] = []
    real = llama._padded
    monkeypatch.setattr(llama, "_padded", lambda x: calls.append(real(x)) or real(x))
    padded = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert 16 in calls  # the padded path ran
    monkeypatch.setattr(llama, "PAD_ROWS", 0)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert padded == plain
