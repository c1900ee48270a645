"""Worker processes: start-up errors carry the worker's traceback; a SIGKILLed worker is EngineDeadError; no orphans."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from twinserve.backends.real import LLM, SamplingParams
from twinserve.core.errors import EngineDeadError

from .procs_helpers import broken_weights_dir, wait_all_gone
from ..limits import bounded

pytestmark = pytest.mark.slow
KW = dict(dtype="float64", max_model_len=256, num_gpu_blocks_override=256, block_size=4)


def test_a_worker_startup_error_surfaces_with_that_workers_traceback(tiny_dir: Path, tmp_path: Path) -> None:
    from twinserve.backends.real.core_proc import EngineStartupError

    # Weights only the worker processes load: their failure comes back with a worker's traceback.
    broken = broken_weights_dir(tiny_dir, tmp_path / "broken")
    with pytest.raises(EngineStartupError) as info:
        LLM(str(broken), tensor_parallel_size=2, **KW)
    msg = str(info.value)
    assert re.search(r"worker rank [01] failed while starting", msg) and "load_hf_folder" in msg  # its traceback


def test_bad_tensor_parallel_sizes_are_typed_errors_before_any_process(tiny_dir: Path) -> None:
    from twinserve.core.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="tensor_parallel_size"):
        LLM(str(tiny_dir), tensor_parallel_size=0, **KW)
    with pytest.raises(InvalidConfigError, match="distributed_executor_backend"):
        LLM(str(tiny_dir), tensor_parallel_size=2, distributed_executor_backend="uni", **KW)


@pytest.mark.parametrize("mode,victim", [("inproc", 1), ("process", 0)], ids=["rank1-inproc-core", "rank0-core-process"])
def test_sigkill_of_a_worker_mid_generation_is_engine_dead_and_leaves_no_process(
        tiny_dir: Path, mode: str, victim: int) -> None:
    llm = LLM(str(tiny_dir), tensor_parallel_size=2, engine_core_mode=mode, **KW)
    engine = llm.llm_engine
    pids = engine.child_pids
    workers = pids[-2:]
    for i in range(4):
        engine.add_request(f"r{i}", {"prompt_token_ids": [5 + i, 6, 7]},
                           SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in bounded():
        if any(o.outputs[0].token_ids for o in engine.step()):
            break
    os.kill(workers[victim], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineDeadError) as info:
        for _ in bounded():
            engine.step()
    assert time.monotonic() - t0 < 10.0
    assert f"rank {victim}" in str(info.value) and "SIGKILL" in str(info.value)
    engine.shutdown()
    assert wait_all_gone(pids) == []
