"""CPU bf16 with int8 weight copies (--quantization int8): 1-row products read the int8 copies and
bigger batches do not (accuracy against fp32 on SmolLM2: tests/real/test_smollm2.py)."""

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
        EngineArgs(quantization="int4", dtype="bfloat16")
    with pytest.raises(InvalidConfigError, match="bfloat16"):
        EngineArgs(quantization="int8", dtype="float32")
    with pytest.raises(InvalidConfigError, match="bfloat16"):
        EngineArgs(quantization="int8", dtype="bfloat16", device="cuda")
    assert EngineArgs(quantization="int8", dtype="bf16").quantization == "int8"
