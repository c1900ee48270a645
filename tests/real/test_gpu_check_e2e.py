"""experiments/gpu_check.py's end-to-end section and experiments/random_model.py, run on CPU.

On a GPU machine the section compares the engine's greedy tokens with transformers and times
it; here the same code runs on the tiny model (``--cpu-smoke``), so a broken check is found
before it spends device time, and the teacher-forced comparison is shown to catch a wrong token.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def gpu_check(experiment):
    return experiment("gpu_check")


def test_random_model_keeps_architecture_and_tokenizer_but_not_weights(tiny_dir: Path, tmp_path: Path,
                                                                       experiment) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    out = experiment("random_model").make_random_model(tiny_dir, tmp_path / "arch", seed=7, dtype="float32")
    a, b = AutoConfig.from_pretrained(str(tiny_dir)), AutoConfig.from_pretrained(str(out))
    assert (a.num_hidden_layers, a.hidden_size, a.num_key_value_heads, a.vocab_size) == \
        (b.num_hidden_layers, b.hidden_size, b.num_key_value_heads, b.vocab_size)
    text = "the quick brown fox"
    assert AutoTokenizer.from_pretrained(str(out))(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(str(tiny_dir))(text)["input_ids"]
    old, new = load_file(str(tiny_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert old.keys() == new.keys()
    name = "model.layers.0.mlp.down_proj.weight"
    assert old[name].shape == new[name].shape and not torch.equal(old[name].float(), new[name].float())


def test_regret_is_zero_for_greedy_tokens_and_large_for_a_wrong_one(gpu_check, tiny_dir: Path) -> None:
    ref = gpu_check._hf_model(str(tiny_dir), torch.float32, torch.device("cpu"))
    prompt = [5, 9, 17, 33, 2]
    ids = torch.tensor([prompt])
    greedy = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                          pad_token_id=0)[0, len(prompt):].tolist()
    worst, agree, n = gpu_check._regret(ref, [prompt], [greedy])
    assert (worst, agree, n) == (0.0, 1.0, 10)
    wrong = list(greedy)
    wrong[4] = (wrong[4] + 1) % ref.config.vocab_size
    worst, agree, _ = gpu_check._regret(ref, [prompt], [wrong])
    assert worst > 0.25 and agree < 1.0


def test_e2e_section_passes_on_cpu_with_a_model_folder(gpu_check, tiny_dir: Path) -> None:
    from twinserve.kernels.selfcheck import Context

    gpu_check.ROWS.clear()
    args = gpu_check.parse_args(["--cpu-smoke", "--model", str(tiny_dir), "--e2e-tokens", "6"])
    ctx = Context(args=args, deadline=gpu_check.Deadline(600), report=gpu_check.report)
    gpu_check.section_e2e(ctx)
    rows = {case: (status, detail) for _, case, status, detail in gpu_check.ROWS}
    checks = [c for c in rows if "teacher-forced" in c]
    assert len(checks) == 3, rows
    assert all(rows[c][0] == "PASS" for c in checks), rows
    assert "engine batch-1 decode step (whole engine step)" in rows
    offline = [c for c in rows if c.startswith("SmolLM2 bf16")]
    assert offline and "output tok/s" in rows[offline[0]][1]
