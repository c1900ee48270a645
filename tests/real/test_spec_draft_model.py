"""The draft_model proposer through the engine: greedy identity, acceptance, the draft's own KV, bad drafts.

Drafts come from tiny random-weight Llamas that share the target's tokenizer: a smaller one
(1 layer, hidden 32: it rarely agrees, so nearly every step rolls back), the target with small
noise on its weights (about half its drafts are accepted: runs and rejections both happen),
and the target itself (every draft must be accepted).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.core.errors import InvalidConfigError, UnsupportedModelError

from .conftest import hf_greedy, make_tokenizer, prompts_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _llama_dir(folder: Path, seed: int, **shape: Any) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder)
    kw = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
              eos_token_id=tok.eos_token_id, bos_token_id=None, initializer_range=0.3)
    kw.update(shape)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**kw)).to(torch.float64).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def small_draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft smaller than the tiny target (1 layer, hidden 32), same tokenizer."""
    return _llama_dir(tmp_path_factory.mktemp("draft_small"), seed=7)


@pytest.fixture(scope="session")
def near_draft_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with N(0, 0.005) added to every weight: it agrees about half the time."""
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("draft_near")
    model = LlamaForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.005)
    model.save_pretrained(str(folder))
    for f in tiny_dir.iterdir():
        if "token" in f.name:
            shutil.copy(f, folder / f.name)
    return folder


def _gen(llm, prompts, params=GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _prompts() -> list[list[int]]:
    shared = prompts_ids(1, seed=5, lo=13, hi=14)[0]
    return [shared + p for p in prompts_ids(3, seed=2, lo=2, hi=9)] + prompts_ids(3, seed=3)


def _spec(draft: Path, k: int = 4) -> dict:
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}


@pytest.mark.parametrize("engine_kw", [
    {"enable_prefix_caching": True},
    {"max_num_batched_tokens": 7, "long_prefill_token_threshold": 3, "max_num_seqs": 3},
    {"num_gpu_blocks_override": 24},  # forces preemption
], ids=["prefix-cache", "chunked", "preemption"])
@pytest.mark.parametrize("draft", ["small", "near"])
def test_greedy_with_a_draft_model_is_token_identical_to_plain(make_llm, request, draft: str,
                                                               engine_kw: dict) -> None:
    draft_dir = request.getfixturevalue(f"{draft}_draft_dir")
    prompts = _prompts()
    plain = [o.outputs[0].token_ids for o in _gen(make_llm(**engine_kw), prompts)]
    llm = make_llm(speculative_config=_spec(draft_dir, 5), **engine_kw)
    _gen(llm, prompts[:1])  # warms the prefix cache with the shared prefix
    outs = _gen(llm, prompts)
    assert [o.outputs[0].token_ids for o in outs] == plain
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert drafted > sum(len(p) for p in plain)  # drafts of several tokens in most steps
    if draft == "near":
        assert 0.2 * drafted < accepted < drafted  # runs accepted and rejections rolled back
    if engine_kw.get("num_gpu_blocks_override"):
        assert sum(o.metrics.num_preemptions for o in outs) > 0
    if engine_kw.get("enable_prefix_caching"):
        assert sum(o.metrics.num_cached_tokens for o in outs[:3]) >= 3 * 12


SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=1, ignore_eos=True,
                         repetition_penalty=1.2)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, [GREEDY, SAMPLED] * 3],
                         ids=["greedy", "sampled", "mixed"])
def test_the_target_as_its_own_draft_accepts_every_draft(make_llm, tiny_dir: Path, params) -> None:
    llm = make_llm(speculative_config=_spec(tiny_dir, 4), num_gpu_blocks_override=40)
    outs = _gen(llm, _prompts(), params)
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    assert drafted > 0
    assert sum(o.metrics.num_accepted_tokens for o in outs) == drafted
    if params is GREEDY:
        plain = [o.outputs[0].token_ids for o in _gen(make_llm(num_gpu_blocks_override=40), _prompts())]
        assert [o.outputs[0].token_ids for o in outs] == plain


def test_logprobs_and_a_grammar_with_a_draft_model_equal_plain_decoding(make_llm, near_draft_dir: Path) -> None:
    import json

    from twinserve.core.structured_output import StructuredOutputSpec

    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["a"], "additionalProperties": False}
    prompts = _prompts()[:3]
    for params in (SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2),
                   SamplingParams(temperature=0.0, max_tokens=40,
                                  structured_output=StructuredOutputSpec("json", json.dumps(schema), "guided"))):
        plain = [o.outputs[0] for o in _gen(make_llm(), prompts, params)]
        outs = _gen(make_llm(speculative_config=_spec(near_draft_dir, 4)), prompts, params)
        assert sum(o.metrics.num_draft_tokens for o in outs) > 0
        for o, ref in zip(outs, plain):
            c = o.outputs[0]
            assert c.token_ids == ref.token_ids
            if params.logprobs:
                assert [(g.token_id, g.rank) for g in c.logprobs] == [(w.token_id, w.rank) for w in ref.logprobs]
            else:
                assert set(json.loads(c.text)) == {"a"}


def _record_proposals(llm) -> list[tuple[list[int], list[int]]]:
    """(context, drafts) of every proposal the engine's draft model makes."""
    runner = llm.llm_engine.worker.runner
    seen: list[tuple[list[int], list[int]]] = []
    propose = runner.drafter.propose

    def spy(batch, states, *rest):
        out = propose(batch, states, *rest)
        for rid, d in out.items():
            seen.append((list(batch.requests[rid].token_ids), list(d)))
        return out

    runner.drafter.propose = spy
    return seen


