"""Fixtures: a tiny random-weight Llama saved as an HF folder with a byte-level BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

torch.set_num_threads(1)

CORPUS = [
    "the quick brown fox jumps over the lazy dog", "paged attention stores keys and values in blocks",
    "a scheduler hands out tokens from one budget", "héllo wörld, ça va? naïve café", "日本語のテキスト",
    "emoji 🙂🚀 and more 🎉", "numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000",
] * 4
EOS = "<eos>"


def make_tokenizer(folder: Path) -> Any:
    """Train a small byte-level BPE (multi-byte characters span several tokens) and save it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS, "<user>", "<bot>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                          "{% if add_generation_prompt %}<bot>{% endif %}")
    fast.save_pretrained(str(folder))
    return fast


def make_tiny_model_dir(folder: Path, tie: bool = False, rope_scaling: dict | None = None,
                        seed: int = 0) -> Path:
    """Random-weight HF Llama (2 layers, GQA 2) plus tokenizer, saved as safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder)
    kw: dict[str, Any] = {}
    if rope_scaling is not None:
        kw["rope_parameters"] = {"rope_theta": 10000.0, **rope_scaling}
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      initializer_range=0.3, **kw)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float64)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untied tiny model folder."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tied-embedding tiny model folder."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_tied"), tie=True, seed=1)


@pytest.fixture
def make_llm(tiny_dir: Path) -> Callable[..., Any]:
    """Factory: LLM over the tiny model in float64 with small defaults, overridable."""
    from twinserve.backends.real import LLM

    def build(model: Path | None = None, **kw: Any) -> Any:
        args = dict(dtype="float64", max_model_len=256, num_gpu_blocks_override=256, block_size=4,
                    max_num_batched_tokens=256)
        args.update(kw)
        return LLM(str(model or tiny_dir), **args)

    return build


def hf_greedy(folder: Path, prompt_ids: list[int], max_new_tokens: int, dtype: torch.dtype = torch.float64
              ) -> list[int]:
    """transformers' greedy generate, never stopping at EOS (the reference)."""
    from transformers import LlamaForCausalLM

    from .arch_helpers import remember

    model = _hf_cache.get((folder, dtype))
    if model is None:
        model = LlamaForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
        # Like ignore_eos: no EOS stop and no EOS suppression (min_new_tokens would mask it).
        model.generation_config.eos_token_id = None
    remember(_hf_cache, (folder, dtype), model)  # bounded: older modules' folders are never asked again
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


_hf_cache: dict[tuple[Path, torch.dtype], Any] = {}


def prompts_ids(n: int, seed: int = 0, lo: int = 3, hi: int = 40, vocab: int = 290) -> list[list[int]]:
    """Random prompts of random lengths (seeded)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(torch.randint(3, vocab, (length,), generator=g).tolist())
    return out


def add_with_bad_stop_id(engine: Any, request_id: str, prompt: list[int], params: Any, **kw: Any) -> None:
    """Add a request whose params are corrupted past validation, at the seam to the engine core:
    a stop id outside the vocabulary, whose mask (min_tokens not reached yet) makes sampling raise."""
    add = engine.core.add_request

    def corrupt(req: Any) -> None:
        if req.request_id == request_id:
            req.sampling_params.stop_token_ids = [10 ** 6]
        add(req)

    engine.core.add_request = corrupt
    try:
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params, **kw)
    finally:
        engine.core.add_request = add


def read_json(path: Path) -> Any:
    """Parse a JSON file."""
    return json.loads(path.read_text())
