"""A choice constraint is a list of literal strings, never regexes (docs/test-audit.md, round 2)."""

from __future__ import annotations

from twinserve.core.sampling_params import SamplingParams
from twinserve.core.structured_output import StructuredOutputSpec


def test_choices_with_regex_characters_are_matched_literally(make_llm) -> None:
    llm = make_llm()
    choices = ["1+1", "(x)", "a.b|c"]
    spec = StructuredOutputSpec("choice", choices, "guided_choice")
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, structured_output=spec) for s in range(4)]
    outs = [o.outputs[0] for o in llm.generate(["the quick brown fox"] * 4, params)]
    for o in outs:
        assert o.text in choices, o.text
        assert o.finish_reason == "stop"
