"""KV memory of sliding-window models in the real engine, read from the pool's counters.

A Mistral-shaped model (every layer sliding, W = 8) at a context of 8x the window holds the
window's blocks only. A Gemma-3-shaped model (12 layers, 5 local : 1 global) has KV groups of two
layers: one full group and five sliding ones over one pool; the pages in use equal the formula.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.real import LLM, SamplingParams

from .arch_helpers import WINDOW, hf_greedy_tokens, make_arch_dir

BS = 4
PROMPT = [(7 * i) % 250 + 3 for i in range(40)]
MAX_TOKENS = 8 * WINDOW - 40  # the context ends at 8x the window


def _run(folder: Path, prompt: list[int], max_tokens: int, **kw):
    """(tokens, per step: (pages in use, table length, computed tokens before the step), kv)."""
    llm = LLM(str(folder), dtype="float32", max_model_len=256, block_size=BS, max_num_batched_tokens=16, **kw)
    engine = llm.llm_engine
    sched = engine.core.scheduler
    kv = sched.kv
    engine.add_request("r", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    steps: list[tuple[int, int, int]] = []
    tokens: list[int] = []
    for _ in range(200):  # bounded: 3 prefill chunks + 24 decodes
        req = sched.requests.get("r")
        before = req.num_computed_tokens if req is not None else 0
        for out in engine.step():
            if out.finished:
                tokens = out.outputs[0].token_ids
        if not engine.has_unfinished_requests():
            break
        steps.append((kv.num_blocks - kv.num_free_blocks, len(kv.req_to_blocks["r"]), before))
    return tokens, steps, kv


def test_mistral_holds_the_window_at_8x_the_window(tmp_path: Path) -> None:
    folder = make_arch_dir(tmp_path / "mistral", "MistralForCausalLM")
    tokens, steps, kv = _run(folder, PROMPT, MAX_TOKENS, num_gpu_blocks_override=64)
    assert tokens == hf_greedy_tokens(folder, PROMPT, MAX_TOKENS)
    full = -(-(8 * WINDOW - 1) // BS)  # every position's block, as full attention keeps them
    decode_steps = [used for used, _, _ in steps[3:]]  # after the 16-token prefill chunks
    # The window's positions (W - 1 back from the next token) span at most ceil((W - 1) / BS) + 1
    # blocks, plus the block the next token opens; dropped lazily at block edges.
    bound = -(-(WINDOW - 1) // BS) + 2
    assert max(decode_steps) <= bound < full
    assert kv.num_window_freed >= full - bound


def test_gemma3_pages_in_use_follow_the_group_formula_at_8x_the_window(tmp_path: Path) -> None:
    folder = make_arch_dir(tmp_path / "gemma3", "Gemma3ForCausalLM", gemma_layers=12)
    # Without the prefix cache a table grows exactly when the manager allocates (and drops).
    tokens, steps, kv = _run(folder, PROMPT, MAX_TOKENS, num_gpu_blocks_override=200,
                             enable_prefix_caching=False)
    assert tokens == hf_greedy_tokens(folder, PROMPT, MAX_TOKENS)
    num_full, num_sliding = 1, 5  # groups of two layers
    grown_at = 0  # computed tokens when the table last grew
    last = 0
    for used, length, before in steps:
        if length != last:
            grown_at, last = before, length
        # Full group: every block; each sliding group: the blocks from its window's start on.
        formula = num_full * length + num_sliding * (length - max(0, grown_at - WINDOW + 1) // BS)
        assert used == formula, (used, length, before)
    assert kv.group_windows == (None,) + (WINDOW,) * 5
    final_used, final_len, _ = steps[-1]
    assert final_len == 8 * WINDOW // BS
    # Each local group ends with about a window's blocks: under half of all-layers-full here.
    assert final_used <= num_full * final_len + num_sliding * (-(-(WINDOW - 1) // BS) + 2)
    assert final_used < (num_full + num_sliding) * final_len // 2
    assert kv.num_window_freed > 0


@pytest.mark.parametrize("engine_kw", [
    {"enable_prefix_caching": True},
    {"max_num_batched_tokens": 5},
    # Rejected drafts drop the same tail from every group's table.
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}},
], ids=["prefix-cache", "chunked-5", "ngram-drafts"])
def test_gemma3_groups_of_two_layers_match_transformers(tmp_path: Path, engine_kw: dict) -> None:
    """Layer j of every group shares tensor j: tokens still equal transformers' past the window."""
    # The 12-layer random model repeats one token, so every draft would pass: drafts run on the
    # 4-layer one (4 groups of one layer), whose continuations reject some.
    layers = None if "speculative_config" in engine_kw else 12
    folder = make_arch_dir(tmp_path / "gemma3", "Gemma3ForCausalLM", gemma_layers=layers)
    kw = dict(dtype="float32", max_model_len=256, block_size=BS, num_gpu_blocks_override=120,
              max_num_batched_tokens=16)
    kw.update(engine_kw)
    llm = LLM(str(folder), **kw)
    # The third prompt repeats itself, so ngram drafts are proposed (and some rejected).
    prompts = [PROMPT, PROMPT[:30] + [9, 9, 9], [(5 * i) % 20 + 1 for i in range(27)]]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy_tokens(folder, p, 20)
    if "speculative_config" in engine_kw:
        drafts = sum(o.metrics.num_draft_tokens for o in outs)
        assert drafts > sum(o.metrics.num_accepted_tokens for o in outs)  # some rejected: trimmed
    if engine_kw.get("enable_prefix_caching"):
        # The second prompt shares 7 blocks with the first: a hit across all six groups.
        assert outs[1].metrics.num_cached_tokens > 0


def test_the_front_end_counts_a_requests_pages_as_the_core_does(tmp_path: Path) -> None:
    """Both refuse exactly the requests the pool's pages over all groups can never hold."""
    from twinserve.core.errors import PromptTooLongError

    folder = make_arch_dir(tmp_path / "gemma3", "Gemma3ForCausalLM")  # 4 groups of one layer
    llm = LLM(str(folder), dtype="float32", max_model_len=256, block_size=BS, num_gpu_blocks_override=40,
              max_num_batched_tokens=16)
    engine = llm.llm_engine
    kv = engine.core.scheduler.kv
    verdicts = []
    for n in range(4, 240, 4):
        try:
            engine._check_fits(n, SamplingParams(max_tokens=1))
        except PromptTooLongError:
            verdicts.append((n, False, kv.can_fit(n)))
        else:
            verdicts.append((n, True, kv.can_fit(n)))
    assert all(front == core for _, front, core in verdicts)
    # The full group's blocks plus three sliding groups' window: 76 tokens fit, 80 do not.
    assert [n for n, ok, _ in verdicts if ok][-1] == 76
