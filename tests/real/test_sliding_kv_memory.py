"""KV memory of a sliding-window model in the real engine, read from the pool's counters.

A Mistral-shaped model (every layer sliding, W = 8) at a context of 8x the window holds the
window's blocks only; a model mixing full and sliding layers (Gemma 3) keeps every block
(the documented restriction: one block table serves all layers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.real import LLM, SamplingParams

from .arch_helpers import WINDOW, hf_greedy_tokens, make_arch_dir

BS = 4


def _run_and_count(folder: Path, prompt: list[int], max_tokens: int) -> tuple[list[int], list[int], object]:
    llm = LLM(str(folder), dtype="float32", max_model_len=256, num_gpu_blocks_override=64, block_size=BS,
              max_num_batched_tokens=16)
    engine = llm.llm_engine
    kv = engine.core.scheduler.kv
    engine.add_request("r", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    in_use: list[int] = []
    tokens: list[int] = []
    for _ in range(200):  # bounded: 3 prefill chunks + 24 decodes
        for out in engine.step():
            if out.finished:
                tokens = out.outputs[0].token_ids
        if not engine.has_unfinished_requests():
            break
        in_use.append(kv.num_blocks - kv.num_free_blocks)
    return tokens, in_use, kv


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "Gemma3ForCausalLM"])
def test_blocks_in_use_at_8x_the_window(arch: str, tmp_path: Path) -> None:
    folder = make_arch_dir(tmp_path / arch, arch)
    prompt = [(7 * i) % 250 + 3 for i in range(40)]
    tokens, in_use, kv = _run_and_count(folder, prompt, 8 * WINDOW - 40)
    assert tokens == hf_greedy_tokens(folder, prompt, 8 * WINDOW - 40)
    full = -(-(8 * WINDOW - 1) // BS)  # every position's block, as full attention keeps them
    decode_steps = in_use[3:]  # after the 16-token prefill chunks
    if arch == "MistralForCausalLM":
        # The window's positions (W - 1 back from the next token) span at most ceil((W - 1) / BS) + 1
        # blocks, plus the block the next token opens; dropped lazily at block edges.
        bound = -(-(WINDOW - 1) // BS) + 2
        assert max(decode_steps) <= bound < full
        assert kv.num_window_freed >= full - bound
    else:
        assert kv.sliding_window is None and max(in_use) == full and kv.num_window_freed == 0
