"""InferenceX recipes (sim/validate_recipes.py): the flags a row's server ran with, set on its study."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim.validate_recipes import DEFAULT, kv_cache_dtype, row_recipe, sglang_stream_points

_IX = "source_file=2026-04-06.csv"  # an InferenceX export (sim/validate_protocol.harness)
_GAP = "source_file=/Users/x/aic-auto-gap-analysis/rows.csv"


def _row(**kw) -> pd.Series:
    base = dict(silicon_data_source=_IX, backend="sglang", model="DeepSeek-R1", system="b200_sxm",
                precision="fp8", mode="agg", isl=1024, osl=1024, concurrency=4, tp_size=8)
    base.update(kw)
    return pd.Series(base)


@pytest.mark.parametrize("kw, stream, recv, chunk, running", [
    # benchmarks/dsr1_fp8_b200.sh: TP 8, CONC >= 16 -> recv 30, else 10; stream 30; chunk 32768; 128 running.
    ({}, 30, 10, 32768, 128), ({"concurrency": 16}, 30, 30, 32768, 128),
    # its TP 4 branch: recv 10, chunk 8192, 32 running.
    ({"tp_size": 4, "isl": 8192, "concurrency": 64}, 30, 10, 8192, 32),
    # benchmarks/dsr1_fp4_b200.sh: stream 10, recv 10 / 30 by CONC, chunk 16384, 256 running.
    ({"precision": "fp4", "concurrency": 32}, 10, 30, 16384, 256),
    # benchmarks/dsr1_fp8_h200.sh: stream 10, no recv interval, chunk 32768, 512 running at 1k/1k.
    ({"system": "h200_sxm"}, 10, 1, 32768, 512), ({"system": "h200_sxm", "isl": 8192}, 10, 1, 32768, 256),
])
def test_a_known_recipe_gives_its_scripts_flags(kw, stream, recv, chunk, running) -> None:
    r = row_recipe(_row(**kw))
    assert "InferenceX benchmarks/" in r.source
    assert (r.stream_interval, r.recv_interval, r.chunked_prefill_size, r.max_running_requests) == (
        stream, recv, chunk, running)


@pytest.mark.parametrize("kw", [
    {"silicon_data_source": _GAP},  # aiconfigurator's own harness: no InferenceX recipe
    {"mode": "disagg"},  # disaggregated: the aggregated scripts do not apply
    {"model": "DeepSeek-V3"},  # no script found
    {"system": "gb200"},
    {"backend": "vllm"},
])
def test_an_unknown_recipe_falls_back_to_the_engine_defaults(kw) -> None:
    assert row_recipe(_row(**kw)) is DEFAULT
    assert (DEFAULT.stream_interval, DEFAULT.recv_interval, DEFAULT.chunked_prefill_size) == (1, 1, 0)


def test_a_rows_study_runs_with_its_recipe() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "sglang") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp8")
                & (rows["concurrency"] < 16) & (rows["tp_size"] == 8)]
    r = pick.iloc[0]
    s = row_study(r, "aic").scheduler
    assert (s.recv_interval, s.max_num_batched_tokens, s.max_prefill_tokens, s.max_num_seqs) == (10, 32768, 32768, 128)
    # The same row under aiconfigurator's harness: the engine's defaults (B200: 16,384-token chunks).
    g = r.copy()
    g["silicon_data_source"] = _GAP
    s = row_study(g, "aic").scheduler
    assert (s.recv_interval, s.max_num_batched_tokens, s.max_prefill_tokens) == (1, 16384, 16384)


@pytest.mark.parametrize("n, interval, points", [
    (25, 10, [1, 11, 21, 25]),  # the first token at once, then every 10, the last at the finish
    (3, 30, [1, 3]), (1, 30, [1]), (4, 1, [1, 2, 3, 4]),
])
def test_sglang_streams_the_first_and_last_token_at_once(n, interval, points) -> None:
    # scheduler_output_processor_mixin.stream_output_generation: % interval == 1 (interval > 1), finished always.
    assert sglang_stream_points(n, interval) == points


@pytest.mark.parametrize("kw, recv, running", [
    # aiconfigurator's 2026-04-27 InferenceX dump names the dsr1 configs' checkpoint deepseek-ai/DeepSeek-V3;
    # the id keeps InferenceX's model prefix (dsr1), whose launch scripts are benchmarks/dsr1_*.sh.
    ({"id": "dsr1_b200_sglang_fp8_agg_1024x1024_c4_cfg1"}, 10, 128),
    ({"id": "dsr1_b200_sglang_fp4_agg_1024x1024_c32_cfg1", "precision": "fp4", "concurrency": 32}, 30, 256),
    ({"id": "dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81", "system": "h200_sxm"}, 1, 512),
    # benchmarks/single_node/dsr1_fp{8,4}_b300.sh: the B200 recipes as-is (their header says so).
    ({"id": "dsr1_b300_sglang_fp8_agg_1024x1024_c16_cfg1", "system": "b300_sxm", "concurrency": 16}, 30, 128),
    ({"id": "dsr1_b300_sglang_fp8_agg_8192x256_c8_cfg1", "system": "b300_sxm", "tp_size": 4, "isl": 8192,
      "osl": 256, "concurrency": 8}, 10, 32),
    ({"id": "dsr1_b300_sglang_fp4_agg_1024x1024_c4_cfg1", "system": "b300_sxm", "precision": "fp4"}, 10, 256),
])
def test_an_inferencex_dsr1_config_runs_its_scripts_whatever_the_checkpoint_name(kw, recv, running) -> None:
    r = row_recipe(_row(model="DeepSeek-V3", silicon_data_source="db-dump/2026-04-27; config_id=1", **kw))
    assert "/dsr1_" in r.source and "benchmarks/" in r.source
    assert (r.recv_interval, r.max_running_requests) == (recv, running)


@pytest.mark.parametrize("kw", [
    {"id": "dsr1_gb200_sglang_fp8_agg_1024x1024_c4_cfg1", "system": "gb200"},  # no dsr1 script for GB200
    {"id": "glm5_b200_sglang_fp8_agg_1024x1024_c4_cfg1"},  # a prefix the table does not know
    {"id": "dsr1_b200_sglang_fp8_agg_1024x1024_c4_cfg1", "model": "Kimi-K2.5"},  # another architecture
])
def test_an_id_prefix_maps_only_its_own_models_configs(kw) -> None:
    base = {"model": "DeepSeek-V3", "silicon_data_source": "db-dump/2026-04-27; config_id=1"}
    base.update(kw)
    assert row_recipe(_row(**base)) is DEFAULT


@pytest.mark.parametrize("kw, mtp", [
    # nvidia-master.yaml: dsr1-fp{4,8}-b200-trt-mtp run from release:1.2.0rc6.post3; their scripts set
    # num_nextn_predict_layers 3, or 1 with attention DP.
    ({}, 3), ({"precision": "fp4"}, 3), ({"attention_dp_size": 8, "tp_size": 1}, 1),
    # dsr1-fp{4,8}-b200-trt (no speculation) run from release:1.2.0rc6.post2.
    ({"backend_version": "1.2.0rc6.post2"}, 0),
    # H200's MTP and non-MTP benchmarks share one image: not told apart up to 64 clients; past 64 only
    # dsr1-fp8-h200-trt-mtp runs (dsr1_fp8_h200_trt_mtp.sh: MTP 3, 1 with attention DP).
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2"}, 0),
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2", "concurrency": 64}, 0),
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2", "concurrency": 128}, 3),
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2", "concurrency": 256, "attention_dp_size": 8}, 1),
    ({"mode": "disagg"}, 0), ({"silicon_data_source": _GAP}, 0),
])
def test_tensorrt_llm_deepseek_rows_from_the_mtp_image_speculate(kw, mtp) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", "backend_version": "1.2.0rc6.post3", **kw}))
    assert r.mtp == mtp
    if mtp:
        assert "trt-mtp" in r.source


def test_mtp_acceptance_is_the_rate_of_inferencex_measured_length() -> None:
    from twinserve.sim.validate_recipes import (MTP_ACCEPTANCE, MTP_ACCEPTANCE_LENGTH, acceptance_length,
                                                conditional_rate)
    # InferenceX PR #649: ~2.50 tokens a step with the chat template at 3 drafts; one rate at every position.
    assert MTP_ACCEPTANCE_LENGTH == 2.50
    assert MTP_ACCEPTANCE == pytest.approx(0.6914, abs=1e-4)
    assert acceptance_length(MTP_ACCEPTANCE, 3) == pytest.approx(2.50)
    assert acceptance_length(0.85, 3) == pytest.approx(1 + 0.85 + 0.85 ** 2 + 0.85 ** 3)
    assert conditional_rate(2.0, 1) == pytest.approx(1.0) and conditional_rate(1.0, 3) == pytest.approx(0.0)
    assert conditional_rate(3.55, 3) == pytest.approx(0.92, abs=0.01)  # the figure without the chat template
    with pytest.raises(ValueError, match="cannot come from 1 drafts"):
        conditional_rate(2.5, 1)


def test_an_mtp_rows_study_drafts_with_the_models_own_layer() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_recipes import MTP_ACCEPTANCE
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["backend_version"] == "1.2.0rc6.post3")
                & (rows["attention_dp_size"] == 1)]
    spec = row_study(pick.iloc[0], "aic").speculative
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft_model", "mtp", 3)
    assert spec.acceptance_rates == [MTP_ACCEPTANCE] * 3
    # Tokens a verify step on InferenceX's chat-templated random prompts: 2.50 at 3 drafts (InferenceX PR #649),
    # not the 3.19 the DeepSeek-V3 report's natural-text 0.85 gives.
    tokens, reach = 1.0, 1.0
    for rate in spec.acceptance_rates:
        reach *= rate
        tokens += reach
    assert tokens == pytest.approx(2.50, abs=0.005)
    other = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                 & (rows["backend_version"] == "1.2.0rc6.post2")]
    assert not row_study(other.iloc[0], "aic").speculative.enabled


@pytest.mark.parametrize("kw, budget, iters, ratio", [
    # benchmarks/70b_fp8_b200_trt_slurm.sh: --max_num_tokens 16384; 1k/1k at TP < 8: wait 20 iterations, 0.9.
    ({"tp_size": 2}, 16384, 20, 0.9),
    ({"tp_size": 8}, 16384, 0, 0.0),  # TP 8: no wait
    ({"tp_size": 2, "isl": 8192}, 16384, 0, 0.0),  # 8k/1k: no wait
    # benchmarks/70b_fp4_b200_trt_docker.sh (the B200 docker runner's): the same flags.
    ({"precision": "fp4", "tp_size": 1}, 16384, 20, 0.9),
    # benchmarks/70b_fp8_h200_trt_slurm.sh: --max_num_tokens $MAX_MODEL_LEN (ISL + OSL + 200).
    ({"system": "h200_sxm", "tp_size": 4}, 2248, 20, 0.9),
    ({"system": "h200_sxm", "tp_size": 8, "isl": 8192}, 9416, 0, 0.0),
])
def test_tensorrt_llm_llama70b_rows_run_their_scripts_batch_wait_and_budget(kw, budget, iters, ratio) -> None:
    r = row_recipe(_row(backend="trtllm", model="Llama-3.1-70B", **kw))
    assert "InferenceX benchmarks/70b_fp" in r.source
    assert (r.max_num_tokens, r.batch_wait_iters, r.batch_wait_ratio) == (budget, iters, ratio)


def test_a_tensorrt_llm_llama70b_rows_study_waits_and_prefills_whole_prompts() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "Llama-3.1-70B") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["isl"] == 1024) & (rows["osl"] == 1024)
                & (rows["tp_size"] == 1)]
    s = row_study(pick.iloc[0], "aic").scheduler
    assert (s.batch_wait_iters, s.batch_wait_tokens_ratio, s.max_num_batched_tokens, s.enable_chunked_prefill,
            s.max_model_len) == (20, 0.9, 16384, False, 2248)


@pytest.mark.parametrize("kw, fraction", [
    # SGLang --mem-fraction-static: dsr1_fp8_b200.sh @1fc5d73 TP 8 0.82, its TP 4 branch 0.95;
    # dsr1_fp4_b200.sh @1fc5d73 0.85; dsr1_fp8_h200.sh @1fc5d73 0.82 (both ISL/OSL branches).
    ({}, 0.82), ({"tp_size": 4, "isl": 8192}, 0.95), ({"precision": "fp4"}, 0.85),
    ({"system": "h200_sxm"}, 0.82), ({"system": "h200_sxm", "isl": 8192}, 0.82),
    # B300 reuses the B200 scripts as-is.
    ({"system": "b300_sxm", "tp_size": 4, "isl": 8192}, 0.95),
    # TensorRT-LLM kv_cache_config.free_gpu_memory_fraction: single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788 (PR #632)
    # and dsr1_fp4_b200_trt_mtp.sh @13dd0c2 0.8 without attention DP; dsr1_fp8_h200_trt_mtp.sh @1fc5d73 0.75.
    ({"backend": "trtllm", "backend_version": "1.2.0rc6.post3"}, 0.8),
    ({"backend": "trtllm", "backend_version": "1.2.0rc6.post3", "precision": "fp4"}, 0.8),
    ({"backend": "trtllm", "backend_version": "1.1.0rc2.post2", "system": "h200_sxm", "concurrency": 128}, 0.75),
    # dsr1_fp8_b200_trt.sh @0a919c5 (image 1.2.0rc6.post2): 0.8.
    ({"backend": "trtllm", "backend_version": "1.2.0rc6.post2"}, 0.8),
    # no recipe: the engine's default stands
    ({"silicon_data_source": _GAP}, 0.0),
    ({"backend": "trtllm", "backend_version": "1.2.0rc6.post2", "precision": "fp4"}, 0.0),
])
def test_a_recipe_carries_its_scripts_memory_share(kw, fraction) -> None:
    assert row_recipe(_row(**kw)).mem_fraction == fraction


def test_a_rows_study_sizes_its_kv_pool_with_the_scripts_memory_share() -> None:
    # dsr1_fp8_b200.sh's TP 4 branch (ISL 8192 / OSL 1024, 32 running requests) gives SGLang 0.95 of each
    # GPU: DeepSeek-R1's FP8 weights take 156.7 of B200's 179.1 GiB at TP 4, so the engine default (0.9)
    # leaves a pool of ~74k tokens, under a quarter of what 32 clients of 9,216 tokens hold.
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_cost_models, engine_capacity
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "sglang") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp8") & (rows["tp_size"] == 4)
                & (rows["concurrency"] == 32) & (rows["silicon_data_source"].str.contains("2026-04-06"))]
    cfg = row_study(pick.iloc[0], "aic")
    assert cfg.engine.gpu_memory_utilization == 0.95
    model, hw, _, _ = build_cost_models(cfg)
    tokens = engine_capacity(cfg, model, hw).num_blocks * cfg.scheduler.block_size
    assert tokens >= 32 * (8192 + 1024)
    # A TensorRT-LLM MTP row takes its script's share of the memory left after the weights (basis "free").
    mtp = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
               & (rows["system"] == "b200_sxm") & (rows["backend_version"] == "1.2.0rc6.post3")]
    e = row_study(mtp.iloc[0], "aic").engine
    assert (e.gpu_memory_utilization, e.kv_memory_basis) == (0.8, "free")


@pytest.mark.parametrize("kw, iters", [
    # attention_dp_config {enable_balance: true, timeout_iters: 60, batching_wait_iters: 0} in every DeepSeek-R1
    # TensorRT-LLM script (written when DP_ATTENTION is true; the balance acts only with attention DP):
    ({"backend_version": "1.2.0rc6.post3"}, 60),  # single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788
    ({"backend_version": "1.2.0rc6.post2"}, 60),  # dsr1_fp8_b200_trt.sh @6320e9b
    ({"backend_version": "1.2.0rc6.post2", "precision": "fp4"}, 60),  # dsr1_fp4_b200_trt.sh @6320e9b
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2"}, 60),  # dsr1_fp8_h200_trt.sh @1fc5d73
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2", "concurrency": 128}, 60),  # ..._trt_mtp.sh
    ({"system": "gb200"}, 0), ({"mode": "disagg"}, 0), ({"silicon_data_source": _GAP}, 0),
    ({"model": "Llama-3.1-70B"}, 0),
])
def test_tensorrt_llm_deepseek_rows_run_their_scripts_attention_dp_balance(kw, iters) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", **kw}))
    assert (r.adp_balance_iters, r.adp_batching_wait_iters) == (iters, 0)


def test_an_attention_dp_rows_engine_balances_its_ranks_prompts() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.core.sched.batch_policy import AdpBalance
    from twinserve.sim.build import build_engine
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (pd.to_numeric(rows["attention_dp_size"], errors="coerce") == 8)
                & (pd.to_numeric(rows["concurrency"], errors="coerce") <= 128)]
    cfg = row_study(pick.iloc[0], "roofline")
    assert (cfg.engine.data_parallel_size, cfg.scheduler.adp_balance_iters) == (8, 60)
    policy = build_engine(cfg).core.scheduler.batch_policy
    assert isinstance(policy, AdpBalance) and (policy.ranks, policy.timeout_iters) == (8, 60)
    # Without attention DP the same recipe leaves the mixed policy alone (the scripts' DP_ATTENTION condition).
    tp = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
              & (rows["system"] == "b200_sxm") & (rows["backend_version"] == "1.2.0rc6.post2")
              & (pd.to_numeric(rows["attention_dp_size"], errors="coerce").fillna(1) <= 1)]
    cfg = row_study(tp.iloc[0], "roofline")
    assert cfg.engine.data_parallel_size == 1 and cfg.scheduler.adp_balance_iters == 60
    assert not isinstance(build_engine(cfg).core.scheduler.batch_policy, AdpBalance)


# The K/V dtype each InferenceX launch ran (validate_recipes.kv_cache_dtype): "auto" (the checkpoint's bf16) where
# the launch passes no K/V dtype, or TensorRT-LLM's `dtype: auto`, on a checkpoint with no FP8 KV entry; None
# (precision_fields' FP8) where it passes fp8 or the checkpoint declares FP8 K/V.
@pytest.mark.parametrize("kw, kv", [
    ({"system": "h200_sxm"}, "auto"),  # benchmarks/dsr1_fp8_h200.sh: no --kv-cache-dtype
    ({"system": "h200_sxm", "mode": "disagg"}, "auto"),  # srt-slurm recipes/h200/8k1k/bs64-2p3d.yaml
    ({"system": "h100_sxm", "mode": "disagg"}, "auto"),  # srt-slurm recipes/h100/.../h100-fp8-2p4d-max-tp.yaml
    ({"system": "h200_sxm", "model": "DeepSeek-V3", "id": "dsr1_h200_sglang_fp8_agg_1k1k"}, "auto"),  # a dsr1 run
    ({}, None),  # B200: dsr1_fp8_b200.sh passes fp8_e4m3, what precision_fields gives
    ({"precision": "fp4"}, None),  # dsr1_fp4_b200.sh passes fp8_e4m3
    ({"system": "gb200", "mode": "disagg"}, None),  # srt-slurm gb200-fp8 recipes: fp8_e4m3
    ({"system": "h200_sxm", "backend": "trtllm"}, None),  # dsr1_fp8_h200_trt.sh: kv_cache_config dtype fp8
    ({"system": "h200_sxm", "backend": "trtllm", "mode": "disagg"}, None),  # srt-slurm trtllm/h200: dtype fp8
    ({"system": "h200_sxm", "silicon_data_source": _GAP}, None),  # not an InferenceX launch
    ({"system": "h200_sxm", "model": "Qwen3-32B"}, None),  # no launch read
    # gpt-oss-120b: vLLM on Hopper passes no kv-cache-dtype (gptoss_fp4_h200.sh, gptoss_fp4_h100.sh), B200 fp8
    # (gptoss_fp4_b200.sh config.yaml); TensorRT-LLM H200 `dtype: auto` (gptoss_fp4_h200_trt.sh), B200 and the
    # GB200 Dynamo recipes `dtype: fp8`. The checkpoint (MXFP4 experts) declares no KV quantization.
    ({"backend": "vllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "h200_sxm"}, "auto"),
    ({"backend": "vllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "h100_sxm"}, "auto"),
    ({"backend": "vllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "b200_sxm"}, None),
    ({"backend": "trtllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "h200_sxm"}, "auto"),
    ({"backend": "trtllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "b200_sxm"}, None),
    ({"backend": "trtllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "gb200", "mode": "disagg"}, None),
    ({"backend": "vllm", "model": "gpt-oss-120b", "precision": "fp4", "system": "h200_sxm",
      "silicon_data_source": _GAP}, None),
    # Llama-3.1-70B: every vLLM script's config.yaml and TensorRT-LLM script sets fp8.
    ({"backend": "vllm", "model": "Llama-3.1-70B", "system": "h100_sxm"}, None),
    ({"backend": "trtllm", "model": "Llama-3.1-70B", "system": "h200_sxm"}, None),
    # GLM-5 FP8 on H200 (glm5_fp8_h200.sh: no flag; GLM-5-FP8 declares no KV quantization); B200 passes fp8_e4m3.
    ({"model": "GLM-5", "system": "h200_sxm"}, "auto"), ({"model": "GLM-5"}, None),
    # MiniMax-M2.5 FP8 on H100 (minimaxm2.5_fp8_h100.sh: no flag). H200: every version before InferenceX#1354
    # (2026-05-12, after every row) passes none either (the launch audit; the first K/V audit read @0949de5, #1354's).
    ({"backend": "vllm", "model": "MiniMax-M2.5", "system": "h100_sxm"}, "auto"),
    ({"backend": "vllm", "model": "MiniMax-M2.5", "system": "h200_sxm"}, "auto"),
    # B200 FP8: the v0.17.0 image's launches (@07e171a / @13453b4) pass none; the other images are not told.
    ({"backend": "vllm", "model": "MiniMax-M2.5", "backend_version": "0.17.0"}, "auto"),
    ({"backend": "vllm", "model": "MiniMax-M2.5", "backend_version": "0.19.0"}, None),
    # Qwen3.5 FP8 passes fp8_e4m3 on H200 / B200 / B300; its BF16 launches no flag, what precision_fields gives.
    ({"model": "Qwen3.5-397B-A17B", "system": "h200_sxm"}, None),
    ({"model": "Qwen3.5-397B-A17B", "precision": "bf16"}, None),
])
def test_each_inferencex_launch_gets_the_kv_dtype_it_ran(kw, kv) -> None:
    assert kv_cache_dtype(_row(**kw)) == kv


def test_an_sglang_hopper_rows_study_stores_bf16_kv_and_holds_half_the_tokens() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_cost_models, engine_capacity
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "sglang") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "h200_sxm") & (rows["precision"] == "fp8")
                & rows["silicon_data_source"].str.startswith("source_file=2026-")]
    cfg = row_study(pick.iloc[0], "aic")
    assert cfg.engine.kv_cache_dtype == "auto"
    model, hw, _, _ = build_cost_models(cfg)
    assert model.kv_bytes_per_token_per_gpu(8) == 61 * 576 * 2  # MLA's latent + rope key, 2 bytes a value
    bf16 = engine_capacity(cfg, model, hw).num_blocks
    cfg.engine.kv_cache_dtype = "fp8"
    model8, _, _, _ = build_cost_models(cfg)
    assert engine_capacity(cfg, model8, hw).num_blocks >= 2 * bf16 - 1


def test_a_gpt_oss_hopper_vllm_rows_study_stores_bf16_kv() -> None:
    # gptoss_fp4_h200.sh passes no kv-cache-dtype: vLLM's auto keeps the checkpoint's bf16 K/V, 2 bytes a value
    # of gpt-oss-120b's 8 KV heads x 64 dims, K and V, over its 36 layers.
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_cost_models
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "vllm") & (rows["model"] == "gpt-oss-120b") & (rows["system"] == "h200_sxm")]
    row = next(r for _, r in pick.iterrows() if harness(r) == INFERENCEX)
    cfg = row_study(row, "aic")
    assert cfg.engine.kv_cache_dtype == "auto"
    model, _, _, _ = build_cost_models(cfg)
    assert model.kv_bytes_per_token_per_gpu(1) == 36 * 2 * 8 * 64 * 2
    cfg.engine.kv_cache_dtype = "fp8"
    assert build_cost_models(cfg)[0].kv_bytes_per_token_per_gpu(1) == 36 * 2 * 8 * 64


@pytest.mark.parametrize("kw, kernel", [
    # gptoss_fp4_h200.sh @16cd955 and gptoss_fp4_h100.sh @1fc5d73: `export VLLM_MXFP4_USE_MARLIN=1`.
    ({"system": "h200_sxm"}, "marlin"), ({"system": "h100_sxm", "tp_size": 2}, "marlin"),
    ({"system": "b200_sxm"}, ""),  # no such script read for B200: vLLM's default kernel there
    ({"system": "h200_sxm", "silicon_data_source": _GAP}, ""),
    ({"system": "h200_sxm", "backend": "trtllm"}, ""),
])
def test_gpt_oss_vllm_hopper_rows_run_their_experts_on_marlin(kw, kernel) -> None:
    r = row_recipe(_row(**{"backend": "vllm", "model": "gpt-oss-120b", "precision": "fp4", **kw}))
    assert r.mxfp4_moe_kernel == kernel


def test_a_gpt_oss_hopper_rows_study_prices_marlin_under_aic_only() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    pick = rows[(rows["backend"] == "vllm") & (rows["model"] == "gpt-oss-120b") & (rows["mode"] == "agg")
                & (rows["system"] == "h200_sxm")]
    r = next(row for _, row in pick.iterrows() if harness(row) == INFERENCEX)
    assert row_recipe(r).mxfp4_moe_kernel == "marlin"
    assert row_study(r, "aic").engine.aic_mxfp4_moe_kernel == "marlin"
    assert row_study(r, "roofline").engine.aic_mxfp4_moe_kernel == "default"


@pytest.mark.parametrize("kw, kernel, wait, mem", [
    # benchmarks/dsr1_fp8_b200_trt.sh @0a919c5 (image 1.2.0rc6.post2, nvidia-master.yaml @0a919c5):
    # MOE_BACKEND TRTLLM below 256 clients; batch wait 40 / 0.8 at 1k/1k from 64 clients; memory 0.8.
    ({}, "trtllm", (0, 0.0), 0.8),
    ({"concurrency": 64}, "trtllm", (40, 0.8), 0.8),
    ({"osl": 8192, "concurrency": 64}, "trtllm", (0, 0.0), 0.8),
    ({"osl": 8192, "concurrency": 256}, "", (0, 0.0), 0.7),  # DEEPGEMM there: aic's own table
    ({"isl": 8192, "tp_size": 4, "concurrency": 16}, "trtllm", (0, 0.0), 0.75),
])
def test_b200_fp8_trt_rc6_post2_rows_run_their_scripts_trtllm_experts(kw, kernel, wait, mem) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", "backend_version": "1.2.0rc6.post2", **kw}))
    assert "dsr1_fp8_b200_trt.sh @0a919c5" in r.source
    assert (r.fp8_moe_kernel, (r.batch_wait_iters, r.batch_wait_ratio), r.mem_fraction) == (kernel, wait, mem)
    assert r.mtp == 0 and r.adp_balance_iters == 60


@pytest.mark.parametrize("kw", [
    {"precision": "fp4"},  # dsr1-fp4-b200-trt: another script, its experts NVFP4
    {"backend_version": "1.1.0rc2.post2"},  # InferenceMAX's image of the DEEPGEMM script (@6320e9b)
    # the MTP image under attention DP: PR #632's script runs DEEPGEMM there (aic's own table)
    {"backend_version": "1.2.0rc6.post3", "tp_size": 1, "attention_dp_size": 8},
    # dsr1_fp4_b200_trt_mtp.sh @13dd0c2 under attention DP: MOE_BACKEND CUTLASS (aic's own NVFP4 table)
    {"backend_version": "1.2.0rc6.post3", "precision": "fp4", "tp_size": 1, "attention_dp_size": 8},
])
def test_other_b200_trt_images_keep_aics_fp8_expert_table(kw) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", "backend_version": "1.2.0rc6.post2", **kw}))
    assert r.fp8_moe_kernel == ""


@pytest.mark.parametrize("kw, kernel, mtp, mem", [
    # dsr1-fp8-b200-trt-mtp from release:1.2.0rc6.post3 ran the script of InferenceX PR #632 (single_node/
    # dsr1_fp8_b200_trt_mtp.sh @2f3a788): TRTLLM experts, MTP 3, memory 0.8; DEEPGEMM, MTP 1, 0.7 under DP.
    ({}, "trtllm", 3, 0.8),
    ({"osl": 8192, "concurrency": 64}, "trtllm", 3, 0.8),
    ({"isl": 8192, "concurrency": 128}, "trtllm", 3, 0.8),
    ({"osl": 8192, "concurrency": 32, "tp_size": 1, "attention_dp_size": 8}, "", 1, 0.7),
])
def test_b200_fp8_trt_mtp_rows_run_pr632s_script_trtllm_experts(kw, kernel, mtp, mem) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", "backend_version": "1.2.0rc6.post3", **kw}))
    assert "#632" in r.source and "dsr1-fp8-b200-trt-mtp" in r.source
    assert (r.fp8_moe_kernel, r.mtp, r.mem_fraction, r.stream_interval, r.adp_balance_iters) == (
        kernel, mtp, mem, 10, 60)


def test_a_b200_fp8_trt_mtp_step_prices_its_experts_on_aics_trtllm_gen_rows() -> None:
    # An aggregated B200 FP8 MTP row (1k/8k, TP 8, 4 clients, image 1.2.0rc6.post3): its study drafts 3 and its
    # experts are TRTLLM's; a decode step of the 4 clients verifies 16 rows. The step's price moves from aic's
    # TensorRT-LLM DeepGEMM rows to its SGLang 0.5.14 flashinfer-trtllm rows of the same op, read here from the
    # tables themselves (DeepSeek-R1's experts, MoE TP 8 / EP 1, power law 1.01, 16 tokens): 58 MoE layers x
    # the difference.
    pytest.importorskip("aiconfigurator_core")
    import dataclasses
    from pathlib import Path

    import aiconfigurator_core

    from twinserve.sim.build import build_cost_models
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp8")
                & (rows["backend_version"] == "1.2.0rc6.post3") & (rows["isl"] == 1024) & (rows["osl"] == 8192)
                & (rows["concurrency"] == 4) & (rows["tp_size"] == 8)]
    cfg = row_study(pick.iloc[0], "aic")
    assert cfg.engine.aic_fp8_moe_kernel == "trtllm"
    assert cfg.speculative.num_speculative_tokens == 3
    own = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, aic_fp8_moe_kernel="default"))
    gen, dg = build_cost_models(cfg)[3], build_cost_models(own)[3]

    def table(rel: str, source: str) -> float:
        d = pd.read_parquet(Path(aiconfigurator_core.__file__).parent / "systems/data/b200_sxm/moe" / rel)
        d = d[(d.kernel_source == source) & (d.moe_dtype == "fp8_block") & (d.hidden_size == 7168)
              & (d.inter_size == 2048) & (d.topk == 8) & (d.num_experts == 256) & (d.moe_tp_size == 8)
              & (d.moe_ep_size == 1) & (d.distribution == "power_law_1.01") & (d.num_tokens == 16)]
        (ms,) = d.latency
        return float(ms)
    trtgen = table("sglang/0.5.14/moe_perf.parquet", "sglang_flashinfer_trtllm_moe")
    deepgemm = table("trtllm/1.3.0rc20/moe_perf.parquet", "deepgemm")
    assert deepgemm > 2 * trtgen  # 0.220 against 0.102 ms a layer
    rows_ = 4 * (1 + 3)
    assert gen.decode_tokens_time(rows_) - dg.decode_tokens_time(rows_) == pytest.approx(
        58 * (trtgen - deepgemm) * 1e-3, rel=1e-3)


def test_a_b200_fp8_trt_rc6_rows_study_prices_trtllm_experts_under_aic_only() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp8")
                & (rows["backend_version"] == "1.2.0rc6.post2")]
    r = pick.iloc[0]
    assert row_study(r, "aic").engine.aic_fp8_moe_kernel == "trtllm"
    assert row_study(r, "roofline").engine.aic_fp8_moe_kernel == "default"


@pytest.mark.parametrize("isl, osl, conc, tp, ep, adp, mtp", [
    # dsr1-fp4-b200-trt and -mtp from release:1.1.0rc2.post2 (nvidia-master.yaml @0a919c5, InferenceMAX @525079a):
    (1024, 1024, 16, 4, 4, 1, True),    # TP 4 EP 4: plain from 64, MTP 16-64
    (1024, 1024, 64, 4, 4, 1, None),    # both
    (1024, 1024, 32, 4, 1, 1, False),   # TP 4 EP 1: plain 4-32, MTP 4-8
    (1024, 1024, 8, 8, 1, 1, None),     # TP 8 EP 1 at 4-8: both
    (1024, 8192, 8, 8, 8, 1, True),     # TP 8 EP 8: plain from 32, MTP 8-64
    (1024, 8192, 16, 8, 1, 1, False),   # TP 8 EP 1: plain 4-16, MTP at 4 only
    (1024, 8192, 128, 1, 4, 4, True),   # attention DP 4: plain at 256 only, MTP 128-256
    (8192, 1024, 32, 1, 8, 8, True),    # attention DP 8: plain from 64, MTP from 32
    (8192, 1024, 8, 4, 4, 1, False),    # TP 4 EP 4 without DP: plain only
])
def test_fp4_b200_rc2_rows_are_told_by_the_layouts_only_one_config_ran(isl, osl, conc, tp, ep, adp, mtp) -> None:
    from twinserve.sim.validate_recipes import fp4_b200_rc2_runs_mtp
    assert fp4_b200_rc2_runs_mtp(isl, osl, conc, tp, ep, adp) is mtp


def test_an_fp4_b200_rc2_row_only_the_mtp_config_ran_drafts() -> None:
    base = {"backend": "trtllm", "precision": "fp4", "backend_version": "1.1.0rc2.post2", "osl": 8192,
            "mode": "agg", "pp_size": 1}
    r = row_recipe(_row(**base, concurrency=8, tp_size=8, attention_dp_size=1, moe_tp_size=1, moe_ep_size=8))
    assert r.mtp == 3 and "dsr1_fp4_b200_trt_mtp.sh @13dd0c2" in r.source
    r = row_recipe(_row(**base, concurrency=16, tp_size=8, attention_dp_size=1, moe_tp_size=8, moe_ep_size=1))
    assert r.mtp == 0 and "dsr1_fp4_b200_trt.sh @6320e9b" in r.source


# The B200 1.1.0rc2.post2 sweeps: the MTP configurations' rows were measured 2026-01-14, the plain ones' 2025-12-15
# (sim/validate_recipes.py RC2_MTP_SWEEPS).
_MTP_DAY = _IX + "; measured=2026-01-14T00:00:00.000Z"
_PLAIN_DAY = _IX + "; measured=2025-12-15T00:00:00.000Z"


@pytest.mark.parametrize("isl, osl, conc, tp, ep, adp, measured, mtp", [
    # dsr1-fp8-b200-trt and -mtp from release:1.1.0rc2.post2 (InferenceMAX nvidia-master.yaml @525079a), EP = TP 8:
    (1024, 1024, 4, 8, 8, 1, "", None),              # both spaces, no date
    (1024, 1024, 4, 8, 8, 1, "2026-01-14", True),    # both spaces, the MTP sweep's day
    (1024, 1024, 4, 8, 8, 1, "2025-12-15", None),    # both spaces, another day
    (1024, 1024, 128, 1, 8, 8, "", True),            # attention DP 8 at 128: the MTP space only
    (8192, 1024, 64, 8, 8, 1, "2026-01-14", False),  # TP 8 EP 8 at 64: the plain space only
    (1024, 1024, 64, 1, 8, 8, "2026-01-14", True),   # attention DP 8 at 64: both
    (1024, 8192, 64, 8, 1, 1, "2026-01-14", None),   # EP 1: neither space
])
def test_fp8_b200_rc2_rows_are_told_by_layout_and_by_the_mtp_sweeps_day(isl, osl, conc, tp, ep, adp, measured,
                                                                         mtp) -> None:
    from twinserve.sim.validate_recipes import fp8_b200_rc2_runs_mtp
    assert fp8_b200_rc2_runs_mtp(isl, osl, conc, tp, ep, adp, measured) is mtp


def test_an_fp8_b200_rc2_row_of_the_mtp_sweep_drafts_on_deepgemm() -> None:
    # The dump's folded layout (tp_size 64 = moe_tp 8 x moe_ep 8: TP 8 EP 8), 1k/1k at 4 clients.
    base = {"backend": "trtllm", "precision": "fp8", "backend_version": "1.1.0rc2.post2", "mode": "agg",
            "pp_size": 1, "tp_size": 64, "attention_dp_size": 1, "moe_tp_size": 8, "moe_ep_size": 8}
    r = row_recipe(_row(**base, silicon_data_source=_MTP_DAY))
    assert r.mtp == 3 and r.fp8_moe_kernel == "" and "dsr1_fp8_b200_trt_mtp.sh @7506aee" in r.source
    assert r.max_num_tokens == 1152  # ((3 + 1) x 4 + 1024 + 64 + 63) // 64 x 64
    r = row_recipe(_row(**base, silicon_data_source=_PLAIN_DAY))
    assert r.mtp == 0 and "dsr1_fp{4,8}_b200_trt.sh @6320e9b" in r.source
    # attention DP 8 (tp_size 1, attention_dp_size 64 folded) at 128 clients: only the MTP space, MTP 1, a rank's budget
    r = row_recipe(_row(**{**base, "tp_size": 1, "attention_dp_size": 64}, concurrency=128))
    assert r.mtp == 1 and r.mtp_rank_budget and r.fp8_moe_kernel == ""


def test_an_fp4_b200_rc2_row_both_configs_hold_drafts_on_the_mtp_sweeps_day() -> None:
    # 1k/1k TP 4 EP 4 at 64 clients: plain from 64, MTP 16-64 (both spaces).
    base = {"backend": "trtllm", "precision": "fp4", "backend_version": "1.1.0rc2.post2", "mode": "agg",
            "pp_size": 1, "concurrency": 64, "tp_size": 4, "attention_dp_size": 1, "moe_tp_size": 1,
            "moe_ep_size": 4}
    assert row_recipe(_row(**base, silicon_data_source=_MTP_DAY)).mtp == 3
    assert row_recipe(_row(**base, silicon_data_source=_PLAIN_DAY)).mtp == 0


@pytest.mark.parametrize("isl, osl, conc, tp, ep, adp, measured, mtp", [
    # dsr1-fp8-h200-trt and -mtp from release:1.1.0rc2.post2 (InferenceMAX nvidia-master.yaml @525079a), EP = TP 8;
    # the MTP space holds every plain point, so the day tells (RC2_MTP_SWEEPS):
    (1024, 8192, 4, 8, 8, 1, "2026-01-14", True),    # both spaces, the MTP sweep's day
    (1024, 1024, 64, 8, 8, 1, "2026-01-14", True),
    (8192, 1024, 64, 1, 8, 8, "2026-01-14", True),   # attention DP 8 at 64: both spaces
    (1024, 1024, 4, 8, 8, 1, "2025-12-15", None),    # the plain sweep's day
    (1024, 8192, 64, 8, 8, 1, "2026-01-28", None),   # another day
    (1024, 8192, 16, 8, 8, 1, "", None),             # no date
    (1024, 8192, 128, 8, 8, 1, "", True),            # TP 8 EP 8 at 128: the MTP space only
    (8192, 1024, 64, 8, 8, 1, "2026-01-14", None),   # TP 8 EP 8 at 8k/1k 64: neither space
    (1024, 1024, 16, 8, 1, 1, "2026-01-14", None),   # EP 1: neither space
])
def test_fp8_h200_rc2_rows_are_told_by_the_mtp_sweeps_day(isl, osl, conc, tp, ep, adp, measured, mtp) -> None:
    from twinserve.sim.validate_recipes import fp8_h200_rc2_runs_mtp
    assert fp8_h200_rc2_runs_mtp(isl, osl, conc, tp, ep, adp, measured) is mtp


def test_an_fp8_h200_rc2_row_of_the_mtp_sweep_drafts_with_the_mtp_scripts_budget() -> None:
    # The dump's folded TP 8 EP 8 (tp_size 64 = moe_tp 8 x moe_ep 8), 1k/8k at 16 clients.
    base = {"backend": "trtllm", "precision": "fp8", "backend_version": "1.1.0rc2.post2", "mode": "agg",
            "system": "h200_sxm", "osl": 8192, "concurrency": 16, "pp_size": 1, "tp_size": 64,
            "attention_dp_size": 1, "moe_tp_size": 8, "moe_ep_size": 8}
    r = row_recipe(_row(**base, silicon_data_source=_MTP_DAY))
    assert r.mtp == 3 and r.mem_fraction == 0.75 and "dsr1_fp8_h200_trt_mtp.sh @1fc5d73" in r.source
    assert r.max_num_tokens == 1152  # ((3 + 1) x 16 + 1024 + 64 + 63) // 64 x 64
    r = row_recipe(_row(**base, silicon_data_source=_PLAIN_DAY))
    assert r.mtp == 0 and "dsr1_fp8_h200_trt.sh @1fc5d73" in r.source
    # 8k/1k attention DP 8 (tp_size 1, attention_dp_size 64 folded) at 64 clients, both spaces: MTP 1, a rank's budget
    r = row_recipe(_row(**{**base, "isl": 8192, "osl": 1024, "concurrency": 64, "tp_size": 1,
                           "attention_dp_size": 64}, silicon_data_source=_MTP_DAY))
    assert r.mtp == 1 and r.mtp_rank_budget and r.mem_fraction == 0.75


# The launch-settings audit of the held-out InferenceX groups (docs/validate-accuracy.md, "Held-out launch settings").
@pytest.mark.parametrize("kw, mem, ep", [
    # MiniMax-M2.5 FP8 H200: v0.16.0 (before InferenceX#869) 0.95, no EP flag; v0.18.0 (#869 to #1354) 0.95 and
    # --enable-expert-parallel through the always-true `-ge 1` guard. B200 FP8 v0.17.0: the same guard, 0.95.
    ({"model": "MiniMax-M2.5", "system": "h200_sxm", "backend_version": "0.16.0", "tp_size": 4}, 0.95, False),
    ({"model": "MiniMax-M2.5", "system": "h200_sxm", "backend_version": "0.18.0"}, 0.95, True),
    ({"model": "MiniMax-M2.5", "backend_version": "0.17.0", "tp_size": 2}, 0.95, True),
    ({"model": "MiniMax-M2.5", "backend_version": "0.19.0", "tp_size": 2}, 0.0, False),  # not tied to a version
    # Kimi-K2.5 INT4: kimik2.5_int4_h200.sh @34bc7c4 0.95, kimik2.5_int4_b200.sh @2b7b694 0.97.
    ({"model": "Kimi-K2.5", "system": "h200_sxm", "precision": "int4"}, 0.95, False),
    ({"model": "Kimi-K2.5", "precision": "int4"}, 0.97, False),
    ({"model": "Kimi-K2.5", "precision": "fp4"}, 0.0, False),  # 0.90: vLLM's default, nothing to carry
])
def test_held_out_vllm_launches_carry_their_memory_share_and_expert_parallel_flag(kw, mem, ep) -> None:
    r = row_recipe(_row(**{"backend": "vllm", **kw}))
    assert (r.mem_fraction, r.expert_parallel) == (mem, ep)


@pytest.mark.parametrize("kw, mem, chunk, recv, running", [
    ({"system": "h200_sxm"}, 0.85, 0, 1, 0),  # single_node/glm5_fp8_h200.sh @0c82808
    # B200 FP8: the rows' image (nightly-dev-cu13-20260317-1eea7448) is PR #915's launch: $CONC running, 0.85,
    # 32,768; not the earlier EAGLE script's 128 running (@87af9d6).
    ({"concurrency": 32}, 0.85, 32768, 1, 32),
    ({"concurrency": 128}, 0.85, 32768, 1, 128),
    ({"system": "b300_sxm", "concurrency": 64}, 0.85, 32768, 1, 64),  # single_node/glm5_fp8_b300.sh @5632483
    ({"precision": "fp4"}, 0.9, 32768, 10, 0),  # single_node/glm5_fp4_b200.sh @405c601
])
def test_held_out_glm5_sglang_launches_carry_their_flags(kw, mem, chunk, recv, running) -> None:
    r = row_recipe(_row(**{"model": "GLM-5", **kw}))
    assert (r.mem_fraction, r.chunked_prefill_size, r.recv_interval, r.max_running_requests) == (
        mem, chunk, recv, running)


def test_held_out_glm5_b200_fp8_rows_run_no_speculative_decoding() -> None:
    # PR #915's glm5-fp8-b200-sglang launch passes no --speculative-* flag; the EAGLE configuration
    # (glm5-fp8-b200-sglang-mtp) came after the rows (PR #1085, 2026-04-18).
    from twinserve.sim.speculative import SpeculativeSection
    from twinserve.sim.validate_recipes import apply_speculative
    r = row_recipe(_row(model="GLM-5", concurrency=16, backend_version="nightly-dev"))
    spec = SpeculativeSection()
    apply_speculative(r, spec)
    assert r.mtp == 0 and spec == SpeculativeSection()
    assert "EAGLE" not in r.unmodelled and "single_node/glm5_fp8_b200.sh" in r.source


def _heldout_row(model: str, system: str, version: str):
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    pick = rows[(rows["model"] == model) & (rows["system"] == system) & (rows["mode"] == "agg")
                & (rows["backend_version"].astype(str) == version)]
    return next(r for _, r in pick.iterrows() if harness(r) == INFERENCEX)


def test_a_minimax_h200_v018_rows_study_runs_its_experts_expert_parallel() -> None:
    # The row's columns say TP 8 with the experts tensor-parallel (moe_ep 1); the launch passed
    # --enable-expert-parallel (the `-ge 1` guard), so vLLM spreads the experts over the 8 ranks (EP = TP x DP).
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import row_plan
    row = _heldout_row("MiniMax-M2.5", "h200_sxm", "0.18.0")
    assert (int(row["tp_size"]), int(row["moe_ep_size"])) == (8, 1)
    plan = row_plan(row, "aic")
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.expert_parallel_size, e.gpu_memory_utilization) == (8, 8, 0.95)
    assert e.kv_cache_dtype == "auto"
    assert "--enable-expert-parallel" in plan.layout


def test_a_minimax_h200_v016_rows_study_keeps_tensor_parallel_experts() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import row_study
    cfg = row_study(_heldout_row("MiniMax-M2.5", "h200_sxm", "0.16.0"), "aic")
    assert (cfg.engine.tensor_parallel_size, cfg.engine.expert_parallel_size) == (4, 1)
    assert cfg.engine.gpu_memory_utilization == 0.95


def test_launch_expert_parallel_leaves_attention_dp_and_ep_workers_alone() -> None:
    from twinserve.sim.validate_recipes import Recipe, launch_expert_parallel
    from twinserve.sim.validate_rows import Worker
    ep = Recipe("s", expert_parallel=True)
    w = Worker(tp=4, moe_tp=4)
    assert launch_expert_parallel(ep, w) and (w.moe_tp, w.moe_ep) == (1, 4)
    for w in (Worker(tp=2, attention_dp=2, moe_ep=4), Worker(tp=1), Worker(tp=4, moe_ep=4)):
        before = (w.moe_tp, w.moe_ep)
        assert not launch_expert_parallel(ep, w) and (w.moe_tp, w.moe_ep) == before
    w = Worker(tp=4, moe_tp=4)
    assert not launch_expert_parallel(Recipe("s"), w) and w.moe_ep == 1


@pytest.mark.parametrize("kw, budget", [
    # minimaxm2.5_fp{8,4}_b300.sh @5632483: --max-num-batched-tokens ISL x 2 (v0.19.0 rows).
    ({"precision": "fp8"}, 2048), ({"precision": "fp4", "isl": 8192}, 16384),
    ({"precision": "fp8", "backend_version": "nightly-5b8c30d62b754b57"}, 0),  # another image: not told
])
def test_minimax_b300_v019_launches_carry_their_step_budget(kw, budget) -> None:
    r = row_recipe(_row(**{"backend": "vllm", "model": "MiniMax-M2.5", "system": "b300_sxm",
                           "backend_version": "0.19.0", **kw}))
    assert r.chunked_prefill_size == budget


def test_a_minimax_b300_rows_study_keeps_chunked_prefill_with_the_scripts_budget() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import row_study
    row = _heldout_row("MiniMax-M2.5", "b300_sxm", "0.19.0")
    s = row_study(row, "aic").scheduler
    assert (s.max_num_batched_tokens, s.enable_chunked_prefill) == (2 * int(row["isl"]), True)


@pytest.mark.parametrize("kw, mem, chunk, recv, running", [
    ({"system": "h200_sxm"}, 0.8, 16384, 1, 128),  # single_node/qwen3.5_fp8_h200.sh @2116fc4
    ({"system": "b300_sxm", "concurrency": 32}, 0.8, 16384, 10, 32),  # single_node/qwen3.5_fp8_b300.sh @5632483
    ({"precision": "bf16", "concurrency": 16}, 0.82, 32768, 30, 128),  # single_node/qwen3.5_bf16_b200.sh @29d69fa
    ({"precision": "bf16"}, 0.82, 32768, 10, 128),
])
def test_held_out_qwen35_sglang_launches_carry_their_flags(kw, mem, chunk, recv, running) -> None:
    r = row_recipe(_row(**{"model": "Qwen3.5-397B-A17B", **kw}))
    assert (r.mem_fraction, r.chunked_prefill_size, r.recv_interval, r.max_running_requests) == (
        mem, chunk, recv, running)


# The launch audit's second part (docs/validate-accuracy.md, "Held-out launch settings, the rest"): studies built only.
def _heldout_agg_row(model: str, system: str, precision: str, **cols):
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    pick = rows[(rows["model"] == model) & (rows["system"] == system) & (rows["precision"] == precision)
                & (rows["mode"] == "agg")]
    for col, value in cols.items():
        pick = pick[pick[col] == value]
    return next(r for _, r in pick.iterrows() if harness(r) == INFERENCEX)


@pytest.mark.parametrize("precision, script", [("bf16", "qwen3.5_bf16_b300.sh"), ("fp4", "qwen3.5_fp4_b300.sh")])
def test_a_qwen35_b300_rows_study_runs_its_scripts_scheduler_flags(precision, script) -> None:
    # Qwen3.5's Gated DeltaNet layers are not expressible under aic: the study is built under the roofline.
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.config import EngineConfig, SchedulerConfig
    from twinserve.sim.validate_rows import row_study
    for conc in (4, 64):  # either side of the scripts' receive-interval branch
        row = _heldout_agg_row("Qwen3.5-397B-A17B", "b300_sxm", precision, concurrency=conc)
        recipe = row_recipe(row)
        assert script in recipe.source
        cfg = row_study(row, "roofline")
        s, e = cfg.scheduler, cfg.engine
        assert s.recv_interval == recipe.recv_interval > 1
        assert (s.max_num_batched_tokens, s.max_prefill_tokens) == (recipe.chunked_prefill_size,
                                                                    recipe.max_prefill_tokens)
        assert s.max_num_batched_tokens != SchedulerConfig().max_num_batched_tokens
        assert e.gpu_memory_utilization == recipe.mem_fraction != EngineConfig().gpu_memory_utilization
    lo, hi = (row_recipe(_heldout_agg_row("Qwen3.5-397B-A17B", "b300_sxm", precision, concurrency=c))
              for c in (4, 64))
    assert lo.recv_interval < hi.recv_interval  # the scripts poll less often from 16 clients


@pytest.mark.parametrize("system, cols", [
    ("b200_sxm", {"moe_ep_size": 4, "attention_dp_size": 1}),   # the config's TP 4 / EP 4
    ("b200_sxm", {"attention_dp_size": 4}),                     # the config's attention-DP entry
    ("b300_sxm", {"moe_ep_size": 4, "backend_version": "0.17.0"}),
])
def test_a_kimi_fp4_rows_study_runs_the_one_tp_group_its_launch_ran(system, cols) -> None:
    # kimik2.5_fp4_{b200,b300}.sh before InferenceX#1658 pass --tensor-parallel-size only: whatever the row's EP /
    # attention-DP columns, vLLM ran one TP group with its experts tensor-parallel.
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import row_plan
    row = _heldout_agg_row("Kimi-K2.5", system, "fp4", **cols)
    assert int(row["moe_ep_size"]) > 1  # the row's columns say expert-parallel
    plan = row_plan(row, "aic")
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (int(row["tp_size"]), 1, 1)
    assert "--tensor-parallel-size" in plan.layout and "kimik2.5_fp4" in plan.layout


def test_launch_tensor_parallel_folds_ep_and_attention_dp_into_the_tp_group() -> None:
    from twinserve.sim.validate_recipes import Recipe, launch_tensor_parallel
    from twinserve.sim.validate_rows import Worker
    tp_only = Recipe("s", tensor_parallel_only=True)
    for w in (Worker(tp=4, moe_ep=4), Worker(tp=4, attention_dp=4, moe_ep=16)):
        assert launch_tensor_parallel(tp_only, w)
        assert (w.tp, w.attention_dp, w.moe_tp, w.moe_ep, w.gpus) == (4, 1, 4, 1, 4)
    w = Worker(tp=4, moe_tp=4)
    assert not launch_tensor_parallel(tp_only, w)  # already the TP group
    w = Worker(tp=4, moe_ep=4)
    assert not launch_tensor_parallel(Recipe("s"), w) and w.moe_ep == 4  # no such launch: the row's columns stand


# aiconfigurator's generator template for TensorRT-LLM 1.0.0rc3 (templates/trtllm/extra_engine_args.yaml.j2 @d40b94c)
# renders `disable_overlap_scheduler` true unless set; its older generator (generator/backends/trtllm.py @77cd250)
# sets it on disaggregated workers only. Its step budget (bs + ISL + 1500) is not carried (sim/validate_recipes.py).
def test_a_trt_1_0_0rc3_gap_row_runs_with_the_overlap_off() -> None:
    r = row_recipe(_row(silicon_data_source=_GAP, backend="trtllm", backend_version="1.0.0rc3", model="Qwen3-32B",
                        system="h100_sxm", batch_size=8, concurrency=8))
    assert "aiconfigurator generator" in r.source
    assert r.overlap_scheduler is False
    assert (r.max_num_tokens, r.chunked_prefill_size, r.max_running_requests) == (0, 0, 0)  # the engine's defaults


@pytest.mark.parametrize("kw", [
    {"backend_version": "1.2.0rc6.post1"},  # the rule-file generator's era: `agg disable_overlap_scheduler = false`
    {"silicon_data_source": _IX},  # an InferenceX row: its own scripts (none here: the defaults)
    {"backend": "vllm"},
    {"mode": "disagg"},
])
def test_other_rows_keep_their_engines_overlap_default(kw) -> None:
    base = dict(silicon_data_source=_GAP, backend="trtllm", backend_version="1.0.0rc3", model="Qwen3-32B",
                system="h100_sxm", batch_size=8, concurrency=8)
    base.update(kw)
    assert row_recipe(_row(**base)).overlap_scheduler is None


def test_a_qwen3_32b_h100_trt_1_0_0rc3_gap_rows_study_runs_without_the_overlap() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "Qwen3-32B") & (rows["system"] == "h100_sxm")
                & (rows["backend_version"] == "1.0.0rc3") & (rows["isl"] == 1024) & (rows["osl"] == 128)
                & (rows["concurrency"] == 16) & (rows["tp_size"] == 1)]
    assert len(pick) == 1
    s = row_study(pick.iloc[0], "aic").scheduler
    assert (s.overlap_scheduler, s.max_num_batched_tokens) == (False, 8192)  # TensorRT-LLM's default budget
    # A later version's gap row keeps TensorRT-LLM's default: the overlap on.
    later = pick.iloc[0].copy()
    later["backend_version"] = "1.2.0rc6.post1"
    assert row_study(later, "aic").scheduler.overlap_scheduler is True


@pytest.mark.parametrize("kw", [
    {"backend_version": "1.2.0rc6.post3"},
    {"backend_version": "1.2.0rc6.post3", "osl": 8192, "concurrency": 64, "tp_size": 8},
    # image 1.1.0rc2.post2: a layout and count only dsr1-fp4-b200-trt-mtp ran (LAYOUT_IMAGES)
    {"backend_version": "1.1.0rc2.post2", "osl": 8192, "concurrency": 8, "tp_size": 8, "attention_dp_size": 1,
     "moe_tp_size": 1, "moe_ep_size": 8, "mode": "agg", "pp_size": 1},
])
def test_b200_fp4_trt_mtp_rows_without_attention_dp_run_the_scripts_trtllm_experts(kw) -> None:
    # benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2: MOE_BACKEND="TRTLLM" and MTP 3 unless DP_ATTENTION.
    r = row_recipe(_row(**{"backend": "trtllm", "precision": "fp4", **kw}))
    assert "_b200_trt_mtp.sh @13dd0c2" in r.source
    assert (r.fp8_moe_kernel, r.mtp) == ("trtllm", 3)


def test_a_b200_fp4_trt_mtp_step_prices_its_experts_on_aics_trtllm_gen_rows_above_128_tokens() -> None:
    # An aggregated B200 FP4 MTP row (1k/8k, TP 8 / EP 8, 64 clients, image 1.2.0rc6.post3): TRTLLM experts, 3
    # drafts, so a decode step of the 64 clients verifies 256 rows. aic's own answer there is its CUTLASS row
    # (above 128 gathered tokens); the study's is its trtllm-gen row of the same table, read here from the
    # parquet (DeepSeek-R1's NVFP4 experts, MoE EP 8, power law 1.01, 256 tokens): 58 MoE layers x the
    # difference. At 128 rows and below aic's own answer already is trtllm-gen's: nothing moves.
    pytest.importorskip("aiconfigurator_core")
    import dataclasses
    from pathlib import Path

    import aiconfigurator_core

    from twinserve.sim.build import build_cost_models
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp4")
                & (rows["backend_version"] == "1.2.0rc6.post3") & (rows["isl"] == 1024) & (rows["osl"] == 8192)
                & (rows["concurrency"] == 64) & (rows["tp_size"] == 8)]
    cfg = row_study(pick.iloc[0], "aic")
    assert cfg.engine.aic_fp8_moe_kernel == "trtllm"
    assert cfg.speculative.num_speculative_tokens == 3
    own = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, aic_fp8_moe_kernel="default"))
    gen, cut = build_cost_models(cfg)[3], build_cost_models(own)[3]
    assert (gen.par.expert_parallel_size, gen.par.data_parallel_size) == (8, 1)
    table = pd.read_parquet(Path(aiconfigurator_core.__file__).parent / "systems" / "data" / "b200_sxm" / "moe"
                            / "trtllm" / gen.version / "moe_perf.parquet")
    t = table[(table.moe_dtype == "nvfp4") & (table.hidden_size == 7168) & (table.inter_size == 2048)
              & (table.num_experts == 256) & (table.topk == 8) & (table.moe_tp_size == 1) & (table.moe_ep_size == 8)
              & (table.distribution == "power_law_1.01") & (table.num_tokens == 256)]
    by = t.groupby("kernel_source").latency.mean()
    want = 58 * (by["moe_torch_flow_min_latency"] - by["moe_torch_flow_cutlass"]) * 1e-3
    assert want < -0.005  # trtllm-gen is the faster kernel there (0.157 against 0.291 ms a layer)
    assert gen.decode_tokens_time(256) - cut.decode_tokens_time(256) == pytest.approx(want, rel=1e-6)
    assert gen.tokens_time(256) - cut.tokens_time(256) == pytest.approx(want, rel=1e-6)
    for small in (16, 128):
        assert gen.decode_tokens_time(small) == cut.decode_tokens_time(small)


@pytest.mark.parametrize("kw, budget", [
    # benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2, no attention DP: MTP 3, MAX_BATCH_SIZE CONC,
    # MAX_NUM_TOKENS ((3 + 1) x CONC + ISL + 64 + 63) / 64 x 64.
    ({"precision": "fp4", "backend_version": "1.2.0rc6.post3", "concurrency": 4}, 1152),
    ({"precision": "fp4", "backend_version": "1.2.0rc6.post3", "concurrency": 64}, 1344),
    ({"precision": "fp4", "backend_version": "1.2.0rc6.post3", "isl": 8192, "concurrency": 16}, 8320),
    # single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788 (image 1.2.0rc6.post3): the same formula.
    ({"precision": "fp8", "backend_version": "1.2.0rc6.post3", "concurrency": 32}, 1216),
    # dsr1_fp8_h200_trt_mtp.sh @1fc5d73 (H200 rows over 64 clients): the same formula.
    ({"system": "h200_sxm", "backend_version": "1.1.0rc2.post2", "osl": 8192, "concurrency": 128}, 1600),
])
def test_trt_mtp_rows_take_the_scripts_step_budget(kw, budget) -> None:
    r = row_recipe(_row(**{"backend": "trtllm", **kw}))
    assert r.mtp == 3
    assert r.max_num_tokens == budget
    assert "--max_num_tokens" not in r.unmodelled


def test_trt_mtp_rows_with_attention_dp_take_a_ranks_budget() -> None:
    # With attention DP the script's budget is a rank's, of MAX_BATCH_SIZE CONC / TP: resolved with the ranks.
    from twinserve.sim.validate_recipes import rank_max_num_tokens
    r = row_recipe(_row(backend="trtllm", precision="fp4", backend_version="1.2.0rc6.post3", concurrency=256,
                        tp_size=1, attention_dp_size=8))
    assert (r.mtp, r.max_num_tokens, r.mtp_rank_budget) == (1, 0, True)
    assert "--max_num_tokens" not in r.unmodelled
    # ((1 + 1) x 256 / 8 + 1024 + 127) / 64 x 64; at 4 ranks (the TP 4 script) 64 sequences a rank
    assert rank_max_num_tokens(r, 256, 1024, 8) == 1152
    assert rank_max_num_tokens(r, 256, 1024, 4) == (2 * 64 + 1024 + 127) // 64 * 64 == 1216
    assert rank_max_num_tokens(r, 256, 1024, 1) == 0  # one rank: the engine's budget (max_num_tokens)
    # The single_node FP8 script: MAX_BATCH_SIZE CONC below 8 clients, CONC / 8 from 8.
    f = row_recipe(_row(backend="trtllm", precision="fp8", backend_version="1.2.0rc6.post3", concurrency=4,
                        tp_size=1, attention_dp_size=8))
    assert f.mtp == 1 and rank_max_num_tokens(f, 4, 8192, 8) == (2 * 4 + 8192 + 127) // 64 * 64
    assert rank_max_num_tokens(f, 64, 8192, 8) == (2 * 8 + 8192 + 127) // 64 * 64
    # Without attention DP the engine's budget, not a rank's.
    t = row_recipe(_row(backend="trtllm", precision="fp4", backend_version="1.2.0rc6.post3", concurrency=64,
                        tp_size=8))
    assert not t.mtp_rank_budget and rank_max_num_tokens(t, 64, 1024, 8) == 0


def test_a_trt_mtp_attention_dp_rows_study_takes_a_ranks_budget() -> None:
    # DeepSeek-R1 FP4 B200 1k/8k at 256 clients, attention DP 8 (MTP 1): each rank schedules its own batch within
    # the script's budget of 32 sequences a rank, one prompt a step, chunked prefill off.
    from twinserve.sim.build import build_engine
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp4")
                & (rows["backend_version"] == "1.2.0rc6.post3") & (rows["isl"] == 1024) & (rows["osl"] == 8192)
                & (rows["concurrency"] == 256) & (rows["attention_dp_size"] == 8)]
    cfg = row_study(pick.iloc[0], "aic")
    s = cfg.scheduler
    assert cfg.engine.data_parallel_size == 8
    assert (s.max_num_batched_tokens, s.enable_chunked_prefill, s.max_prompt_len, s.adp_per_rank) == (
        1152, False, 1024, True)
    core = build_engine(cfg).core.scheduler.config
    assert (core.max_num_batched_tokens // core.adp_ranks, core.adp_per_rank) == (1152, True)


def test_a_trt_mtp_rows_study_holds_one_prompt_a_step_without_chunking() -> None:
    # The study's scheduler gets the launch budget below max_seq_len, chunked prefill off, and a prompt bound of
    # ISL so the configuration validates (a whole prompt still fits a step).
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp4")
                & (rows["backend_version"] == "1.2.0rc6.post3") & (rows["isl"] == 1024) & (rows["osl"] == 8192)
                & (rows["concurrency"] == 64) & (rows["tp_size"] == 8)]
    s = row_study(pick.iloc[0], "aic").scheduler
    assert (s.max_num_batched_tokens, s.enable_chunked_prefill, s.max_prompt_len) == (1344, False, 1024)
    assert s.max_model_len >= 1024 + 8192
    s.to_core(num_blocks=4096)  # the core's SchedulerConfig validates it


@pytest.mark.parametrize("system, version, kernel", [
    # The v0.17.0 B200 image's script exported VLLM_USE_FLASHINFER_MOE_FP8=0 and VLLM_MOE_USE_DEEP_GEMM=0: vLLM's
    # Triton fused-MoE (backends/sim/aic/vllm_triton.py). Every other MiniMax-M2.5 FP8 image ran the kernel vLLM
    # picks by default, the one the model's table times (or one it has no rows of: H200 v0.16.0).
    ("b200_sxm", "0.17.0", "triton"), ("b200_sxm", "0.19.0", ""), ("h200_sxm", "0.16.0", ""),
    ("h200_sxm", "0.18.0", ""), ("h100_sxm", "0.18.0", ""), ("b300_sxm", "0.19.0", ""),
])
def test_only_the_minimax_b200_v017_launch_runs_vllms_triton_experts(system, version, kernel) -> None:
    r = row_recipe(_row(backend="vllm", model="MiniMax-M2.5", system=system, backend_version=version, tp_size=2))
    assert r.fp8_moe_kernel == kernel
    assert "VLLM_USE_FLASHINFER_MOE_FP8" not in r.unmodelled


def test_the_triton_experts_reach_exactly_the_minimax_b200_v017_rows_studies_under_aic() -> None:
    # Launch settings only (no measured column is read): the 40 rows of that image, and no other row of the file.
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows, row_study
    rows = load_rows()
    kernels = pd.Series([row_recipe(r).fp8_moe_kernel for _, r in rows.iterrows()], index=rows.index)
    picked = rows[kernels == "triton"]
    assert len(picked) == 40
    assert set(zip(picked["model"], picked["system"], picked["precision"], picked["backend_version"].astype(str))) == {
        ("MiniMax-M2.5", "b200_sxm", "fp8", "0.17.0")}
    r = picked.iloc[0]
    cfg = row_study(r, "aic")
    assert cfg.engine.aic_fp8_moe_kernel == "triton"
    assert row_study(r, "roofline").engine.aic_fp8_moe_kernel == "default"
    from twinserve.sim.build import build_cost_models
    assert "vLLM Triton FP8 experts from aic vllm 0.19.0" in build_cost_models(cfg)[3].describe()


# DeepSeek-R1 FP4 B200 TensorRT-LLM without MTP (docs/validate-accuracy.md, trtagg): the scripts' --max_num_tokens.
@pytest.mark.parametrize("kw, budget", [
    # benchmarks/dsr1_fp4_b200_trt.sh @6320e9b, no floor: (CONC + ISL + 64 + 63) / 64 x 64
    ({"concurrency": 256}, 1344),  # no image given (measured 2025-11-02)
    ({"concurrency": 64, "osl": 8192}, 1152),
    ({"concurrency": 32, "backend_version": "1.1.0rc2.post2"}, 1152),
    ({"concurrency": 256, "isl": 8192, "osl": 1024}, 8512),
    # single_node/dsr1_fp4_b200_trt.sh @34bc7c4 (image 1.2.0rc6.post2): at least 8,192
    ({"concurrency": 256, "backend_version": "1.2.0rc6.post2"}, 8192),
    ({"concurrency": 256, "isl": 8192, "osl": 1024, "backend_version": "1.2.0rc6.post2"}, 8512),
])
def test_b200_fp4_trt_plain_rows_take_the_scripts_step_budget(kw, budget) -> None:
    base = {"backend": "trtllm", "precision": "fp4", "tp_size": 4, "backend_version": float("nan")}
    r = row_recipe(_row(**{**base, **kw}))
    assert r.mtp == 0 and r.max_num_tokens == budget and r.adp_rank_budget
    assert "--max_num_tokens" not in r.unmodelled and r.stream_interval == 10


def test_b200_fp4_trt_plain_rows_budget_is_each_attention_dp_ranks() -> None:
    # The script passes the same budget at every layout; TensorRT-LLM's max_num_tokens is each rank's scheduler's.
    from twinserve.sim.validate_recipes import rank_max_num_tokens
    r = row_recipe(_row(backend="trtllm", precision="fp4", backend_version="1.1.0rc2.post2", isl=8192, osl=1024,
                        concurrency=64, tp_size=1, attention_dp_size=4))
    assert rank_max_num_tokens(r, 64, 8192, 4) == r.max_num_tokens == (64 + 8192 + 127) // 64 * 64
    assert rank_max_num_tokens(r, 64, 8192, 1) == 0  # one rank: the engine's budget


def _fp4_trt_row(**kw) -> pd.Series:
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    pick = rows[(rows["backend"] == "trtllm") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "agg")
                & (rows["system"] == "b200_sxm") & (rows["precision"] == "fp4")]
    for k, v in kw.items():
        pick = pick[pick[k].isna()] if v is None else pick[pick[k] == v]
    return pick.iloc[0]


def test_a_b200_fp4_trt_plain_rows_study_admits_one_prompt_a_step() -> None:
    # 1k/1k at 256 clients, TP 4, no image given: the script's 1,344-token budget holds one 1,024-token prompt beside
    # the 256 decodes, chunked prefill off (the study's scheduler admits the second prompt the next step).
    from twinserve.sim.validate_rows import row_study
    row = _fp4_trt_row(backend_version=None, isl=1024, osl=1024, concurrency=256, tp_size=4)
    s = row_study(row, "aic").scheduler
    assert (s.max_num_batched_tokens, s.enable_chunked_prefill, s.max_prompt_len) == (1344, False, 1024)
    assert s.max_num_seqs >= 256
    s.to_core(num_blocks=65536)


def test_a_b200_fp4_trt_plain_attention_dp_rows_study_takes_the_budget_a_rank() -> None:
    from twinserve.sim.validate_rows import row_study
    row = _fp4_trt_row(backend_version="1.1.0rc2.post2", isl=8192, osl=1024, concurrency=64, attention_dp_size=16)
    cfg = row_study(row, "aic")
    s = cfg.scheduler
    assert cfg.engine.data_parallel_size == 4
    assert (s.max_num_batched_tokens, s.enable_chunked_prefill, s.adp_per_rank) == (8320, False, True)
