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
                            w.max_model_len, capture=False, num_groups=len(r.kv_groups))
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


@pytest.mark.slow
def test_padded_static_decode_path_reads_each_kv_groups_own_tables(make_llm, tmp_path) -> None:
    # A Gemma 3 (5 sliding : 1 full layers, window 11: off the 8-token block edge) has six KV groups;
    # the static path must feed each group's slots and block tables. The tiny model's greedy tokens
    # barely move when a layer reads the wrong KV, so its logprobs are compared too.
    from .arch_helpers import make_arch_dir

    folder = make_arch_dir(tmp_path / "gemma3", "Gemma3ForCausalLM", gemma_layers=6, window=11)
    common = dict(attention_backend="triton", dtype="float32", block_size=8, max_num_seqs=8,
                  max_num_batched_tokens=64, num_gpu_blocks_override=96, max_model_len=128)
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(5, seed=12, lo=14, hi=30)]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)

    def run(llm, batches):
        outs = [o.outputs[0] for b in batches for o in llm.generate(b, sp, use_tqdm=False)]
        return [o.token_ids for o in outs], [[t for lp in o.logprobs for _, t in lp.top] for o in outs]

    want_ids, want_lps = run(make_llm(folder, **common), [prompts])
    llm = make_llm(folder, **common)
    assert len(llm.llm_engine.worker.runner.kv_groups) > 1
    graphs = _with_graphs(llm)
    got_ids, got_lps = run(llm, [prompts[:3], prompts[3:]])
    assert graphs.replays >= 14
    assert got_ids == want_ids
    for got, want in zip(got_lps, want_lps):
        assert got == pytest.approx(want, abs=1e-4)


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
