"""Each row's engine defaults (sim/validate_engines.py), checked against the engines' own sources."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.backends.sim.catalog import hardware_for_aic_system
from twinserve.sim.validate_engines import (FRONTEND_LATENCY_S, FRONTEND_S_PER_PROMPT_TOKEN, engine_defaults,
                                           frontend_latency_s)
from twinserve.sim.validate_rows import load_rows, row_study

GIB = 1024 ** 3


@pytest.mark.parametrize("backend, gib, budget, seqs", [
    # vllm/engine/arg_utils.py get_batch_defaults: >= 70 GiB (H100 and up) 8192 / 1024, else 2048 / 256.
    ("vllm", 80, 8192, 1024), ("vllm", 141, 8192, 1024), ("vllm", 48, 2048, 256),
    # sglang/srt/server_args.py: chunked_prefill_size 2048 below 35 GiB, 8192 below 160 GiB, else 16384.
    ("sglang", 24, 2048, 4096), ("sglang", 80, 8192, 4096), ("sglang", 141, 8192, 4096),
    ("sglang", 180, 16384, 4096),
    # TensorRT-LLM BuildConfig: max_num_tokens 8192, max_batch_size 2048, on every GPU.
    ("trtllm", 80, 8192, 2048), ("trtllm", 180, 8192, 2048),
])
def test_engine_defaults_follow_the_engines_sources(backend: str, gib: float, budget: int, seqs: int) -> None:
    d = engine_defaults(backend, gib * GIB)
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (budget, seqs)
    assert d.source


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="vllm, sglang, trtllm"):
        engine_defaults("tgi", 80 * GIB)


@pytest.mark.parametrize("system, backend, budget", [
    ("h200_sxm", "sglang", 8192), ("h100_sxm", "sglang", 8192), ("b200_sxm", "sglang", 16384),
    ("gb200", "sglang", 16384), ("b200_sxm", "vllm", 8192), ("b200_sxm", "trtllm", 8192),
])
def test_a_rows_study_gets_its_engines_budget_on_its_gpu(system: str, backend: str, budget: int) -> None:
    pytest.importorskip("aiconfigurator_core")
    rows = load_rows()
    r = rows[(rows["model"] == "Qwen3-32B") & (rows["mode"] == "agg")].iloc[0].copy()
    r["system"], r["backend"] = system, backend
    assert hardware_for_aic_system(system)  # the catalog knows the GPU
    cfg = row_study(pd.Series(r))
    assert cfg.scheduler.max_num_batched_tokens == budget
    assert cfg.scheduler.max_num_seqs >= int(r["concurrency"])


@pytest.mark.parametrize("backend, policy, cap", [
    # SGLang's scheduler runs prefill batches alone, first (scheduler.py get_next_batch_to_run;
    # enable_mixed_chunk False), max_prefill_tokens 16384 (server_args.py); vLLM V1 and
    # TensorRT-LLM's in-flight batching mix context and generation in one batch.
    ("sglang", "prefill_first", 16384), ("vllm", "mixed", 0), ("trtllm", "mixed", 0),
])
def test_a_rows_study_gets_its_engines_batch_policy(backend: str, policy: str, cap: int) -> None:
    d = engine_defaults(backend, 141 * GIB)
    assert (d.batch_policy, d.max_prefill_tokens) == (policy, cap)
    pytest.importorskip("aiconfigurator_core")
    rows = load_rows()
    r = rows[(rows["model"] == "Qwen3-32B") & (rows["mode"] == "agg")].iloc[0].copy()
    r["system"], r["backend"] = "h200_sxm", backend
    s = row_study(pd.Series(r)).scheduler
    assert (s.batch_policy, s.max_prefill_tokens) == (policy, cap)


def test_frontend_latency_per_engine_and_none_for_an_unknown_one() -> None:
    assert set(FRONTEND_LATENCY_S) == {"vllm", "sglang", "trtllm"}
    assert all(0.0 < v < 0.5 for v in FRONTEND_LATENCY_S.values())
    assert frontend_latency_s("vllm") == FRONTEND_LATENCY_S["vllm"] > 0 and frontend_latency_s("tgi") == 0.0
    # SGLang's lock step and prefill-first batches leave more of its first token outside the engine.
    assert frontend_latency_s("sglang") > frontend_latency_s("trtllm") > frontend_latency_s("vllm")


def test_frontend_latency_grows_with_the_prompt_for_vllm_and_trtllm_and_not_for_sglang() -> None:
    # intercept + rate x prompt tokens (vLLM, TensorRT-LLM); SGLang's constant whatever the prompt.
    assert frontend_latency_s("vllm", 1024) == pytest.approx(0.015 + 2.0e-6 * 1024)   # ~17 ms
    assert frontend_latency_s("trtllm", 8192) == pytest.approx(0.045 + 1.5e-6 * 8192)  # ~57 ms
    assert frontend_latency_s("sglang", 1024) == frontend_latency_s("sglang", 16384) == FRONTEND_LATENCY_S["sglang"]
    assert set(FRONTEND_S_PER_PROMPT_TOKEN) == {"vllm", "trtllm"}
    for backend in ("vllm", "trtllm"):
        lats = [frontend_latency_s(backend, isl) for isl in (0, 128, 1024, 4096, 8192, 32768)]
        assert all(a < b for a, b in zip(lats, lats[1:])) and lats[0] == FRONTEND_LATENCY_S[backend] > 0
    assert frontend_latency_s("tgi", 1024) == 0.0


def test_aic_rows_get_their_engines_serving_terms_and_kernel_only_without_them(monkeypatch) -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic.cost_model import SERVING_TERMS, ServingTerms
    from twinserve.sim import validate_rows
    rows = load_rows()
    r = rows[(rows["model"] == "Qwen3-32B") & (rows["mode"] == "agg")].iloc[0].copy()
    r["system"] = "h200_sxm"
    for backend in ("vllm", "sglang", "trtllm"):
        r["backend"] = backend
        e = row_study(pd.Series(r), "aic").engine
        t = SERVING_TERMS[backend]
        assert (e.aic_kernel_scale, e.step_overhead_s, e.per_seq_overhead_s) == (t.kernel_scale, t.step_s,
                                                                                 t.per_seq_s)
    assert SERVING_TERMS["vllm"].kernel_scale > 1 and SERVING_TERMS["sglang"].step_s > 0
    r["backend"] = "vllm"
    assert row_study(pd.Series(r)).engine.step_overhead_s < 0  # the roofline takes its profile's own
    assert row_study(pd.Series(r)).engine.aic_kernel_scale == 1.0
    monkeypatch.setattr(validate_rows, "aic_serving_terms", lambda backend: ServingTerms())
    e = row_study(pd.Series(r), "aic").engine
    assert (e.aic_kernel_scale, e.step_overhead_s, e.per_seq_overhead_s) == (1.0, 0.0, 0.0)


@pytest.mark.parametrize("backend, policy", [
    # TensorRT-LLM's LLM API SchedulerConfig.capacity_scheduler_policy: GUARANTEED_NO_EVICT by default (a
    # request waits until its whole KV need fits; nothing is preempted); vLLM and SGLang admit on demand.
    ("trtllm", "guaranteed_no_evict"), ("vllm", "on_demand"), ("sglang", "on_demand"),
])
def test_a_rows_study_gets_its_engines_capacity_policy(backend: str, policy: str) -> None:
    assert engine_defaults(backend, 141 * GIB).capacity_policy == policy
    pytest.importorskip("aiconfigurator_core")
    rows = load_rows()
    r = rows[(rows["model"] == "Qwen3-32B") & (rows["mode"] == "agg")].iloc[0].copy()
    r["system"], r["backend"] = "h200_sxm", backend
    assert row_study(pd.Series(r)).scheduler.capacity_policy == policy


@pytest.mark.parametrize("backend, overlap", [
    # TensorRT-LLM's `disable_overlap_scheduler` is False by default (llmapi TorchLlmArgs): its executor loop
    # reads new requests a step ahead (core/sched/scheduler.py _fetched_late); vLLM's and SGLang's rows do not.
    ("trtllm", True), ("vllm", False), ("sglang", False),
])
def test_a_rows_study_gets_its_engines_overlap_scheduler(backend: str, overlap: bool) -> None:
    assert engine_defaults(backend, 141 * GIB).overlap_scheduler == overlap
    pytest.importorskip("aiconfigurator_core")
    rows = load_rows()
    r = rows[(rows["model"] == "Qwen3-32B") & (rows["mode"] == "agg")].iloc[0].copy()
    r["system"], r["backend"] = "h200_sxm", backend
    assert row_study(pd.Series(r)).scheduler.overlap_scheduler == overlap


def test_a_trtllm_disagg_rows_prefill_workers_run_without_the_overlap() -> None:
    # srt-slurm's TensorRT-LLM recipes: `disable_overlap_scheduler: true` on the context workers, false on the
    # generation workers (recipes/trtllm/b200-fp8/1k1k/mtp/ctx1_gen8_tp8_batch4_eplb0_mtp3_32.yaml @fe2cd90).
    pytest.importorskip("aiconfigurator_core")
    rows = load_rows()
    pick = rows[(rows["model"] == "DeepSeek-R1") & (rows["backend"] == "trtllm") & (rows["mode"] == "disagg")]
    cfg = row_study(pick.iloc[0], "aic")
    c = cfg.cluster
    assert cfg.scheduler.overlap_scheduler
    assert all(r["scheduler.overlap_scheduler"] is False for r in c.replicas[:c.num_prefill_replicas])
    assert all(r.get("scheduler.overlap_scheduler", True) for r in c.replicas[c.num_prefill_replicas:])
