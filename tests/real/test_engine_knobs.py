"""One source for knobs: every scheduler field a study can set is an engine flag and an LLM(...) argument.

The simulator's [scheduler] section and EngineArgs are both derived from the core's
SchedulerConfig; these tests hold the engine to that for `twinserve serve`, `twinserve
generate` and LLM(...), down to the scheduler the engine really runs.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from twinserve.backends.real.config import FROM_ENGINE, EngineArgs
from twinserve.cli import build_parser
from twinserve.commands import engine_args_from
from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.hashing import HASH_FUNCTIONS
from twinserve.core.sched.batch_policy import MixedBatchWait
from twinserve.core.sched.config import SCHEDULER_CHOICES, SchedulerConfig
from twinserve.core.sched.policies import KeyedQueue, PreemptLastAdmitted
from twinserve.sim.config import FROM_ELSEWHERE, SchedulerSection
from twinserve.sim.kv_offload import KVOffloadSection

# The simulator's [scheduler] fields but the model's own (the engine reads its window from the model).
SIM_KNOBS = [f.name for f in fields(SchedulerSection) if f.name not in FROM_ENGINE]

# Values other than the default that the tiny model takes, all at once (chunked prefill off
# needs a budget of at least max_model_len).
OTHER = {"max_model_len": 128, "max_num_batched_tokens": 192, "max_num_seqs": 7,
         "enable_chunked_prefill": False, "long_prefill_token_threshold": 9, "block_size": 8,
         "enable_prefix_caching": False, "watermark": 0.05, "aging_interval_s": 12.5,
         "max_prefill_tokens": 300, "recv_interval": 3, "batch_wait_iters": 4, "batch_wait_tokens_ratio": 0.5,
         "adp_balance_iters": 60, "adp_batching_wait_iters": 2, "adp_per_rank": True,
         "overlap_scheduler": True, "max_prompt_len": 100}


def _other(name: str) -> Any:
    """A value for knob `name` other than SchedulerConfig's default."""
    if name in SCHEDULER_CHOICES:
        default = SchedulerConfig.__dataclass_fields__[name].default
        return next(c for c in SCHEDULER_CHOICES[name] if c != default and c != "auto")
    return OTHER[name]


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, str(value)]


def test_the_simulator_has_every_scheduler_knob_but_the_block_count() -> None:
    # The block count comes from the engine's memory; the host tier's two from [kv_offload]; the
    # attention-DP ranks from [engine] data_parallel_size.
    assert set(FROM_ELSEWHERE) == {"num_blocks", "kv_offloading_blocks", "kv_offloading_policy", "adp_ranks"}
    assert {f.name for f in fields(SchedulerSection)} == {f.name for f in fields(SchedulerConfig)} - set(FROM_ELSEWHERE)
    assert {"host_size_gib", "host_blocks", "eviction"} <= {f.name for f in fields(KVOffloadSection)}
    assert set(SIM_KNOBS) == {f.name for f in fields(SchedulerConfig)} - FROM_ENGINE - set(FROM_ELSEWHERE)
    assert {"aging_interval_s", "watermark", "prefix_caching_hash_algo"} <= set(SIM_KNOBS)


@pytest.mark.parametrize("command", [["serve", "m"], ["generate", "hi", "--model", "m"]])
@pytest.mark.parametrize("name", SIM_KNOBS)
def test_every_simulator_knob_is_a_flag_of_serve_and_generate(command: list[str], name: str) -> None:
    value = _other(name)
    ns = build_parser().parse_args(command + _flag(name, value))
    args = engine_args_from(ns, "m")
    assert getattr(args, name) == value
    others = {k: _other(k) for k in ("max_model_len", "max_num_batched_tokens")}
    cfg = args.scheduler_config(others["max_model_len"] if name != "max_model_len" else value, 16)
    assert getattr(cfg, name) == value


@pytest.mark.parametrize("name", sorted(SCHEDULER_CHOICES))
def test_a_name_outside_the_registry_is_refused(name: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--" + name.replace("_", "-"), "nonesuch"])
    with pytest.raises(InvalidConfigError, match=name):
        EngineArgs(**{name: "nonesuch"})


@pytest.mark.slow
def test_llm_takes_every_simulator_knob_and_its_scheduler_runs_with_them(tiny_dir: Path) -> None:
    from twinserve.backends.real import LLM
    from twinserve.core.sampling_params import SamplingParams

    knobs = {name: _other(name) for name in SIM_KNOBS}
    # The batch wait is the mixed policy's (SchedulerConfig refuses it with prefill_first): all at once, the
    # policy stays mixed and the wait is what runs (the per-flag test above takes prefill_first alone).
    knobs["batch_policy"] = "mixed"
    llm = LLM(str(tiny_dir), dtype="float64", num_gpu_blocks_override=64, engine_core_mode="inproc",
              **knobs)
    try:
        sched = llm.llm_engine.core.scheduler
        for name, value in knobs.items():
            assert getattr(sched.config, name) == value, name
        # And they take effect, not just sit in the config.
        assert sched.kv.hash_fn is HASH_FUNCTIONS[knobs["prefix_caching_hash_algo"]]
        assert isinstance(sched.waiting, KeyedQueue) == (knobs["policy"] != "fcfs")
        assert isinstance(sched.preemption_policy, PreemptLastAdmitted) == (knobs["preemption"] == "last")
        assert sched.watermark_blocks == int(0.05 * 64)
        # The engine has one attention-DP rank (adp_ranks, FROM_ENGINE): the balance stands aside, the wait runs.
        assert sched.config.adp_ranks == 1
        assert isinstance(sched.batch_policy, MixedBatchWait) and sched.batch_policy.iters == 4
        out = llm.generate(["the quick brown fox"], SamplingParams(max_tokens=3, temperature=0.0),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
    finally:
        llm.llm_engine.shutdown()
