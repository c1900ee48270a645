"""The engine core in its own process: same tokens and metrics as in process, errors surface, nothing orphaned."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from twinserve.backends.real import LLM, SamplingParams
from twinserve.core.errors import EngineDeadError, InvalidConfigError

from .conftest import prompts_ids
from .procs_helpers import alive, broken_weights_dir, wait_all_gone
from ..limits import bounded

pytestmark = pytest.mark.slow
KW = dict(dtype="float64", max_model_len=256, num_gpu_blocks_override=256, block_size=4, max_num_batched_tokens=32)


def test_process_mode_gives_the_same_outputs(tiny_dir: Path, tmp_path: Path) -> None:
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(6, seed=7)]
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True, logprobs=2)
    inproc = LLM(str(tiny_dir), engine_core_mode="inproc", **KW)
    ref = inproc.generate(prompts, params, use_tqdm=False)
    inproc.llm_engine.shutdown()
    llm = LLM(str(tiny_dir), engine_core_mode="process", **KW)
    engine = llm.llm_engine
    pids = engine.child_pids
    assert len(pids) == 1 and pids[0] != os.getpid() and alive(pids[0])
    got = llm.generate(prompts, params, use_tqdm=False)
    for r, g in zip(ref, got):
        assert g.outputs[0].token_ids == r.outputs[0].token_ids
        assert [lp.token_id for lp in g.outputs[0].logprobs] == g.outputs[0].token_ids
        assert g.outputs[0].text == r.outputs[0].text
        m = g.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert m.num_generation_tokens == 12
    # 6 prompts of up to 40 tokens through a 32-token budget: several chunked-prefill steps.
    assert engine.core.scheduler.kv.num_free_blocks == 256 and engine.core.num_steps >= 13
    engine.shutdown()
    assert wait_all_gone(pids) == []
    # A step log asked for at start-up: the core process times its steps from the first one.
    llm = LLM(str(tiny_dir), engine_core_mode="process", step_log_path=str(tmp_path / "s.csv"), **KW)
    llm.generate(prompts, params, use_tqdm=False)
    steps = llm.llm_engine.core.num_steps
    llm.llm_engine.shutdown()
    from twinserve.backends.real.step_log import read_step_log

    rows = read_step_log(tmp_path / "s.csv")
    assert [int(r["step"]) for r in rows] == list(range(steps)) and all(r["forward_s"] > 0 for r in rows)


def test_a_core_startup_error_surfaces_with_its_traceback(tiny_dir: Path, tmp_path: Path) -> None:
    from twinserve.backends.real.core_proc import EngineStartupError

    # A bad setting is a typed error in the front end, before any process starts.
    with pytest.raises(InvalidConfigError, match="kv_cache_memory_gb"):
        LLM(str(tiny_dir), engine_core_mode="process", **{**KW, "num_gpu_blocks_override": None,
                                                          "kv_cache_memory_gb": -1.0})
    # Weights only the core process loads: their failure comes back with the child's traceback.
    broken = broken_weights_dir(tiny_dir, tmp_path / "broken")
    with pytest.raises(EngineStartupError) as info:
        LLM(str(broken), engine_core_mode="process", **KW)
    msg = str(info.value)
    assert "the engine core failed to start" in msg and "load_hf_folder" in msg  # the child's own traceback


def test_killing_the_core_process_is_engine_dead_within_seconds(tiny_dir: Path) -> None:
    llm = LLM(str(tiny_dir), engine_core_mode="process", **KW)
    engine = llm.llm_engine
    (core_pid,) = engine.child_pids
    engine.add_request("long", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in bounded():
        if any(o.outputs[0].token_ids for o in engine.step()):
            break
    os.kill(core_pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError, match="SIGKILL"):
        for _ in bounded():
            engine.step()
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(EngineDeadError):  # and it stays dead: no silent restart, no hang
        engine.add_request("next", {"prompt_token_ids": [5]}, SamplingParams(max_tokens=2))
    engine.shutdown()
    assert wait_all_gone([core_pid]) == []


def _run_mixed_batch(tiny_dir: Path, mode: str) -> dict:
    """Prompt logprobs, a logit bias and one request whose sampling fails, side by side in one batch."""
    llm = LLM(str(tiny_dir), engine_core_mode=mode, **KW)
    engine = llm.llm_engine
    plp_prompt, biased_prompt, bad_prompt, good_prompt = prompts_ids(4, seed=31, lo=10)
    # Past the front end's validation, at the seam to the core (wherever the core runs): a stop id
    # outside the vocabulary makes the runner's min_tokens mask raise for this request alone.
    add = engine.core.add_request

    def corrupt(req):
        if req.request_id == "bad":
            req.sampling_params = req.sampling_params.clone(stop_token_ids=[10 ** 6])
        add(req)

    engine.core.add_request = corrupt
    engine.add_request("plp", {"prompt_token_ids": plp_prompt},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=3, logprobs=2))
    engine.add_request("biased", {"prompt_token_ids": biased_prompt},
                       SamplingParams(temperature=0.9, seed=4, max_tokens=6, ignore_eos=True, logit_bias={"17": 100}))
    engine.add_request("bad", {"prompt_token_ids": bad_prompt},
                       SamplingParams(temperature=0.7, seed=1, max_tokens=8, min_tokens=4, ignore_eos=True))
    engine.add_request("good", {"prompt_token_ids": good_prompt},
                       SamplingParams(temperature=0.7, seed=2, max_tokens=8, ignore_eos=True))
    finished = {}
    deadline = time.monotonic() + 60
    while len(finished) < 4 and time.monotonic() < deadline:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    free = engine.core.scheduler.kv.num_free_blocks
    dead = engine.dead
    engine.shutdown()
    return {"outs": finished, "free": free, "dead": dead, "plp_prompt": plp_prompt}


def test_new_request_fields_cross_the_process_boundary(tiny_dir: Path) -> None:
    ref = _run_mixed_batch(tiny_dir, "inproc")
    got = _run_mixed_batch(tiny_dir, "process")
    for run in (ref, got):
        outs = run["outs"]
        assert set(outs) == {"plp", "biased", "bad", "good"}
        assert run["dead"] is None and run["free"] == 256
        bad = outs["bad"].outputs[0]
        assert bad.finish_reason == "error" and "sampling failed" in bad.error
        assert outs["good"].outputs[0].finish_reason == "length" and outs["good"].outputs[0].error is None
        assert outs["biased"].outputs[0].token_ids == [17] * 6  # a +100 bias wins every draw
        plp = outs["plp"].prompt_logprobs
        assert plp is not None and len(plp) == len(run["plp_prompt"]) and plp[0] is None
        assert [r.token_id for r in plp[1:]] == run["plp_prompt"][1:]
        assert all(len(r.top) == 3 for r in plp[1:])
    # What a user sees is the same wherever the core runs.
    for rid in ("plp", "biased", "bad", "good"):
        r, g = ref["outs"][rid], got["outs"][rid]
        assert g.outputs[0].token_ids == r.outputs[0].token_ids
        assert g.outputs[0].text == r.outputs[0].text
        assert (g.outputs[0].finish_reason, g.outputs[0].error) == (r.outputs[0].finish_reason, r.outputs[0].error)
    for a, b in zip(ref["outs"]["plp"].prompt_logprobs[1:], got["outs"]["plp"].prompt_logprobs[1:]):
        assert (b.token_id, b.rank, [t for t, _ in b.top]) == (a.token_id, a.rank, [t for t, _ in a.top])
        assert b.logprob == pytest.approx(a.logprob, abs=1e-12)


def test_the_core_waits_for_a_front_end_that_does_not_read(tiny_dir: Path) -> None:
    from twinserve.backends.real.core_proc import MAX_UNCONSUMED_BATCHES

    llm = LLM(str(tiny_dir), engine_core_mode="process", **KW)
    engine = llm.llm_engine
    try:
        engine.add_request("r", {"prompt_token_ids": prompts_ids(1, seed=3)[0]},
                           SamplingParams(max_tokens=60, ignore_eos=True))
        time.sleep(1.0)  # ample for 60 steps of the tiny model, were the core free to run
        first = engine.step()
        # The core stopped once its unread batches reached the bound (a few): outputs did not pile up.
        assert engine.core.num_steps <= MAX_UNCONSUMED_BATCHES <= 4
        assert sum(len(o.outputs[0].token_ids) for o in first) <= MAX_UNCONSUMED_BATCHES
        outs = list(first)
        for _ in bounded():
            if not engine.has_unfinished_requests():
                break
            outs.extend(engine.step())
        # Held back, not lost: every token arrives, and the request ends as asked.
        final = [o for o in outs if o.finished]
        assert len(final) == 1 and len(final[0].outputs[0].token_ids) == 60
        assert final[0].outputs[0].finish_reason == "length"
    finally:
        engine.shutdown()
