"""One end-to-end check on the real model: SmolLM2 answers through the chat endpoint, streamed."""

from __future__ import annotations

import time

import pytest

from twinserve.core.errors import UnsupportedModelError

from .conftest import start_server


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france_over_http() -> None:
    from twinserve.backends.real.models.registry import resolve_model

    try:
        source = resolve_model("smollm2")
    except UnsupportedModelError as e:  # the package is part of `make install-all`; say what is missing
        pytest.fail(f"SmolLM2 is not installed: {e}")
    t0 = time.monotonic()
    server = start_server(source.path, dtype="float32", max_model_len=512, num_gpu_blocks_override=64,
                          block_size=16, max_num_batched_tokens=512)
    try:
        c = server.client()
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == "The capital of France is Paris."
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finish == ["stop"]  # <|im_end|> ends it before max_tokens
        assert 0 < chunks[-1].usage.completion_tokens < 12
    finally:
        server.stop()
    print(f"SmolLM2 over HTTP: {time.monotonic() - t0:.1f} s including load, torch threads 1")
