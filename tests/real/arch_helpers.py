"""Tiny random-weight models of every registered architecture, built with transformers' own classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .conftest import make_tokenizer

WINDOW = 8  # sliding window of the tiny models: prompts of 20-40 tokens run past it


def _shapes(vocab: int, eos: int) -> dict[str, Any]:
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, eos_token_id=eos,
                bos_token_id=None, initializer_range=0.3)


def hf_config(arch: str, vocab: int, eos: int, gemma_layers: int | None = None, window: int = WINDOW) -> Any:
    """transformers' config of a tiny model of `arch` (sliding windows of WINDOW where it has them).

    gemma_layers: a Gemma 3 of that many layers in its real 5 local : 1 global pattern.
    window: the sliding window (WINDOW by default; another size tests windows off the block edges).
    """
    WINDOW = window  # noqa: N806
    import transformers as tf

    kw = _shapes(vocab, eos)
    if arch == "LlamaForCausalLM":
        return tf.LlamaConfig(num_hidden_layers=2, **kw)
    if arch == "MistralForCausalLM":
        return tf.MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **kw)
    if arch == "Qwen2ForCausalLM":
        # Layer 0 full, layers 1-2 sliding (Qwen2's max_window_layers).
        return tf.Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=1, **kw)
    if arch == "Qwen3ForCausalLM":
        return tf.Qwen3Config(num_hidden_layers=2, **kw)
    if arch == "Gemma3ForCausalLM":
        types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        if gemma_layers is not None:
            types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(gemma_layers)]
        return tf.Gemma3TextConfig(
            num_hidden_layers=len(types), sliding_window=WINDOW, query_pre_attn_scalar=16,
            layer_types=types,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
            tie_word_embeddings=True, **kw)
    raise ValueError(arch)


def make_arch_dir(folder: Path, arch: str, seed: int = 0, gemma_layers: int | None = None,
                  window: int = WINDOW) -> Path:
    """Save a tiny random `arch` model (fp32) and the test tokenizer into folder."""
    import transformers as tf

    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder)
    cfg = hf_config(arch, len(tok), tok.eos_token_id, gemma_layers, window)
    torch.manual_seed(seed)
    model = getattr(tf, arch)(cfg).float()
    if arch == "Gemma3ForCausalLM":
        # Gemma's norms start at weight 0 (scale 1); random ones exercise the (1 + w) form.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3)
    model.save_pretrained(str(folder))
    return folder


_hf: dict[Path, Any] = {}
# Reference models kept: a module asks for one or two folders (its own tmp dirs) over and over, and
# no later module asks for them again, so an unbounded cache held every module's models to the end.
HF_KEEP = 4


def remember(cache: dict, key: Any, value: Any, keep: int = HF_KEEP) -> Any:
    """Put value in cache as its newest entry, dropping the oldest past `keep`; return value."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > keep:
        cache.pop(next(iter(cache)))
    return value


def hf_model(folder: Path) -> Any:
    """transformers' model of the folder, fp32, eval, cached (the HF_KEEP latest folders)."""
    from transformers import AutoModelForCausalLM

    model = _hf.get(folder)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, use_kernels=False).eval()
        model.generation_config.eos_token_id = None
    return remember(_hf, folder, model)


def hf_greedy_tokens(folder: Path, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of n tokens (no EOS stop)."""
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = hf_model(folder).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                        do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    """transformers' logits [len(ids), vocab] for one sequence."""
    with torch.no_grad():
        return hf_model(folder)(torch.tensor([ids])).logits[0].float()
