"""CPU bf16: products through oneDNN-prepacked weights equal plain bf16 products, tokens unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinserve.backends.real import LLM, SamplingParams
from twinserve.backends.real.models.llama import linear, packed_bf16_supported

from .conftest import prompts_ids

pytestmark = pytest.mark.skipif(not packed_bf16_supported(), reason="this CPU has no oneDNN bf16 kernels")
KW = dict(dtype="bfloat16", max_model_len=256, num_gpu_blocks_override=256, block_size=4,
          max_num_batched_tokens=64)


def _engines(tiny_dir: Path) -> tuple[LLM, LLM]:
    return (LLM(str(tiny_dir), prepack_weights=True, **KW), LLM(str(tiny_dir), prepack_weights=False, **KW))


def test_prepacked_products_equal_plain_bf16_products(tiny_tied_dir: Path) -> None:
    packed, plain = _engines(tiny_tied_dir)
    pm, qm = packed.llm_engine.worker.model, plain.llm_engine.worker.model
    assert pm.head_packed is not None and getattr(qm, "head_packed", None) is None
    for rows in (1, 3, 16, 64):
        x = torch.randn(rows, pm.embed_tokens.weight.shape[1], dtype=torch.bfloat16)
        for a, b in ((pm.layers[0].mlp.gate_up_proj, qm.layers[0].mlp.gate_up_proj),
                     (pm.layers[-1].self_attn.qkv_proj, qm.layers[-1].self_attn.qkv_proj)):
            assert a.weight_packed is not None and torch.equal(a.weight, b.weight)
            torch.testing.assert_close(linear(x, a), torch.nn.functional.linear(x, b.weight), rtol=1.6e-2, atol=1e-2)
        # The tied LM head reads the embedding table through its packed copy.
        torch.testing.assert_close(pm.compute_logits(x), torch.nn.functional.linear(x, qm.embed_tokens.weight).float(),
                                   rtol=1.6e-2, atol=1e-2)
    # The products really read the packed copies (not the plain weights): pack doubled weights.
    x = torch.randn(5, pm.embed_tokens.weight.shape[1], dtype=torch.bfloat16)
    lin = pm.layers[0].mlp.down_proj
    x_in = torch.randn(5, lin.weight.shape[1], dtype=torch.bfloat16)
    saved = lin.weight_packed, pm.head_packed
    lin.weight_packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach() * 2, 1)
    pm.head_packed = torch.ops.mkldnn._reorder_linear_weight(pm.embed_tokens.weight.detach() * 2, 1)
    try:
        torch.testing.assert_close(linear(x_in, lin), 2 * torch.nn.functional.linear(x_in, lin.weight),
                                   rtol=1.6e-2, atol=1e-2)
        doubled = 2 * torch.nn.functional.linear(x, pm.embed_tokens.weight).float()
        torch.testing.assert_close(pm.compute_logits(x), doubled, rtol=1.6e-2, atol=2e-2)
    finally:
        lin.weight_packed, pm.head_packed = saved


def test_prepacked_weights_give_the_same_greedy_tokens(tiny_dir: Path) -> None:
    packed, plain = _engines(tiny_dir)
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(6, seed=11)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    a = packed.generate(prompts, params, use_tqdm=False)
    b = plain.generate(prompts, params, use_tqdm=False)
    same = 0
    for x, y in zip(a, b):
        xs, ys = x.outputs[0].token_ids, y.outputs[0].token_ids
        k = next((i for i in range(len(xs)) if xs[i] != ys[i]), len(xs))
        same += k
        if k < len(xs):  # a bf16 rounding flip is allowed only where the top two were nearly tied
            top = y.outputs[0].logprobs[k].top
            assert top[0][1] - top[1][1] < 0.05, (k, top)
    assert same >= 0.8 * 16 * len(prompts)
