"""Freed window blocks at an unaligned edge (window 13, blocks of 16), seen in the KV a position reads.

The runner keeps a freed block's id and data until the block is reused, so a block freed one
token too early reads fine until another request overwrites it. Here every freed block is
poisoned at once (as an immediate reuse would), so a too-early free changes the tokens; a
too-late one is caught by the pages in use, which must equal the formula at every step.
Drops happen when a table grows: in decode only at c = 16m, where c - W + 1 = 16m - 12 sits
mid-block and hides a +k for k < 12. A first prefill chunk of W + 14 (W + 15) puts the next
growth at c with c - W + 1 at a block's last (first) slot: an off-by-one either way shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinserve.backends.real import LLM, SamplingParams

from .arch_helpers import hf_greedy_tokens, make_arch_dir

WINDOW, BS = 13, 16
POISON = 50.0  # finite: masked positions multiply it by 0; an attended one dominates its softmax
PROMPT = [(11 * i) % 250 + 3 for i in range(34)]  # the second chunk crosses into block 2
MAX_TOKENS = 20  # decodes past c = 48, where the window leaves blocks 0 and 1


@pytest.fixture(scope="module", params=["MistralForCausalLM", "Gemma3ForCausalLM"])
def window_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sliding group (Mistral); full and sliding groups over one pool (Gemma 3)."""
    return make_arch_dir(tmp_path_factory.mktemp(request.param), request.param, window=WINDOW)


def _poison_freed_blocks(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fill every block the pool frees with POISON in all layers; the ids poisoned, in order."""
    from twinserve.core.kv.block_pool import BlockPool

    caches = llm.llm_engine.worker.runner.kv_caches
    free = BlockPool.free_blocks  # the pool has __slots__: patched on the class, undone by monkeypatch
    poisoned: list[int] = []

    def free_and_poison(pool: BlockPool, blocks) -> None:
        blocks = list(blocks)
        free(pool, blocks)
        ids = [b.block_id for b in blocks if b.ref_cnt == 0]
        if ids:
            for k, v in caches:
                k[ids] = POISON
                v[ids] = POISON
            poisoned.extend(ids)

    monkeypatch.setattr(BlockPool, "free_blocks", free_and_poison)
    return poisoned


@pytest.mark.parametrize("first_chunk", [WINDOW + 14, WINDOW + 15], ids=["last-slot", "first-slot"])
def test_a_freed_window_block_is_never_read_and_pages_follow_the_formula(window_dir: Path,
                                                                        first_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # No prefix cache: a freed cached block stays hittable, and poisoning it would be the test's bug.
    llm = LLM(str(window_dir), dtype="float32", max_model_len=256, block_size=BS, num_gpu_blocks_override=64,
              max_num_batched_tokens=first_chunk, enable_prefix_caching=False)
    engine = llm.llm_engine
    sched = engine.core.scheduler
    kv = sched.kv
    windows = getattr(kv, "group_windows", None) or (kv.sliding_window,)
    num_full = sum(w is None for w in windows)
    num_sliding = len(windows) - num_full
    poisoned = _poison_freed_blocks(llm, monkeypatch)
    engine.add_request("r", {"prompt_token_ids": PROMPT},
                       SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    tokens: list[int] = []
    grown_at, last, checked = 0, 0, []
    for _ in range(4 * MAX_TOKENS):  # bounded: 2 prefill chunks + 20 decodes
        before = sched.requests["r"].num_computed_tokens
        outs = engine.step()
        if not engine.has_unfinished_requests():
            tokens = next(o for o in outs if o.finished).outputs[0].token_ids
            break
        length = len(kv.req_to_blocks["r"])
        if length != last:
            grown_at, last = before, length
        used = kv.num_blocks - kv.num_free_blocks
        # Full groups keep every block; each sliding group the blocks from its window's start on.
        assert used == num_full * length + num_sliding * (length - max(0, grown_at - WINDOW + 1) // BS), (
            used, length, before)
        checked.append(before)
    assert first_chunk in checked  # the growth at the unaligned edge was checked
    assert kv.num_window_freed > 0 and poisoned  # block 0 left the window mid-request, and was poisoned
    assert tokens == hf_greedy_tokens(window_dir, PROMPT, MAX_TOKENS)
