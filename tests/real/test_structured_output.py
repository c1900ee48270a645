"""Structured output on the real engine: the grammar mask alone makes a random model's output valid."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from twinserve.core.errors import InvalidRequestError, InvalidSamplingParamsError
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.structured_output import StructuredOutputSpec
from ..limits import bounded

# Finite by construction: with compact JSON every valid output ends within a few dozen tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "score": {"type": "integer", "enum": [0, 1, 2, 3]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "tags", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["the quick brown fox", "hello there", "a b c"]


def _spec(kind: str, value, param: str = "guided") -> StructuredOutputSpec:
    return StructuredOutputSpec(kind, value, param)


def test_json_schema_outputs_parse_and_validate_in_a_mixed_batch(make_llm) -> None:
    from twinserve.backends.real.step_log import StepLog

    llm = make_llm()
    llm.llm_engine.set_step_log(StepLog(keep=True))
    spec = _spec("json", json.dumps(SCHEMA))
    constrained = [SamplingParams(max_tokens=120, temperature=1.0, seed=s, structured_output=spec)
                   for s in range(len(PROMPTS))]
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], [free])[0].outputs[0].token_ids
    outs = llm.generate(PROMPTS + [PROMPTS[0]], constrained + [free])
    for out in outs[:3]:
        c = out.outputs[0]
        jsonschema.validate(json.loads(c.text), SCHEMA)
        assert c.finish_reason == "stop"
    # The unconstrained row shared every step with constrained rows and is untouched by their masks.
    assert outs[3].outputs[0].token_ids == alone
    steps = llm.llm_engine.step_log.records
    # The mask's cost is logged per step for the twin; steps with no constrained row carry none.
    masked = [r for r in steps if r.extra.get("num_constrained", 0) > 0]
    assert masked and all(r.extra["grammar_mask_s"] > 0 for r in masked)
    assert all(r.extra["num_constrained"] <= 3 for r in masked)


def test_json_schema_without_the_constraint_does_not_validate(make_llm) -> None:
    # The guard: the random model alone does not write this JSON (the test above proves the mask works).
    llm = make_llm()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=1.0, seed=0))
    for out in outs:
        with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


def test_regex_choice_and_json_object(make_llm) -> None:
    llm = make_llm()
    params = [
        SamplingParams(max_tokens=30, temperature=1.0, seed=1, structured_output=_spec("regex", r"[a-c]{3}-\d{2}")),
        SamplingParams(max_tokens=30, temperature=1.0, seed=2,
                       structured_output=_spec("choice", ["red", "green", "blue sky"])),
        SamplingParams(max_tokens=30, temperature=0, structured_output=_spec("choice", ["alpha", "beta"])),
    ]
    outs = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    assert re.fullmatch(r"[a-c]{3}-\d{2}", outs[0]), outs[0]
    assert outs[1] in ("red", "green", "blue sky")
    assert outs[2] in ("alpha", "beta")
    obj = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=200, temperature=0.7, seed=5,
                                                   structured_output=_spec("json_object", "")))[0].outputs[0]
    if obj.finish_reason == "stop":  # a random model may fill all 200 tokens with one long string
        assert isinstance(json.loads(obj.text), (dict, list))
    else:
        assert obj.text.lstrip().startswith(("{", "["))


def test_constraint_survives_preemption_and_resumption(make_llm) -> None:
    # 32 blocks of 4 tokens for 6 sequences that each need ~20 blocks: the scheduler must preempt.
    llm = make_llm(num_gpu_blocks_override=32, max_model_len=128, max_num_batched_tokens=64)
    spec = _spec("json", json.dumps(SCHEMA))
    params = [SamplingParams(max_tokens=100, temperature=1.0, seed=s, structured_output=spec) for s in range(6)]
    outs = llm.generate(["x y z " * 2] * 6, params)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for out in outs:
        if out.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        else:  # ran out of max_tokens: still a prefix of valid output
            assert out.outputs[0].text.startswith('{"answer": "')


def test_compilation_is_cached_and_bad_specs_are_typed_errors(make_llm) -> None:
    llm = make_llm()
    compiler = llm.llm_engine.grammar_compiler
    a, b = _spec("json", json.dumps(SCHEMA)), _spec("json", json.dumps(SCHEMA))
    compiler.compile(a)
    misses = compiler.misses
    compiler.compile(b)
    assert compiler.misses == misses and compiler.hits >= 1 and b.compiled is a.compiled
    with pytest.raises(InvalidRequestError) as e:
        compiler.compile(_spec("json", "{not json", "guided_json"))
    assert e.value.param == "guided_json"
    with pytest.raises(InvalidRequestError):
        compiler.compile(_spec("regex", "(unclosed", "guided_regex"))
    with pytest.raises(InvalidSamplingParamsError):
        SamplingParams(structured_output=_spec("choice", []))
    with pytest.raises(InvalidSamplingParamsError):
        SamplingParams(ignore_eos=True, structured_output=_spec("regex", "a+"))


@pytest.mark.slow
@pytest.mark.parametrize("mode,tp", [("process", 1), ("inproc", 2)], ids=["core-process", "tp2-workers"])
def test_constraints_hold_when_the_runner_is_in_another_process(make_llm, mode: str, tp: int) -> None:
    # Compiled grammars do not serialize: the spec crosses bare and the masking process compiles it.
    specs = [_spec("json", json.dumps(SCHEMA)), _spec("choice", ["red", "green", "blue sky"]),
             _spec("regex", r"[a-c]{3}-\d{2}")]

    def params() -> list[SamplingParams]:  # fresh specs: nothing compiled in this process yet
        return [SamplingParams(max_tokens=120, temperature=1.0, seed=i,
                               structured_output=_spec(s.kind, s.value)) for i, s in enumerate(specs)]

    ref = make_llm().generate(PROMPTS, params(), use_tqdm=False)
    llm = make_llm(engine_core_mode=mode, tensor_parallel_size=tp)
    got = llm.generate(PROMPTS, params(), use_tqdm=False)
    texts = [o.outputs[0].text for o in got]
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    assert texts[1] in ("red", "green", "blue sky")
    assert re.fullmatch(r"[a-c]{3}-\d{2}", texts[2]), texts[2]
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert all(o.outputs[0].finish_reason == "stop" for o in got)
    llm.llm_engine.shutdown()


@pytest.mark.slow
def test_a_tokenizer_object_with_the_core_in_a_process_refuses_structured_output(tiny_dir) -> None:
    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine
    from twinserve.backends.real.tokenizer import load_tokenizer
    from twinserve.backends.real.models.registry import resolve_model

    tok = load_tokenizer(resolve_model(str(tiny_dir)))
    engine = LLMEngine(EngineArgs(model=str(tiny_dir), dtype="float64", max_model_len=256, num_gpu_blocks_override=64,
                                  block_size=4, engine_core_mode="process"), tokenizer=tok)
    try:
        with pytest.raises(InvalidRequestError, match="tokenizer") as e:
            engine.add_request("c", "a b c", SamplingParams(structured_output=_spec("regex", "a+", "guided_regex")))
        assert e.value.param == "guided_regex"
        engine.add_request("free", "a b c", SamplingParams(max_tokens=3, ignore_eos=True))
        done = []
        for _ in bounded():
            if not engine.has_unfinished_requests():
                break
            done += [o for o in engine.step() if o.finished]
        assert [o.request_id for o in done] == ["free"] and len(done[0].outputs[0].token_ids) == 3
    finally:
        engine.shutdown()
