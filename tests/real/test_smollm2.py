"""SmolLM2-135M-Instruct in fp32: greedy tokens equal transformers' generate (slow, still default)."""

from __future__ import annotations

import pytest
import torch

from twinserve.backends.real import LLM, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about autumn leaves.",
    "Explain photosynthesis to a child.", "List three prime numbers and explain why they are prime.",
    "Translate 'good morning' into Spanish and German.", "What is 17 times 23? Show your work.",
    "Give me a short story about a robot who learns to paint.", "Why is the sky blue?",
    "Write Python code that reverses a string.", "Summarize the plot of Romeo and Juliet in two sentences.",
]
MAX_NEW = 64
TIE_TOL = 1e-4


@pytest.fixture(scope="module")
def reference():
    """Prompts (chat template) and transformers' greedy continuations, EOS ignored, fp32, batch 1."""
    from transformers import AutoModelForCausalLM

    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.backends.real.tokenizer import apply_chat_template, load_tokenizer

    torch.set_num_threads(1)
    src = resolve_model("smollm2")
    tok = load_tokenizer(src)
    hf = AutoModelForCausalLM.from_pretrained(str(src.path), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    prompts = [apply_chat_template(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            # An explicit mask: otherwise generate masks every prompt token equal to pad (<|im_end|>).
            g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                            pad_token_id=2)
            outs.append(g[0, len(p):].tolist())
    return hf, prompts, outs


def _check(hf, prompt: list[int], ref: list[int], got: list[int], label: str) -> None:
    """Equal, or the first difference sits on a near-tie of the top two logits (else a failure)."""
    assert len(got) == MAX_NEW, label
    k = next((i for i in range(MAX_NEW) if ref[i] != got[i]), None)
    if k is None:
        return
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + ref[:k]])).logits[0, -1]
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE_TOL, f"{label}: diverged at token {k} ({ref[k]} vs {got[k]}) with top-2 gap {gap:.2e}"


@pytest.mark.parametrize("engine_kw", [
    {},
    {"enable_prefix_caching": False, "max_num_batched_tokens": 16},
    {"num_gpu_blocks_override": 24, "max_num_batched_tokens": 64},
    # Speculation under preemption and the system prompt's prefix hits.
    {"num_gpu_blocks_override": 24, "max_num_batched_tokens": 64,
     "speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}},
    # SmolLM2 drafting for itself (the only model with its tokenizer at hand).
    {"num_gpu_blocks_override": 24, "max_num_batched_tokens": 64,
     "speculative_config": {"method": "draft_model", "model": "smollm2", "num_speculative_tokens": 3}},
], ids=["default", "no-prefix-chunked-16", "preempting-pool", "ngram-preempting-pool", "draft-preempting-pool"])
def test_greedy_matches_transformers(reference, engine_kw: dict) -> None:
    hf, prompts, refs = reference
    if engine_kw.get("speculative_config", {}).get("method") == "draft_model":
        # Half the questions: each step runs the model k + 1 times (still enough to preempt).
        prompts, refs = prompts[:5], refs[:5]
    llm = LLM("smollm2", max_model_len=1024, seed=0, **engine_kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True), use_tqdm=False)
    for p, r, o in zip(prompts, refs, outs):
        _check(hf, p, r, o.outputs[0].token_ids, str(engine_kw))
    if "num_gpu_blocks_override" in engine_kw:
        assert sum(o.metrics.num_preemptions for o in outs) > 0
    if not engine_kw or "speculative_config" in engine_kw:
        assert sum(o.metrics.num_cached_tokens for o in outs) > 0  # the shared system prompt hits
    if "speculative_config" in engine_kw:
        assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


def test_chat_answer_and_gguf_weights(reference) -> None:
    hf = reference[0]
    llm = LLM("SmolLM2-135M-Instruct", max_model_len=512)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text and out.outputs[0].finish_reason == "stop"
    from twinserve.backends.real.models.loader import load_gguf
    from twinserve.backends.real.models.registry import smollm2_gguf_path

    direct = load_gguf(smollm2_gguf_path(), 512, torch.float32)
    engine_model = llm.llm_engine.worker.model
    for (name, a), (_, b) in zip(direct.named_parameters(), engine_model.named_parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(direct.embed_tokens.weight, hf.model.embed_tokens.weight)


# bf16 weights, KV and activations (the fast CPU option where AMX/AVX512-BF16 exist): its
# greedy tokens may leave fp32's path, but only where fp32's own top two logits are close.
BF16_GAP = 0.5


def _agree_except_near_ties(hf, prompt: list[int], ref: list[int], got: list[int], label: str) -> int:
    """Tokens equal to fp32's before the first difference; that difference must sit on a near-tie."""
    k = next((i for i in range(MAX_NEW) if ref[i] != got[i]), MAX_NEW)
    if k < MAX_NEW:
        with torch.no_grad():
            top2 = hf(torch.tensor([prompt + ref[:k]])).logits[0, -1].topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap < BF16_GAP, f"{label} left fp32's greedy path at token {k} where fp32's top-2 gap is {gap:.3f}"
    return k


def test_bf16_option_follows_fp32_greedy_except_at_near_ties(reference) -> None:
    hf, prompts, refs = reference
    llm = LLM("smollm2", max_model_len=1024, seed=0, dtype="bfloat16")
    model = llm.llm_engine.worker.model
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    # Where oneDNN runs bf16 here, the products go through prepacked weights (what this test checks).
    from twinserve.backends.real.models.llama import packed_bf16_supported

    assert (getattr(model.layers[0].mlp.down_proj, "weight_packed", None) is not None) == packed_bf16_supported()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True), use_tqdm=False)
    agree = sum(_agree_except_near_ties(hf, p, r, o.outputs[0].token_ids, "bf16")
                for p, r, o in zip(prompts, refs, outs))
    # Most of the run follows fp32 token for token; how much depends on the kernel path, and
    # the near-tie check above is the real test. oneDNN's prepacked bf16 (hosts with
    # AVX512-BF16 or AMX) kept at least 40% of the tokens (Nov 29-30). Aten's generic bf16
    # product (hosts without them: this project's VM on an AMD EPYC since its reboot of Nov 30, 22:41)
    # kept 228 of 640 (36%), every departure at a near-tie.
    floor = 0.4 if packed_bf16_supported() else 0.3
    assert agree >= floor * MAX_NEW * len(prompts), agree


@pytest.mark.parametrize("quant, kernel", [("int8", "_weight_int8pack_mm"), ("int4", "_weight_int4pack_mm_for_cpu")])
def test_quantized_option_follows_fp32_greedy_except_at_near_ties(reference, quant: str, kernel: str) -> None:
    """bf16 with int8 weight copies, or int4 projections (SmolLM2's own Q4_1 grid) and an int8 LM
    head; batch-1 decode reads them. The same near-tie rule as bf16."""
    if not hasattr(torch.ops.aten, kernel):
        pytest.skip(f"this torch has no {kernel} kernel")
    hf, prompts, refs = reference
    llm = LLM("smollm2", max_model_len=1024, seed=0, dtype="bfloat16", quantization=quant)
    model = llm.llm_engine.worker.model
    assert model.layers[0].mlp.down_proj.__dict__.get(f"weight_{quant}") is not None
    assert model.head_int8.dtype == torch.int8
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    agree = 0
    for p, r in zip(prompts[:5], refs[:5]):  # one at a time: decode steps of one row use the copies
        got = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids
        agree += _agree_except_near_ties(hf, p, r, got, quant)
    assert agree >= 0.4 * MAX_NEW * 5, agree
