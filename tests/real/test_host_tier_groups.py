"""The real engine's host tier with KV groups: a tiny random-weight Gemma 3 (one full-attention layer beside
sliding ones, window 8) and a Mistral (every layer sliding) built with transformers' own classes.

Sessions that overflow a tiny device pool come back to their prefix: with the tier it is loaded from
host memory (each group's blocks in its own pages, the window groups' last window only), without it
recomputed. Greedy tokens must be identical, and the tier must have served hits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinserve.backends.real import LLM, SamplingParams

from .arch_helpers import make_arch_dir

BS = 4
# Token ids, so the lengths are exact: 32-token prompts (8 blocks), three of them over a pool that
# holds barely more than one request's pages in every group.
PROMPTS = [[5 + (7 * i + 13 * k) % 200 for i in range(32)] for k in range(3)]


@pytest.fixture(scope="module", params=["Gemma3ForCausalLM", "MistralForCausalLM"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_arch_dir(tmp_path_factory.mktemp(request.param), request.param)


def _run(folder: Path, tier_gib: float) -> tuple[list[list[int]], list[float], LLM]:
    groups = 4 if "Gemma3" in str(folder) else 1  # the tiny Gemma 3: 1 full + 3 sliding layers, 4 groups
    llm = LLM(str(folder), dtype="float32", max_model_len=64, block_size=BS, num_gpu_blocks_override=12 * groups,
              enable_prefix_caching=True, kv_offloading_size=tier_gib, max_num_seqs=1)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=1)
    out, logprobs = [], []
    # Each prompt, then each again with a follow-up: the second round finds the device pool flushed.
    for turn in range(2):
        for p in PROMPTS:
            prompt = p + [3, 4, 5] * turn
            (res,) = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)
            out.append(list(res.outputs[0].token_ids))
            logprobs += [lp.logprob for lp in res.outputs[0].logprobs]
    return out, logprobs, llm


def test_tier_on_and_off_give_the_same_tokens_and_the_tier_serves_hits(model_dir: Path) -> None:
    with_tier, lp, llm = _run(model_dir, 0.001)
    without, lp0, llm0 = _run(model_dir, 0.0)
    assert llm0.llm_engine.core.core.scheduler.kv.host is None
    assert with_tier == without
    # The tiny random model's argmax is robust to a wrong slot; its logprobs are not.
    torch.testing.assert_close(torch.tensor(lp), torch.tensor(lp0), atol=1e-4, rtol=1e-4)
    core = llm.llm_engine.core.core
    kv = core.scheduler.kv
    groups = 4 if "Gemma3" in str(model_dir) else 1
    assert kv.num_groups == groups
    st = kv.host.stats
    assert st.hits > 0 and st.blocks_loaded > 0 and st.blocks_stored > 0
    # Second-round turns reload their 8-block prefixes from the host: the full group all 8 blocks, a
    # sliding group (window 8) only the 2 its window reads, so fewer than 8 a group per turn.
    full, sliding = (1, 3) if groups == 4 else (0, 1)
    assert st.blocks_loaded <= 3 * (8 * full + 2 * sliding) < 3 * 8 * groups
    runner = llm.llm_engine.worker.runner
    assert runner.host_kv.blocks_loaded == st.blocks_loaded
