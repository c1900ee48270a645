"""CPU bf16 with int8 or int4 weight copies (--quantization int8|int4): 1-row products read the
copies and bigger batches do not (accuracy against fp32 on SmolLM2: tests/real/test_smollm2.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinserve.backends.real import LLM
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.models.llama import INT8_ROWS, linear
from twinserve.core.errors import InvalidConfigError

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int8pack_mm"),
                                reason="this torch has no weight-only int8 kernel")
KW = dict(dtype="bfloat16", max_model_len=256, num_gpu_blocks_override=256, block_size=4,
          max_num_batched_tokens=64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


def test_one_row_products_read_the_int8_copies_and_bigger_batches_do_not(tiny_tied_dir: Path) -> None:
    q = LLM(str(tiny_tied_dir), quantization="int8", **KW).llm_engine.worker.model
    plain = LLM(str(tiny_tied_dir), **KW).llm_engine.worker.model
    hidden = q.embed_tokens.weight.shape[1]
    for rows in range(1, INT8_ROWS + 1):
        for a, b in ((q.layers[0].mlp.gate_up_proj, plain.layers[0].mlp.gate_up_proj),
                     (q.layers[-1].self_attn.o_proj, plain.layers[-1].self_attn.o_proj)):
            x = torch.randn(rows, a.weight.shape[1], dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x.float(), b.weight.float())
            # int8 rounding of each weight row (1/254 of its largest value), on top of bf16's
            assert _rel(linear(x, a), ref) < 0.02
        x = torch.randn(rows, hidden, dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), plain.embed_tokens.weight.float())
        assert _rel(q.compute_logits(x), ref) < 0.02  # the tied LM head too
    # They read the int8 copies: doubling the scales doubles a 1-row product and the logits.
    lin = q.layers[0].mlp.down_proj
    x1 = torch.randn(1, lin.weight.shape[1], dtype=torch.bfloat16)
    h1 = torch.randn(1, hidden, dtype=torch.bfloat16)
    before, logits = linear(x1, lin).float(), q.compute_logits(h1)
    saved = lin.weight_scale, q.head_scale
    lin.weight_scale, q.head_scale = saved[0] * 2, saved[1] * 2
    try:
        torch.testing.assert_close(linear(x1, lin).float(), 2 * before, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(q.compute_logits(h1), 2 * logits, rtol=1e-2, atol=2e-2)
        # More rows than INT8_ROWS: the bf16 weights, exactly as without quantization.
        x = torch.randn(INT8_ROWS + 3, lin.weight.shape[1], dtype=torch.bfloat16)
        assert torch.equal(linear(x, lin), linear(x, plain.layers[0].mlp.down_proj))
        h = torch.randn(INT8_ROWS + 3, hidden, dtype=torch.bfloat16)
        assert torch.equal(q.compute_logits(h), plain.compute_logits(h))
    finally:
        lin.weight_scale, q.head_scale = saved


def test_quantization_is_checked_before_anything_loads() -> None:
    with pytest.raises(InvalidConfigError, match="quantization"):
        EngineArgs(quantization="int3", dtype="bfloat16")
    with pytest.raises(InvalidConfigError, match="bfloat16"):
        EngineArgs(quantization="int8", dtype="float32")
    with pytest.raises(InvalidConfigError, match="bfloat16"):
        EngineArgs(quantization="int8", dtype="bfloat16", device="cuda")
    assert EngineArgs(quantization="int8", dtype="bf16").quantization == "int8"
    with pytest.raises(InvalidConfigError, match="bfloat16"):
        EngineArgs(quantization="int4", dtype="float32")
    assert EngineArgs(quantization="int4", dtype="bf16").quantization == "int4"


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="no CPU int4 kernel")
def test_int4_one_row_products_read_their_groups_and_bigger_batches_do_not(tiny_tied_dir: Path) -> None:
    from twinserve.backends.real.models.llama import INT4_GROUP

    q = LLM(str(tiny_tied_dir), quantization="int4", **KW).llm_engine.worker.model
    plain = LLM(str(tiny_tied_dir), **KW).llm_engine.worker.model
    for a, b in ((q.layers[0].mlp.gate_up_proj, plain.layers[0].mlp.gate_up_proj),
                 (q.layers[-1].self_attn.qkv_proj, plain.layers[-1].self_attn.qkv_proj),
                 (q.layers[0].mlp.down_proj, plain.layers[0].mlp.down_proj)):
        x = torch.randn(1, a.weight.shape[1], dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), b.weight.float())
        # 16 levels per group of 32 weights: the random test weights are far off any 4-bit grid
        assert _rel(linear(x, a), ref) < 0.15
        # More rows: the bf16 weights, exactly as without quantization.
        x = torch.randn(INT8_ROWS + 3, a.weight.shape[1], dtype=torch.bfloat16)
        assert torch.equal(linear(x, a), linear(x, b))
    assert q.head_int8.dtype == torch.int8  # the LM head keeps int8 for one row
    # Weights already on a 4-bit grid (as a Q4_1 model's are) come back up to bf16 rounding.
    lin = q.layers[0].mlp.down_proj
    n, k = lin.weight.shape
    levels = torch.randint(0, 16, (n, k // INT4_GROUP, INT4_GROUP)).float()
    grid = (levels * (torch.rand(n, k // INT4_GROUP, 1) * 0.02 + 0.005)
            - torch.rand(n, k // INT4_GROUP, 1) * 0.1).view(n, k)
    with torch.no_grad():
        lin.weight.copy_(grid)
    q.add_int4_weights()
    x = torch.randn(1, k, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), lin.weight.float())
    assert _rel(linear(x, lin), ref) < 0.03
    # It reads the int4 copy: doubling the scales and offsets doubles the product.
    before, saved = linear(x, lin).float(), lin.weight_int4_sz
    lin.weight_int4_sz = saved * 2
    try:
        torch.testing.assert_close(linear(x, lin).float(), 2 * before, rtol=2e-2, atol=2e-2)
    finally:
        lin.weight_int4_sz = saved