def _stale_catch_up(monkeypatch) -> None:
    """A planted bug: the draft trusts every position it fed, its rejected drafts included."""
    from twinserve.backends.real.spec.draft_model import DraftModelProposer

    run = DraftModelProposer.run
    fed: dict[str, int] = {}

    def stale(self, batch, work):
        for w in work:
            if w.k:
                w.start = max(w.start, min(fed.get(w.st.req_id, 0), w.end - 1))
        out = run(self, batch, work)
        for w in work:
            if w.k:
                fed[w.st.req_id] = w.end + len(out[0].get(w.st.req_id, ())) - 1
        return out

    monkeypatch.setattr(DraftModelProposer, "run", stale)


@pytest.mark.parametrize("planted", [False, True], ids=["engine", "planted-stale-kv"])
def test_after_a_rejection_the_draft_proposes_what_a_fresh_draft_model_would(
        make_llm, near_draft_dir: Path, monkeypatch, planted: bool) -> None:
    if planted:
        _stale_catch_up(monkeypatch)
    llm = make_llm(speculative_config=_spec(near_draft_dir, 4))
    seen = _record_proposals(llm)
    outs = _gen(llm, _prompts()[2:5])
    assert len(seen) > 20
    if not planted:
        assert 0 < sum(o.metrics.num_accepted_tokens for o in outs) < sum(o.metrics.num_draft_tokens for o in outs)
    # transformers' greedy generate over the draft's weights, from the accepted context alone.
    fresh = [hf_greedy(near_draft_dir, ctx, len(d)) == d for ctx, d in seen]
    if planted:
        assert not all(fresh)
    else:
        assert all(fresh)


def test_while_drafts_are_switched_off_by_batch_size_the_draft_keeps_up(make_llm, near_draft_dir: Path) -> None:
    # Three requests: no drafts (disable_by_batch_size = 3) until the short one ends; then the
    # other two draft, and each proposal must come from KV the draft kept up meanwhile.
    llm = make_llm(speculative_config={**_spec(near_draft_dir, 4), "disable_by_batch_size": 3})
    seen = _record_proposals(llm)
    prompts = _prompts()[2:5]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 30, 30)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    plain = make_llm().generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    late = [(ctx, d) for ctx, d in seen if len(ctx) > len(prompts[1]) + 8]
    assert late and sum(o.metrics.num_draft_tokens for o in outs) > 0
    assert all(hf_greedy(near_draft_dir, ctx, len(d)) == d for ctx, d in seen)


