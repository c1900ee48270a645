"""Detokenization across multi-byte characters, stop strings, streaming deltas, chat, bad input."""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.detokenizer import IncrementalDetokenizer
from twinserve.core.errors import InvalidRequestError, InvalidSamplingParamsError, PromptTooLongError

from .conftest import prompts_ids
from ..limits import bounded

TEXT = "héllo wörld 日本語 🙂🚀 ça va"


def test_incremental_detokenizer_matches_full_decode_one_token_at_a_time(make_llm) -> None:
    tok = make_llm().get_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several tokens
    d = IncrementalDetokenizer.for_prompt(tok, [5, 6], True, [])
    deltas = []
    for t in ids:
        d.add_tokens([t])
        delta = d.take_delta(False)
        assert "\ufffd" not in delta
        deltas.append(delta)
    d.flush()
    deltas.append(d.take_delta(True))
    assert "".join(deltas) == TEXT == tok.decode(ids)


def test_a_cut_mid_character_leaves_no_replacement_character(make_llm) -> None:
    # max_tokens (or a stop token) can end the output inside a multi-byte character: as incremental
    # detokenizers do, the incomplete tail is held back and then dropped, never shown as U+FFFD.
    tok = make_llm().get_tokenizer()
    ids = tok(TEXT)["input_ids"]
    cuts_mid_char = 0
    for cut in range(1, len(ids) + 1):
        d = IncrementalDetokenizer.for_prompt(tok, [5, 6], True, [])
        for t in ids[:cut]:
            d.add_tokens([t])
        d.flush()
        text = d.text
        cuts_mid_char += tok.decode(ids[:cut]).endswith("\ufffd")
        assert "\ufffd" not in text and TEXT.startswith(text), (cut, text)
        assert len(text) >= len(tok.decode(ids[:cut]).rstrip("\ufffd"))
    assert cuts_mid_char > 0  # the text does have cuts inside a character


def test_max_tokens_cut_inside_a_character_ends_without_a_replacement_character(make_llm) -> None:
    # Through the engine: allowed_token_ids forces a character's leading byte token, and max_tokens=1 ends
    # the output before the character completes (a length finish, so the detokenizer's flush runs).
    llm = make_llm()
    tok = llm.get_tokenizer()
    cuts = 0
    for ch in "é日🙂":
        first = tok(ch, add_special_tokens=False)["input_ids"][0]
        if not tok.decode([first]).endswith("\ufffd"):
            continue  # a whole character in one token: no cut inside it
        cuts += 1
        sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, allowed_token_ids=[first])
        out = llm.generate([{"prompt_token_ids": [5, 6]}], sp, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == [first] and out.finish_reason == "length"
        assert out.text == "", (ch, out.text)
    assert cuts > 0


def test_stop_string_trims_ends_request_and_frees_blocks(make_llm) -> None:
    llm = make_llm()
    engine = llm.llm_engine
    prompt = prompts_ids(1, seed=21)[0]
    free = engine.core.scheduler.kv.num_free_blocks
    full = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert len(stop) == 3
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                                      stop=[stop]), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full[:full.index(stop)]
    assert len(c.token_ids) < 30
    engine.step()  # the core drops the aborted request's state on the next step
    assert not engine.core.has_unfinished_requests()
    assert engine.core.scheduler.kv.num_free_blocks == free


def test_streaming_deltas_concatenate_to_the_final_text(make_llm) -> None:
    llm = make_llm()
    engine = llm.llm_engine
    prompt = prompts_ids(1, seed=22)[0]
    sp = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True, stop=["zzzz-never"])
    engine.add_request("s1", {"prompt_token_ids": prompt}, sp)
    text, ids, final = "", [], None
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            text += out.outputs[0].text_delta
            ids += out.outputs[0].token_ids_delta
            final = out
    assert final is not None and final.finished
    assert text == final.outputs[0].text and ids == final.outputs[0].token_ids and len(ids) == 25


def test_chat_uses_the_template(make_llm) -> None:
    llm = make_llm()
    out = llm.chat([{"role": "user", "content": "the quick fox"}], SamplingParams(temperature=0, max_tokens=5),
                   use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    assert out.prompt_token_ids == tok("<user>the quick fox<bot>")["input_ids"]
    assert out.metrics is not None and out.metrics.num_prompt_tokens == len(out.prompt_token_ids)
    assert out.metrics.ttft is not None and out.metrics.e2e_latency >= out.metrics.ttft


@pytest.mark.parametrize("prompt,params,error,needle", [
    ("", SamplingParams(), InvalidRequestError, "empty"),
    ({"prompt_token_ids": []}, SamplingParams(), InvalidRequestError, "empty"),
    ({"prompt_token_ids": [5] * 300}, SamplingParams(), PromptTooLongError, "max_model_len"),
    ({"prompt_token_ids": [5, 100000]}, SamplingParams(), InvalidRequestError, "vocabulary"),
    ({"prompt_token_ids": [5]}, SamplingParams(logprobs=20, max_tokens=2), None, None),
    ({"prompt_token_ids": [5]}, SamplingParams(stop_token_ids=[10 ** 6]), InvalidSamplingParamsError,
     "stop_token_ids"),
    ({"prompt_token_ids": [5]}, {"temperature": 0}, InvalidRequestError, "SamplingParams"),
    (3.5, SamplingParams(), InvalidRequestError, "prompt"),
])
def test_bad_input_is_a_typed_error_and_the_engine_keeps_serving(make_llm, prompt, params, error, needle) -> None:
    llm = make_llm(max_logprobs=5) if error is None else make_llm()
    engine = llm.llm_engine
    engine.add_request("good", {"prompt_token_ids": [7, 8, 9]}, SamplingParams(temperature=0, max_tokens=6,
                                                                              ignore_eos=True))
    engine.step()
    if error is None:
        with pytest.raises(InvalidSamplingParamsError, match="logprobs"):
            engine.add_request("bad", prompt, params)
    else:
        with pytest.raises(error, match=needle):
            engine.add_request("bad", prompt, params)
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("good", {"prompt_token_ids": [1]}, SamplingParams())
    done = None
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            done = out
    assert done is not None and done.request_id == "good" and len(done.outputs[0].token_ids) == 6


def test_abort_frees_blocks(make_llm) -> None:
    llm = make_llm()
    engine = llm.llm_engine
    free = engine.core.scheduler.kv.num_free_blocks
    engine.add_request("a", {"prompt_token_ids": [4] * 20}, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.core.scheduler.kv.num_free_blocks < free
    outs = engine.abort_request("a")
    assert outs[0].finished and outs[0].outputs[0].finish_reason == "abort"
    assert engine.core.scheduler.kv.num_free_blocks == free and not engine.has_unfinished_requests()


def test_executor_failure_marks_the_engine_dead(make_llm, monkeypatch) -> None:
    from twinserve.core.errors import EngineDeadError

    engine = make_llm().llm_engine
    engine.add_request("x", {"prompt_token_ids": [4, 5]}, SamplingParams(max_tokens=3))

    def boom(so):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.executor, "execute", boom)
    with pytest.raises(EngineDeadError, match="device lost"):
        engine.step()
    with pytest.raises(EngineDeadError):
        engine.add_request("y", {"prompt_token_ids": [4]}, SamplingParams())
