"""End to end: the Triton attention backend (interpreted here) gives the torch backend's tokens."""

from __future__ import annotations

import pytest

from twinserve.core import SamplingParams

from .conftest import prompts_ids


@pytest.mark.slow
def test_two_layer_model_same_greedy_tokens_with_triton_and_torch(make_llm):
    # fp32: the interpreter computes bf16 wrongly and the kernels take no fp64.
    # Mixed prefill + decode, chunked prefill and block tables that span several blocks.
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(4, seed=7, lo=5, hi=30)]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    common = dict(dtype="float32", block_size=16, max_num_batched_tokens=32, max_num_seqs=4,
                  num_gpu_blocks_override=64)
    torch_out = make_llm(attention_backend="torch", **common).generate(prompts, sp, use_tqdm=False)
    triton_llm = make_llm(attention_backend="triton", **common)
    assert type(triton_llm.llm_engine.worker.backend).__name__ == "TritonPagedAttention"
    triton_out = triton_llm.generate(prompts, sp, use_tqdm=False)
    want = [o.outputs[0].token_ids for o in torch_out]
    got = [o.outputs[0].token_ids for o in triton_out]
    assert all(len(t) == 8 for t in want)
    assert got == want
