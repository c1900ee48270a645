"""Special tokens as vLLM adds them: a completion prompt gets the tokenizer's BOS, a chat prompt does
not (its template writes its own): docs/test-audit.md, round 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx

from .conftest import start_server


def _with_bos(src: Path, dst: Path) -> str:
    """A copy of the tiny model whose tokenizer prepends a BOS ('<user>' here) when asked for special tokens."""
    from tokenizers import Tokenizer, processors

    shutil.copytree(src, dst)
    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    bos = "<user>"
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(dst / "tokenizer.json"))
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["bos_token"] = bos
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return bos


def test_chat_prompts_get_no_second_bos_and_completion_prompts_get_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "bos"
    bos = _with_bos(tiny_model_dir, model)
    s = start_server(model, engine_core_mode="inproc")
    tok = s.engine.tokenizer
    try:
        plain = tok("hello there", add_special_tokens=False)["input_ids"]
        assert tok("hello there")["input_ids"] == [tok.convert_tokens_to_ids(bos)] + plain  # the copy adds one

        def usage(path: str, body: dict) -> int:
            r = httpx.post(s.url + path, json={"model": "tiny", "max_tokens": 1, **body}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        assert usage("/v1/completions", {"prompt": "hello there"}) == len(plain) + 1
        msgs = [{"role": "user", "content": "hello there"}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        assert usage("/v1/chat/completions", {"messages": msgs}) == \
            len(tok(text, add_special_tokens=False)["input_ids"])
        # Asked for, a chat prompt gets it too.
        assert usage("/v1/chat/completions", {"messages": msgs, "add_special_tokens": True}) == \
            len(tok(text, add_special_tokens=False)["input_ids"]) + 1
    finally:
        s.stop()
