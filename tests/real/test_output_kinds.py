"""Output kinds: delta outputs carry only new tokens until the last one; final_only emits once."""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams
from twinserve.core.errors import InvalidRequestError

from .conftest import prompts_ids

PARAMS = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=7, logprobs=2, n=2)


def _drain(engine, kind: str, prompt: list[int]) -> list:
    engine.add_request("r", {"prompt_token_ids": prompt}, PARAMS, output_kind=kind)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    return outs


@pytest.mark.parametrize("kind", ["delta", "final_only"])
def test_lean_kinds_give_the_same_final_output_as_cumulative(make_llm, kind: str) -> None:
    engine = make_llm().llm_engine
    prompt = prompts_ids(1, seed=9)[0]
    ref = _drain(engine, "cumulative", prompt)
    got = _drain(engine, kind, prompt)
    for a, b in zip(ref[-1].outputs, got[-1].outputs):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert [lp.token_id for lp in a.logprobs] == [lp.token_id for lp in b.logprobs] == a.token_ids
    # Cumulative outputs repeat everything; each output's list is a prefix of the next.
    assert len(ref) > 2 and all(len(c.token_ids) <= len(d.token_ids)
                                for x, y in zip(ref, ref[1:]) for c, d in zip(x.outputs, y.outputs))
    if kind == "final_only":
        assert len(got) == 1 and got[0].finished
        return
    assert len(got) == len(ref)
    for o in got[:-1]:  # nothing copied but the new tokens
        assert all(c.token_ids == [] and c.logprobs == [] for c in o.outputs)
    for i in range(2):
        deltas = [t for o in got for t in o.outputs[i].token_ids_delta]
        assert deltas == got[-1].outputs[i].token_ids
        assert "".join(o.outputs[i].text_delta for o in got) == got[-1].outputs[i].text


def test_unknown_output_kind_is_a_typed_error(make_llm) -> None:
    engine = make_llm().llm_engine
    with pytest.raises(InvalidRequestError, match="output_kind"):
        engine.add_request("x", {"prompt_token_ids": [5, 6]}, SamplingParams(), output_kind="partial")
    assert not engine.has_unfinished_requests()
