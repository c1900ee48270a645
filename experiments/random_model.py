#!/usr/bin/env python
"""An HF model folder with a real model's architecture and tokenizer but random weights.

For machines the model's weights cannot reach (the GPU machine takes at most 64 MiB per
call; SmolLM2's GGUF is 98 MB): step times, graph replays, throughput and the engine's
agreement with transformers on the same weights do not depend on what the weights are.
The folder loads like any HF folder (`--model DIR` everywhere), and a profile calibrated on
it names the architecture's catalog model.

    python experiments/random_model.py --like ~/.cache/twinserve/models/SmolLM2-135M-Instruct --out smollm2-arch
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

# What a folder needs besides the weights: the config and the tokenizer with its chat template.
_KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "chat_template.jinja")


def make_random_model(like: Path, out: Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write out/ with like/'s config and tokenizer files and weights drawn with transformers' init."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (like / "config.json").exists():
        raise SystemExit(f"{like} has no config.json: give an HF folder (the converted SmolLM2 is one)")
    config = AutoConfig.from_pretrained(str(like))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for name in _KEEP:
        if (like / name).exists() and name != "config.json":
            shutil.copy(like / name, out / name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--like", required=True, type=Path, help="HF folder whose config and tokenizer are kept")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = p.parse_args()
    out = make_random_model(a.like, a.out, a.seed, a.dtype)
    n = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out}: {n / 1e6:.0f} MB, architecture of {a.like.name}, seed {a.seed}, {a.dtype}")


if __name__ == "__main__":
    main()
