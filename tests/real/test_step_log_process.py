"""The step log with the engine core in its own process: the same steps as in process, timed by the core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from twinserve.backends.real import LLM, SamplingParams
from twinserve.backends.real.step_log import StepLog, read_step_log

from .conftest import prompts_ids
from ..limits import bounded

pytestmark = pytest.mark.slow
KW = dict(dtype="float64", max_model_len=256, num_gpu_blocks_override=256, block_size=4, max_num_batched_tokens=32)
GREEDY = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
_T0 = 1000.0  # request i arrives at _T0 + i in both runs


def _run_process(engine: Any, prompts: list[list[int]]) -> tuple[dict[str, list[int]], list[int]]:
    """All requests at once; also how many of them had reached the core before each of its steps."""
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, GREEDY, arrival_time=_T0 + i)
    tokens, received = {}, []
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        outs = engine.step()
        received += [int(tr.admitted_until - _T0) + 1 for _, tr in engine.last_core_steps]
        tokens.update((o.request_id, o.outputs[0].token_ids) for o in outs if o.finished)
    return tokens, received


def _run_inproc(engine: Any, prompts: list[list[int]], received: list[int]) -> dict[str, list[int]]:
    """The same requests, each added before the step the core process first had it for."""
    tokens, added = {}, 0
    for n in received:
        while added < n:
            engine.add_request(f"r{added}", {"prompt_token_ids": prompts[added]}, GREEDY,
                               arrival_time=_T0 + added)
            added += 1
        tokens.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
    assert not engine.has_unfinished_requests()
    return tokens


def _shape(r: Any) -> tuple:
    return (r.prefill_chunks, r.decode_context_lens, r.scheduled, r.num_running, r.num_waiting)


def test_process_step_log_matches_the_inproc_one(tiny_dir: Path, tmp_path: Path) -> None:
    prompts = prompts_ids(6, seed=11, lo=10, hi=40)
    logs, tokens = {}, {}
    # The core process steps as soon as its first request arrives, so which requests a step sees
    # depends on when their messages arrived: the in-process run is given the same arrivals, step
    # for step, from what the core process reported it had received (its admission horizon).
    for mode in ("process", "inproc"):
        llm = LLM(str(tiny_dir), engine_core_mode=mode, **KW)
        engine = llm.llm_engine
        logs[mode] = StepLog(tmp_path / f"{mode}.jsonl", keep=True, record_schedule=True)
        engine.set_step_log(logs[mode])
        try:
            if mode == "process":
                tokens[mode], received = _run_process(engine, prompts)
            else:
                tokens[mode] = _run_inproc(engine, prompts, received)
        finally:
            engine.shutdown()
    assert received == sorted(received) and received[-1] == len(prompts)
    ref, got = logs["inproc"].records, logs["process"].records
    # Same scheduler, same admissions: the same steps, shape for shape, and the same tokens.
    assert [_shape(r) for r in got] == [_shape(r) for r in ref]
    assert tokens["process"] == tokens["inproc"] and len(tokens["process"]) == 6
    lens = {f"r{i}": len(p) for i, p in enumerate(prompts)}
    assert any(1 < n < lens[rid] for r in got for rid, n in r.scheduled.items())  # chunked prefill
    assert any(r.prefill_chunks and r.decode_context_lens for r in got)  # mixed steps too
    assert [r.step for r in got] == list(range(len(got)))
    # Every phase was timed in the core process, and the parts fit inside the core's step.
    for r in got:
        assert min(r.schedule_s, r.prepare_s, r.forward_s, r.sample_s, r.update_s) > 0
        assert r.step_time_s >= r.schedule_s + r.prepare_s + r.forward_s + r.sample_s + r.update_s
        assert r.gap_s >= 0 and r.output_s >= 0
    # The core's gaps while it had work: the IPC hop at least (the first step has none).
    assert got[0].gap_s == 0 and all(r.gap_s > 0 for r in got[3:])
    # The front end's output processing is recorded (on the last step of each batch it read).
    assert sum(r.output_s > 0 for r in got) >= len(got) // 2
    # Start times are on one monotonic clock, in order, each step after the last one ended.
    for a, b in zip(got, got[1:]):
        assert b.start_s >= a.start_s + a.step_time_s - 1e-3
    # The file has the same records as memory (what calibrate --from-log and fidelity read).
    rows = read_step_log(tmp_path / "process.jsonl")
    assert [r["scheduled"] for r in rows] == [r.scheduled for r in got]
    assert all(r["forward_s"] > 0 for r in rows)


def test_process_mode_without_a_log_times_and_keeps_nothing(tiny_dir: Path) -> None:
    llm = LLM(str(tiny_dir), engine_core_mode="process", **KW)
    engine = llm.llm_engine
    seen: list[Any] = []
    get = engine.core.get_output

    def spy(timeout: float) -> Any:
        res = get(timeout)
        if res is not None:
            seen.append(res)
        return res

    engine.core.get_output = spy
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(3, seed=5)]
    try:
        llm.generate(prompts, GREEDY, use_tqdm=False)
        assert engine.core.num_steps >= 7
        # Each batch read carries the latest step's stats (a read may take several batches).
        stats = [s.stats for s in seen if s.stats is not None]
        # No clock in the core (its phase times are exactly 0) and no trace on the wire.
        assert stats and all(s.schedule_time == s.execute_time == s.update_time == 0.0 for s in stats)
        assert all(s.traces is None for s in seen)
        assert engine.step_log.records == [] and engine.step_log.num_records == 0
        assert engine.last_core_steps == []
        # On, then off again: the core times while a log is on, and stops when it is off.
        log = StepLog(keep=True)
        engine.set_step_log(log)
        llm.generate(prompts, GREEDY, use_tqdm=False)
        assert log.num_records >= 7 and all(r.forward_s > 0 for r in log.records)
        assert all(r.scheduled is None for r in log.records)  # schedules only when asked for
        engine.set_step_log(StepLog())
        seen.clear()
        llm.generate(prompts, GREEDY, use_tqdm=False)
        stats = [s.stats for s in seen if s.stats is not None]
        assert stats and all(s.schedule_time == s.execute_time == 0.0 for s in stats)
        assert all(s.traces is None for s in seen) and log.num_records == len(log.records)
    finally:
        engine.shutdown()