def test_the_draft_models_kv_is_counted_in_the_cache_size(make_llm, small_draft_dir: Path) -> None:
    from twinserve.backends.real.worker import kv_bytes_per_token

    plain = make_llm(num_gpu_blocks_override=None, kv_cache_memory_gb=0.001)
    spec = make_llm(speculative_config=_spec(small_draft_dir), num_gpu_blocks_override=None,
                    kv_cache_memory_gb=0.001)
    worker = spec.llm_engine.worker
    draft_bytes = kv_bytes_per_token(worker.draft_model.config, torch.float64)
    assert worker.kv_bytes_per_token == plain.llm_engine.worker.kv_bytes_per_token + draft_bytes
    assert spec.llm_engine.core.num_blocks < plain.llm_engine.core.num_blocks
    caches = worker.runner.drafter.kv_caches
    assert len(caches) == 1 and caches[0][0].shape[0] == spec.llm_engine.core.num_blocks


def test_the_scheduler_reserves_lookahead_slots_for_the_drafts_positions(make_llm, small_draft_dir: Path) -> None:
    llm = make_llm(speculative_config=_spec(small_draft_dir, 4))
    runner = llm.llm_engine.worker.runner
    seen: list[tuple[int, int, int]] = []
    propose = runner.drafter.propose

    def spy(batch, states, starts, sampled, *rest):
        out = propose(batch, states, starts, sampled, *rest)
        for st in states:
            if st.req_id in sampled:
                seen.append((st.num_blocks * runner.block_size, st.num_computed_tokens, len(out.get(st.req_id, ()))))
        return out

    runner.drafter.propose = spy
    _gen(llm, _prompts()[:3])
    assert seen
    for capacity, computed, k in seen:
        assert k == 4 and computed + 4 <= capacity  # every step drafts all k, in slots it holds


def _bad_dir(tmp_path: Path, **shape: Any) -> Path:
    return _llama_dir(tmp_path / "bad", seed=1, **shape)


@pytest.mark.parametrize("shape, match", [
    ({"vocab_size": 400}, "vocabulary"),
    ({"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
      "num_key_value_heads": 2}, "no larger than the target"),
    ({"max_position_embeddings": 64}, "context covers max_model_len"),
], ids=["vocab", "larger", "short-context"])
def test_a_draft_that_cannot_serve_the_target_is_refused_before_any_worker_starts(
        tiny_dir: Path, tmp_path: Path, monkeypatch, shape: dict, match: str) -> None:
    from twinserve.backends.real import LLM
    from twinserve.backends.real import worker

    bad = _bad_dir(tmp_path, **shape)

    def no_worker(*a, **kw):
        raise AssertionError("a worker was started for a bad draft model")

    monkeypatch.setattr(worker.Worker, "__init__", no_worker)
    with pytest.raises(InvalidConfigError, match=match):
        LLM(str(tiny_dir), dtype="float64", max_model_len=256, speculative_config=_spec(bad))


def test_an_unknown_draft_or_a_sharded_target_is_a_typed_error(tiny_dir: Path, tmp_path: Path) -> None:
    from twinserve.backends.real import LLM

    with pytest.raises(UnsupportedModelError, match="unknown model"):
        LLM(str(tiny_dir), speculative_config={"model": "no-such-draft"})
    with pytest.raises(InvalidConfigError, match="tensor_parallel_size"):
        LLM(str(tiny_dir), tensor_parallel_size=2, speculative_config=_spec(tiny_dir))


def test_a_gemma3_target_with_kv_groups_drafts_for_itself_through_group_0s_table(tmp_path: Path) -> None:
    """The draft's own KV follows the full group's table (48 pages: freed sliding pages get reused)."""
    from twinserve.backends.real import LLM

    from .arch_helpers import hf_greedy_tokens, make_arch_dir

    folder = make_arch_dir(tmp_path / "gemma3", "Gemma3ForCausalLM")  # 4 KV groups of one layer
    prompts = [[(7 * i) % 250 + 3 for i in range(40)], [(5 * i) % 20 + 1 for i in range(27)]]
    llm = LLM(str(folder), dtype="float32", max_model_len=256, block_size=4, num_gpu_blocks_override=48,
              max_num_batched_tokens=16, speculative_config=_spec(folder, 3))
    assert len(llm.llm_engine.worker.runner.kv_groups) == 4
    outs = _gen(llm, prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    assert drafted > 0 and sum(o.metrics.num_accepted_tokens for o in outs) == drafted
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy_tokens(folder, p, 20)
