"""A sliding window that is not a multiple of the block size (13 tokens, blocks of 16): tokens and
logits against transformers, so an off-by-one at a block edge cannot hide behind aligned windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.models.loader import read_hf_config
from twinserve.core.kv.groups import kv_cache_groups

from .arch_helpers import hf_greedy_tokens, hf_logits, make_arch_dir
from .conftest import prompts_ids
from .test_architectures import chunked_logits

WINDOW, BLOCK = 13, 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=["MistralForCausalLM", "Gemma3ForCausalLM"])
def window_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sliding group (Mistral) and a full group beside sliding ones (Gemma 3), window 13."""
    return make_arch_dir(tmp_path_factory.mktemp(request.param), request.param, window=WINDOW)


def test_the_window_is_read_as_written(window_dir: Path) -> None:
    assert WINDOW in read_hf_config(window_dir).layer_windows


@pytest.mark.parametrize("chunks", [[40], [12, 1, 3, 16, 8], [15, 1, 1, 1, 14, 8]])
def test_logits_match_transformers_across_block_and_window_edges(window_dir: Path, chunks: list[int]) -> None:
    ids = prompts_ids(1, seed=21, lo=40, hi=41)[0]
    torch.testing.assert_close(chunked_logits(window_dir, ids, chunks, block_size=BLOCK), hf_logits(window_dir, ids),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine_kw", [
    {},
    {"max_num_batched_tokens": 5},
    {"num_gpu_blocks_override": 6, "max_num_seqs": 3, "max_num_batched_tokens": 8},
    # A pool of 4 blocks a group: requests take turns and reuse the blocks the window left.
    {"num_gpu_blocks_override": 4, "max_num_seqs": 4, "max_num_batched_tokens": 3},
    {"enable_prefix_caching": True},
], ids=["plain", "chunked-5", "preemption", "tight-pool", "prefix-cache"])
def test_greedy_matches_transformers(window_dir: Path, engine_kw: dict) -> None:
    from twinserve.backends.real import LLM

    shared = prompts_ids(1, seed=5, lo=33, hi=34)[0]  # past two block edges and the window
    prompts = [shared + p for p in prompts_ids(2, seed=2, lo=3, hi=12)] + prompts_ids(3, seed=3, lo=14, hi=45)
    kw = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=64, block_size=BLOCK,
              max_num_batched_tokens=256)
    kw.update(engine_kw)
    if "num_gpu_blocks_override" in engine_kw:
        kw["num_gpu_blocks_override"] *= len(kv_cache_groups(read_hf_config(window_dir).layer_windows))
    llm = LLM(str(window_dir), **kw)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], GREEDY, use_tqdm=False)
    outs = first + llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], GREEDY, use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy_tokens(window_dir, p, 12), engine_kw
    if engine_kw.get("enable_prefix_caching"):
        assert sum(o.metrics.num_cached_tokens for o in outs[1:2]) >= 2 * BLOCK
