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
from .procs_helpers import alive, wait_all_gone

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
    # Step logs time the core's phases in process: asking for one here is a typed error, not a silent gap.
    with pytest.raises(InvalidConfigError, match="engine_core_mode"):
        LLM(str(tiny_dir), engine_core_mode="process", step_log_path=str(tmp_path / "s.csv"), **KW)


def test_a_core_startup_error_surfaces_with_its_traceback(tiny_dir: Path) -> None:
    from twinserve.backends.real.core_proc import EngineStartupError

    with pytest.raises(EngineStartupError) as info:
        LLM(str(tiny_dir), engine_core_mode="process", **{**KW, "num_gpu_blocks_override": None,
                                                          "kv_cache_memory_gb": -1.0})
    msg = str(info.value)
    assert "kv_cache_memory_gb" in msg and "determine_num_blocks" in msg  # the child's own traceback


def test_killing_the_core_process_is_engine_dead_within_seconds(tiny_dir: Path) -> None:
    llm = LLM(str(tiny_dir), engine_core_mode="process", **KW)
    engine = llm.llm_engine
    (core_pid,) = engine.child_pids
    engine.add_request("long", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=200, ignore_eos=True))
    while not any(o.outputs[0].token_ids for o in engine.step()):
        pass
    os.kill(core_pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError, match="SIGKILL"):
        while True:
            engine.step()
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(EngineDeadError):  # and it stays dead: no silent restart, no hang
        engine.add_request("next", {"prompt_token_ids": [5]}, SamplingParams(max_tokens=2))
    engine.shutdown()
    assert wait_all_gone([core_pid]) == []
