"""vLLM request fields this server cannot honour: each a 400 naming it unless it holds a value that changes nothing.

The fields themselves are declared on the request models (protocol.py), so none is dropped silently;
tests/serving/test_vllm_field_coverage.py walks vLLM's field lists against ours.
"""

from __future__ import annotations

from typing import Any

from twinserve.backends.real.serving.errors import bad_request

# name -> (values that change nothing, what to do instead)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((None, False), "beam search is not implemented; sample with n instead"),
    "length_penalty": ((None, 1.0), "length_penalty only applies to beam search, which is not implemented"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always decoded with the tokenizer's "
                                      "own spacing"),
    "guided_whitespace_pattern": ((None,), "the grammar backend (xgrammar) keeps JSON whitespace its own way"),
    "structural_tag": ((None,), "structural tags are not supported; use guided_json or tools"),
    "logits_processors": ((None,), "custom logits processors are not loaded by this server"),
    "mm_processor_kwargs": ((None,), "this server serves text-only models"),
    "prompt_embeds": ((None,), "send the prompt as text or token ids"),
    "kv_transfer_params": ((None,), "disaggregated serving (KV transfer) is not supported"),
    "vllm_xargs": ((None,), "custom extensions are not loaded by this server"),
    "request_id": ((None,), "send it as the X-Request-Id header, which the access log records"),
    "reasoning_effort": ((None,), "reasoning effort is not passed to models here; use chat_template_kwargs"),
    "include_reasoning": ((None, True), "reasoning is not parsed out of the output, so it cannot be left out"),
}

# guided_decoding_backend: the one backend this server has, under the names vLLM gives it.
GUIDED_BACKENDS = (None, "xgrammar", "auto")


def check_refused(req: Any) -> None:
    """400 naming the first field set to a value this server cannot honour."""
    for name, (neutral, hint) in REFUSED.items():
        value = getattr(req, name, None)
        if value not in neutral:
            raise bad_request(f"{name} is not supported by this server: {hint}", name, "unsupported")
    backend = getattr(req, "guided_decoding_backend", None)
    if backend not in GUIDED_BACKENDS:
        raise bad_request(f"guided_decoding_backend={backend!r}: this server's only backend is xgrammar "
                          "(give 'xgrammar', 'auto' or leave it out)", "guided_decoding_backend", "unsupported")
