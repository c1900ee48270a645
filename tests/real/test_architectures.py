"""Every registered architecture against transformers: tiny random models, fp32, prompts past the window.

Logits within 1e-4 over chunked prefills that cross the sliding window's edge, and greedy tokens
equal to transformers' generate under chunking, preemption and prefix-cache hits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.attention import AttentionMetadata, get_attention_backend
from twinserve.backends.real.models.architectures import ARCHITECTURES
from twinserve.backends.real.models.loader import load_hf_folder, read_hf_config
from twinserve.core.kv.groups import kv_cache_groups

from .arch_helpers import WINDOW, hf_greedy_tokens, hf_logits, make_arch_dir
from .conftest import prompts_ids

ARCHS = sorted(ARCHITECTURES)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny saved model per architecture."""
    return make_arch_dir(tmp_path_factory.mktemp(request.param), request.param)


def chunked_logits(folder: Path, ids: list[int], chunks: list[int], block_size: int = 4,
                   backend: str = "torch") -> torch.Tensor:
    """twinserve's logits for one sequence fed as successive prefill chunks over a paged cache."""
    model = load_hf_folder(folder, 256, torch.float32)
    cfg = model.config
    nblk = -(-len(ids) // block_size)
    shape = (nblk + 2, block_size, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]
    table = torch.randperm(nblk + 2, generator=torch.Generator().manual_seed(0))[:nblk].to(torch.int32)
    attn = get_attention_backend(backend, torch.device("cpu"))
    out, done = [], 0
    with torch.inference_mode():
        for q in chunks:
            pos = torch.arange(done, done + q)
            slots = table[pos // block_size].long() * block_size + pos % block_size
            meta = AttentionMetadata(q, 1 if q == 1 else 0, torch.tensor([0, q], dtype=torch.int32),
                                     torch.tensor([done + q], dtype=torch.int32), table.unsqueeze(0), slots,
                                     q, done + q, [q], [done + q])
            attn.plan(meta, block_size, cfg.num_key_value_heads)
            hidden = model(torch.tensor(ids[done:done + q]), pos, caches, meta, attn)
            out.append(model.compute_logits(hidden))
            done += q
    return torch.cat(out)


def test_registry_reads_each_architecture(arch_dir: Path) -> None:
    from twinserve.backends.real.models.loader import read_hf_config

    arch = json.loads((arch_dir / "config.json").read_text())["architectures"][0]
    cfg = read_hf_config(arch_dir)
    assert cfg.architecture == arch
    windows = {"MistralForCausalLM": [WINDOW] * 2, "Qwen2ForCausalLM": [None, WINDOW, WINDOW],
               "Gemma3ForCausalLM": [WINDOW, WINDOW, None, WINDOW]}
    assert cfg.layer_windows == windows.get(arch, [None] * cfg.num_hidden_layers)


@pytest.mark.parametrize("chunks", [[29], [5, 6, 7, 11], [7, 2, 1, 1, 1, 17]],
                         ids=["one-shot", "chunks-across-window", "decodes-in-between"])
def test_logits_match_transformers(arch_dir: Path, chunks: list[int]) -> None:
    ids = prompts_ids(1, seed=11, lo=29, hi=30)[0]
    expected = hf_logits(arch_dir, ids)
    got = chunked_logits(arch_dir, ids, chunks)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_logits_match_transformers_triton_interpreter(arch_dir: Path) -> None:
    from twinserve.kernels.ops import triton_available

    if not triton_available("cpu"):
        pytest.skip("TRITON_INTERPRET=1 is not set in this process")
    ids = prompts_ids(1, seed=12, lo=14, hi=15)[0]
    got = chunked_logits(arch_dir, ids, [5, 6, 1, 1, 1], block_size=16, backend="triton")
    torch.testing.assert_close(got, hf_logits(arch_dir, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine_kw", [
    {},
    {"max_num_batched_tokens": 5},  # chunked prefill: chunk edges fall on both sides of the window
    # 48 slots for 6 requests of up to 44 tokens, 8-token chunks: preemption, with a window too
    {"num_gpu_blocks_override": 12, "max_num_seqs": 4, "max_num_batched_tokens": 8},
    {"enable_prefix_caching": True},
], ids=["plain", "chunked-5", "preemption", "prefix-cache"])
def test_greedy_matches_transformers(arch_dir: Path, engine_kw: dict) -> None:
    from twinserve.backends.real import LLM

    shared = prompts_ids(1, seed=5, lo=17, hi=18)[0]
    prompts = [shared + p for p in prompts_ids(3, seed=2, lo=3, hi=12)] + prompts_ids(3, seed=3, lo=20, hi=33)
    kw = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=256, block_size=4,
              max_num_batched_tokens=256)
    kw.update(engine_kw)
    if "num_gpu_blocks_override" in engine_kw:
        # A page holds one KV group's layers: the same memory is that many pages per group.
        kw["num_gpu_blocks_override"] *= len(kv_cache_groups(read_hf_config(arch_dir).layer_windows))
    llm = LLM(str(arch_dir), **kw)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], GREEDY, use_tqdm=False)
    outs = first + llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], GREEDY, use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy_tokens(arch_dir, p, 12), engine_kw
    if "max_num_seqs" in engine_kw:
        assert sum(o.metrics.num_preemptions for o in outs) > 0
    if engine_kw.get("enable_prefix_caching"):
        assert sum(o.metrics.num_cached_tokens for o in outs[1:3]) >= 2 * 16


@pytest.mark.slow
def test_tensor_parallel_in_worker_processes_gives_the_tokens_of_tp1(arch_dir: Path) -> None:
    """TP 2 over worker processes, the engine core in its own process: tokens equal TP 1's (fp32)."""
    from twinserve.backends.real import LLM

    prompts = [{"prompt_token_ids": p} for p in prompts_ids(3, seed=8, lo=12, hi=30)]
    kw = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=64, block_size=4,
              max_num_batched_tokens=8)
    ref = LLM(str(arch_dir), **kw).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(str(arch_dir), tensor_parallel_size=2, engine_core_mode="process", **kw)
    try:
        got = llm.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
