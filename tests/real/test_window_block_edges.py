"""Freed window blocks at an unaligned edge (window 13, blocks of 16), seen in the KV a position reads.

The runner keeps a freed block's id and data until the block is reused, so a block freed one
token too early reads fine until another request overwrites it. Here every freed block is
poisoned at once (as an immediate reuse would), so a too-early free changes the logprobs; a
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

from .arch_helpers import hf_greedy_tokens, hf_logits, make_arch_dir

WINDOW, BS = 13, 16
# K = 0 gives a poisoned slot an ordinary score whatever the query (a uniform large K can score
# -inf-like and hide); V = POISON then swamps the output. Finite: masked slots multiply it by 0.
POISON = 1000.0
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
                k[ids] = 0.0
                v[ids] = POISON
            poisoned.extend(ids)

    monkeypatch.setattr(BlockPool, "free_blocks", free_and_poison)
    return poisoned


@pytest.mark.parametrize("first_chunk", [WINDOW + 14, WINDOW + 15], ids=["last-slot", "first-slot"])
def test_a_freed_window_block_is_never_read_and_pages_follow_the_formula(
        window_dir: Path, first_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
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
                       SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1))
    tokens: list[int] = []
    logprobs: list[float] = []
    grown_at, last = 0, 0
    pages: list[tuple[int, int, int]] = []  # (computed before the step, pages in use, formula)
    for _ in range(4 * MAX_TOKENS):  # bounded: 2 prefill chunks + 20 decodes
        before = sched.requests["r"].num_computed_tokens
        outs = engine.step()
        if not engine.has_unfinished_requests():
            done = next(o for o in outs if o.finished).outputs[0]
            tokens, logprobs = done.token_ids, [lp.logprob for lp in done.logprobs]
            break
        length = len(kv.req_to_blocks["r"])
        if length != last:
            grown_at, last = before, length
        # Full groups keep every block; each sliding group the blocks from its window's start on.
        formula = num_full * length + num_sliding * (length - max(0, grown_at - WINDOW + 1) // BS)
        pages.append((before, kv.num_blocks - kv.num_free_blocks, formula))
    assert kv.num_window_freed > 0 and poisoned  # blocks 0 and 1 left the window mid-request, poisoned
    # What users see: a block freed too early was poisoned before a position in its window read it.
    assert tokens == hf_greedy_tokens(window_dir, PROMPT, MAX_TOKENS)
    # The tiny random model's argmax survives one poisoned slot of 13; its logprobs do not (0.3 off).
    ref = torch.log_softmax(hf_logits(window_dir, PROMPT + tokens).float(), -1)
    expected = [ref[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(tokens)]
    torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=1e-4, rtol=1e-4)
    assert first_chunk in [before for before, _, _ in pages]  # the growth at the unaligned edge was checked
    assert [(b, used) for b, used, _ in pages] == [(b, formula) for b, _, formula in pages]
