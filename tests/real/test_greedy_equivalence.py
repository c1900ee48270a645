"""Greedy tokens equal transformers' generate on a tiny random Llama, under every scheduling shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.real import SamplingParams

from .conftest import hf_greedy, make_tiny_model_dir, prompts_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _run(llm, prompts: list[list[int]], params: SamplingParams = GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


@pytest.mark.parametrize("tied", [False, True])
def test_matches_transformers(make_llm, tiny_dir: Path, tiny_tied_dir: Path, tied: bool) -> None:
    folder = tiny_tied_dir if tied else tiny_dir
    prompts = prompts_ids(6, seed=1)
    outs = _run(make_llm(folder), prompts)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(folder, p, 24)
        assert o.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("engine_kw", [
    {"enable_prefix_caching": False},
    {"enable_prefix_caching": True},
    {"max_num_batched_tokens": 7},  # chunked prefill with a tiny budget
    {"max_num_batched_tokens": 7, "long_prefill_token_threshold": 3, "max_num_seqs": 3},
    {"num_gpu_blocks_override": 24},  # 96 token slots for 8 requests: forces preemption
], ids=["no-prefix-cache", "prefix-cache", "chunked-7", "chunked-threshold", "preemption"])
def test_same_tokens_under_scheduling_variants(make_llm, tiny_dir: Path, engine_kw: dict) -> None:
    shared = prompts_ids(1, seed=5, lo=13, hi=14)[0]
    # Half the prompts share a 13-token prefix, so prefix caching has something to hit.
    prompts = [shared + p for p in prompts_ids(4, seed=2, lo=2, hi=9)] + prompts_ids(4, seed=3)
    llm = make_llm(**engine_kw)
    outs = _run(llm, prompts[:1])  # warms the prefix cache with the shared prefix
    outs = _run(llm, prompts)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(tiny_dir, p, 24), engine_kw
    if engine_kw.get("num_gpu_blocks_override"):
        assert sum(o.metrics.num_preemptions for o in outs) > 0
    if engine_kw.get("enable_prefix_caching") is True:
        assert sum(o.metrics.num_cached_tokens for o in outs[:4]) >= 4 * 12


def test_batch_equals_alone(make_llm) -> None:
    prompts = prompts_ids(10, seed=4)
    llm = make_llm(max_num_batched_tokens=64)
    together = [o.outputs[0].token_ids for o in _run(llm, prompts)]
    alone = [_run(llm, [p])[0].outputs[0].token_ids for p in prompts]
    assert together == alone


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "factor": 2.0},
], ids=lambda s: s["rope_type"])
def test_rope_scaling_variants_match_transformers(make_llm, tmp_path: Path, scaling: dict) -> None:
    folder = make_tiny_model_dir(tmp_path / "m", rope_scaling=scaling, seed=3)
    prompts = prompts_ids(3, seed=6, lo=30, hi=60)
    outs = _run(make_llm(folder), prompts)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(folder, p, 24)
