"""Request.owning: a Request taking its caller's list over as all_token_ids, its prompt a PromptView
that reads as the prompt list would, however many tokens are appended after it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.core.request import PromptView, Request
from twinserve.core.sampling_params import SamplingParams


@given(st.lists(st.integers(0, 1000), max_size=40), st.lists(st.integers(0, 1000), max_size=20),
       st.integers(-50, 50), st.integers(-50, 50), st.integers(-3, 3).filter(bool))
def test_an_owned_prompt_reads_as_the_prompt_list_after_appends(prompt, more, i, j, step) -> None:
    tokens = list(prompt)
    req = Request.owning("r", tokens, SamplingParams(max_tokens=4))
    assert req.all_token_ids is tokens
    req.all_token_ids.extend(more)
    view = req.prompt_token_ids
    assert isinstance(view, PromptView)
    assert len(view) == req.num_prompt_tokens == len(prompt)
    assert list(view) == prompt and view == prompt and view == tuple(prompt)
    assert view[i:j:step] == prompt[i:j:step]
    if -len(prompt) <= i < len(prompt):
        assert view[i] == prompt[i]
    else:
        with pytest.raises(IndexError):
            view[i]
    assert (view == prompt + [1]) is False
    assert req.num_tokens == len(prompt) + len(more)
    copied = Request("r", list(prompt), SamplingParams(max_tokens=4))
    assert copied.num_prompt_tokens == req.num_prompt_tokens and copied.prompt_token_ids == view
