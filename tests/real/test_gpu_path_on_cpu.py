"""The GPU path's host-side logic, run on CPU: graph buckets and padding, the memory profile run."""

from __future__ import annotations

import pytest
import torch

from twinserve.backends.real.cuda_graphs import DecodeGraphs, graph_buckets
from twinserve.backends.real.worker import kv_blocks_in_budget, profile_step_memory
from twinserve.core import SamplingParams
from twinserve.core.errors import InvalidConfigError

from .conftest import prompts_ids


def test_graph_buckets_cover_every_batch_size_up_to_the_engine_limit() -> None:
    assert graph_buckets(1) == [1]
    assert graph_buckets(3) == [1, 2, 3]
    b = graph_buckets(256)
    assert b[:5] == [1, 2, 4, 8, 16] and b[-1] == 256 and all(y - x <= 16 for x, y in zip(b, b[1:]))
    assert graph_buckets(10_000)[-1] == 512


def _with_graphs(llm) -> DecodeGraphs:
    w = llm.llm_engine.worker
    r = w.runner
    r.graphs = DecodeGraphs(r.model, r.backend, r.kv_caches, r.device, r.max_num_seqs, r.max_blocks_per_req,
                            w.max_model_len, capture=False)
    return r.graphs


@pytest.mark.slow
def test_padded_static_decode_path_gives_the_eager_tokens(make_llm) -> None:
    # The Triton backend (interpreted) is the one graphs capture; 3 and 5 live requests pad
    # to buckets 4 and 8, and pad rows must neither write KV (slot -1) nor leak into outputs.
    common = dict(attention_backend="triton", dtype="float32", block_size=16, max_num_seqs=8,
                  max_num_batched_tokens=64, num_gpu_blocks_override=64)
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(5, seed=11, lo=4, hi=12)]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in make_llm(**common).generate(prompts, sp, use_tqdm=False)]
    llm = make_llm(**common)
    graphs = _with_graphs(llm)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts[:3], sp, use_tqdm=False)]
    got += [o.outputs[0].token_ids for o in llm.generate(prompts[3:], sp, use_tqdm=False)]
    assert graphs.replays >= 6
    assert got == want


def test_memory_profile_run_covers_prefill_decode_and_sampler_without_touching_the_cache(make_llm) -> None:
    llm = make_llm(max_num_seqs=4, max_num_batched_tokens=48)
    w = llm.llm_engine.worker
    before = [k.clone() for k, _ in w.runner.kv_caches]
    calls = []
    sampler = w.runner.sampler
    w.runner.sampler = lambda logits, rows: calls.append(logits.shape) or sampler(logits, rows)
    cache_bytes = profile_step_memory(w.runner, w.args, w.max_model_len)
    cfg = w.model.config
    assert cache_bytes == 2 * cfg.num_hidden_layers * 48 * cfg.num_key_value_heads * cfg.head_dim * 8
    assert calls == [(4, cfg.vocab_size)]  # the sampler ran on the decode batch's logits
    assert all(torch.equal(a, k) for a, (k, _) in zip(before, w.runner.kv_caches))


@pytest.mark.parametrize("budget", [-3.0e9, 0.0, 8191.0])
def test_a_gpu_budget_under_one_block_is_a_start_up_error_naming_the_share(budget: float) -> None:
    # With 0 blocks the engine went on and captured its graphs over an empty pool: an illegal
    # memory access on an H200 (a second engine in the same process had taken the memory).
    with pytest.raises(InvalidConfigError, match=r"gpu_memory_utilization=0\.3 .*under one block \(8192 bytes\)"):
        kv_blocks_in_budget(budget, 8192, 0.3, 144 << 30)


def test_a_gpu_budget_gives_whole_blocks() -> None:
    assert kv_blocks_in_budget(8192 * 5 + 100, 8192, 0.9, 144 << 30) == 5
