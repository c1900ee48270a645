"""ignore_eos with a model that has several end-of-text ids (Llama 3 Instruct has three): none ends the text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.backends.real import LLM, SamplingParams

from .conftest import make_tiny_model_dir

SECOND_EOS = 7


@pytest.fixture(scope="module")
def two_eos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("two_eos"))
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token_id"] = [cfg["eos_token_id"], SECOND_EOS]
    cfg_path.write_text(json.dumps(cfg))
    return folder


def test_ignore_eos_ignores_every_eos_id_and_without_it_each_one_stops(two_eos_dir: Path) -> None:
    llm = LLM(str(two_eos_dir), dtype="float64", max_model_len=64, num_gpu_blocks_override=64, block_size=4)
    # The bias makes the second EOS id the only likely token.
    forced = SamplingParams(temperature=0, max_tokens=5, logit_bias={SECOND_EOS: 100.0})
    prompt = [{"prompt_token_ids": [5, 6, 9]}]
    stopped = llm.generate(prompt, forced, use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == [SECOND_EOS] and stopped.finish_reason == "stop"
    ignored = llm.generate(prompt, forced.clone(ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids == [SECOND_EOS] * 5 and ignored.finish_reason == "length"


def test_with_ignore_eos_min_tokens_does_not_mask_eos(make_llm) -> None:
    # ignore_eos makes EOS an ordinary token (vLLM leaves it out of the stop ids min_tokens masks): a request
    # that strongly prefers it gets it from the first token on.
    llm = make_llm()
    eos = llm.get_tokenizer().eos_token_id
    sp = SamplingParams(temperature=0, max_tokens=5, min_tokens=3, ignore_eos=True, logit_bias={eos: 100.0})
    out = llm.generate([{"prompt_token_ids": [5, 6, 9]}], sp, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] * 5 and out.finish_reason == "length"


def test_skip_special_tokens_false_keeps_their_text(make_llm) -> None:
    llm = make_llm()
    eos = llm.get_tokenizer().eos_token_id
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={eos: 100.0})
    prompt = [{"prompt_token_ids": [5, 6, 9]}]
    kept = llm.generate(prompt, sp.clone(skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    assert kept.token_ids == [eos] * 3 and kept.text == "<eos>" * 3
    skipped = llm.generate(prompt, sp, use_tqdm=False)[0].outputs[0]
    assert skipped.text == ""
