"""Each serving engine's scheduler defaults at the measured version, as a row's [scheduler] fields.

The rows do not record their servers' flags, so a row runs with its engine's defaults for its GPU
(benchmarks raise the sequence cap to the client count; validate_rows does that for every row):

- vLLM V1 (every vLLM row: 0.11-0.19 and nightlies): `EngineArgs.get_batch_defaults`
  (vllm/engine/arg_utils.py): on a GPU of >= 70 GiB that is not an A100, the OpenAI server gets
  max_num_batched_tokens 8192 and max_num_seqs 1024 (else 2048 / 256); V1 always chunks
  prefills and mixes them with decodes.
- SGLang 0.5.x: `ServerArgs` (python/sglang/srt/server_args.py) sets chunked_prefill_size by
  GPU memory: < 35 GiB 2048, < 160 GiB (H100, H200) 8192, else (B200, B300, GB200, GB300)
  16384 (CUDA graphs to batch 256-512: not modelled, the engine profile prices a replayed step);
  `max_prefill_tokens: int = 16384`, `enable_mixed_chunk: bool = False`, `schedule_policy = "fcfs"`.
  Its scheduler runs prefill first and never mixes decodes into a prefill batch
  (`Scheduler.get_next_batch_to_run`): batch_policy "prefill_first" (core/sched/batch_policy.py).
- TensorRT-LLM (PyTorch backend, 1.x; the rows' 0.x versions are Dynamo's runtime images of it):
  `BuildConfig` max_num_tokens 8192, max_batch_size 2048; capacity scheduler
  GUARANTEED_NO_EVICT by default (docs: "Useful Runtime Options"): a request is admitted only when
  the KV blocks of every running request to its max_tokens, and its own, fit (capacity_policy).
  Its overlap scheduler is on (`disable_overlap_scheduler: bool = False` in llmapi's TorchLlmArgs, every
  version read): the executor loop fetches new requests one step ahead of the step it finishes
  (overlap_scheduler; core/sched/scheduler.py _fetched_late). No InferenceX aggregated TensorRT-LLM script
  read sets it (dsr1_fp8_b200_trt.sh @0a919c5, dsr1_fp8_h200_trt_mtp.sh @1fc5d73, dsr1_fp4_b200_trt_mtp.sh
  @13dd0c2: MTP launches keep it too); the srt-slurm disaggregated recipes turn it off on the prefill
  (context) workers only (sim/validate_rows.py), and aiconfigurator's generator template turns it off on
  the 1.0.0rc3 gap-analysis rows (sim/validate_recipes.py aic_generated_recipe).
"""

from __future__ import annotations

from dataclasses import dataclass

_GIB = 1024 ** 3


@dataclass(slots=True, frozen=True)
class EngineDefaults:
    """One engine's step budget and sequence cap on one GPU, with the source they come from."""

    max_num_batched_tokens: int
    max_num_seqs: int
    source: str
    batch_policy: str = "mixed"  # SchedulerConfig.batch_policy
    max_prefill_tokens: int = 0  # SchedulerConfig.max_prefill_tokens (0: no cap)
    capacity_policy: str = "on_demand"  # SchedulerConfig.capacity_policy
    overlap_scheduler: bool = False  # SchedulerConfig.overlap_scheduler


def engine_defaults(backend: str, gpu_mem_bytes: float) -> EngineDefaults:
    """The scheduler defaults of `backend` ('vllm', 'sglang', 'trtllm') on a GPU of gpu_mem_bytes."""
    gib = gpu_mem_bytes / _GIB
    if backend == "vllm":
        big = gib >= 70  # no A100 among the rows' systems
        return EngineDefaults(8192 if big else 2048, 1024 if big else 256,
                              "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (OPENAI_API_SERVER)")
    if backend == "sglang":
        chunk = 2048 if gib < 35 else 8192 if gib < 160 else 16384
        # max_running_requests comes from the KV pool's size: the pool bounds it here too.
        return EngineDefaults(chunk, 4096, "python/sglang/srt/server_args.py chunked_prefill_size, "
                              "max_prefill_tokens; managers/scheduler.py get_next_batch_to_run",
                              batch_policy="prefill_first", max_prefill_tokens=16384)
    if backend == "trtllm":
        # SchedulerConfig.capacity_policy in TensorRT-LLM's LLM API (llmapi/llm_args.py, SchedulerConfig):
        # CapacitySchedulerPolicy.GUARANTEED_NO_EVICT unless a recipe sets MAX_UTILIZATION; no InferenceX
        # TensorRT-LLM script read (docs/validate-accuracy.md) sets scheduler_config.
        # disable_overlap_scheduler False by default (llmapi TorchLlmArgs; NVIDIA/TensorRT-LLM py_executor.py
        # _executor_loop_overlap @9521caf4): SchedulerConfig.overlap_scheduler.
        return EngineDefaults(8192, 2048, "tensorrt_llm BuildConfig max_num_tokens / max_batch_size; "
                              "llmapi SchedulerConfig.capacity_scheduler_policy, disable_overlap_scheduler",
                              capacity_policy="guaranteed_no_evict", overlap_scheduler=True)
    raise ValueError(f"backend {backend!r}: known engines are vllm, sglang, trtllm")


# The batch policy of an SGLang disaggregated decode worker: the requests whose KV has arrived join its running
# batch without a forward of their own, so its decode steps never wait for them ("mixed": they are admitted into
# the decode step, and sim/disagg.py DecodeExecutor prices their transferred prompt at nothing). SGLang's decode
# event loop (sgl-project/sglang @278e503 python/sglang/srt/disaggregation/decode.py,
# `event_loop_normal_disagg_decode` / `event_loop_overlap_disagg_decode`): a batch of taken requests
# (`get_new_prebuilt_batch`, "construct fake completed prefill") only streams their transferred first token
# (`stream_output`), no `run_batch`; under DP attention that rank runs an idle batch in the collective step
# (`_prepare_idle_batch_and_run(None)`) while every other rank runs its own decode batch, and the next iteration
# merges the taken requests into the running batch (`get_next_disagg_decode_batch_to_run`). Until 2026-12-06 the
# decode replica kept the server's prefill_first: each arrival was a step of its own, priced as a forward
# (13.1 ms on a GB200 FP4 DEP 32 worker) during which no rank decoded; at 512 clients 619 of its 3,717 steps.
# The iteration a taking rank's own decodes skip under DP attention is priced by sim/disagg.py DecodeExecutor
# (join_ranks); not modelled: the CPU time of an iteration that takes requests on a worker without DP attention.
SGLANG_DECODE_JOINS = "mixed"
# ... and the joiner's first forward there is a decode row at its prompt's context ([cluster] disagg_join_row): the
# next iteration runs it in the running batch's decode (`merge_batch`, then `update_running_batch`).
SGLANG_DECODE_JOIN_ROW = "decode"


# Time to first token the serving front end adds outside the engine's steps (HTTP, tokenizing the
# prompt, hand-off to the engine process, detokenizing and streaming the first chunk): fitted per
# engine on the development rows only (Llama-3.1-70B, Qwen3-32B, gpt-oss-120b, DeepSeek-R1; 88 rows
# of `simulate validate --rows dev --limit 160 --window benchmark`), the value minimising the median
# |TTFT error| on a 10 ms grid (docs/validate-accuracy.md). A 4-client fit of measured TTFT against
# one prefill step on the same rows gives the same order: Llama-3.1-70B 80 ms + 1.1-1.3 x the step.
# SGLang's was refitted (180 -> 300 ms) after its lock step (batch_policy prefill_first) and exact
# gap-row lengths landed: 48 SGLang development rows (DeepSeek-R1, Qwen3-32B) of `--rows dev
# --limit 120` and `--rows dev --backend sglang --limit 40`, 2026-12-04 (docs/validate-accuracy.md).
# SGLang's refitted again (300 -> 145 ms) once the InferenceX rows ran with their recipes' receive poll
# (sim/validate_recipes.py): the in-sample best on the 197 priced SGLang development rows (DeepSeek-R1 162,
# Qwen3-32B 35; `--rows dev --backend sglang --cost-model aic --limit 300 --max-clients 128`), 5 ms grid;
# each model left out 31.7% against 33.6% at 300 ms, 2026-12-05. vLLM's and TensorRT-LLM's refits (20 ms,
# 50 ms) did worse then with a model left out than the constants kept (21.5% vs 20.2%, 56.4% vs 47.8%).
# vLLM's and TensorRT-LLM's refits were taken once more (60 -> 15 ms, 100 -> 45 ms) when gpt-oss-120b's
# rows priced under aic, by that rule (each model left out 18.9% vs 21.5%, 29.2% vs 39.3% on the priced
# development rows of `--rows dev --cost-model aic --limit 300 --max-clients 128`), and reverted after the
# held-out run showed them worse (aic held-out TTFT 26.8% -> 33.9%, roofline 41.3% -> 54.2%, 2026-12-05):
# the held-out figure decided that revert (docs/validate-accuracy.md, "Front-end constants refitted with
# gpt-oss priced").
# Since 2026-12-05 (docs/validate-accuracy.md, "The front end under load, and the prompt's length") vLLM's
# and TensorRT-LLM's latency is FRONTEND_LATENCY_S plus a rate per prompt token; SGLang keeps its constant.
# Each engine's serving process turns the prompt into tokens before the engine sees it: vLLM V1's API server
# (vllm/v1/engine/async_llm.py AsyncLLM.add_request -> input_processor.process_inputs_async, "Raw prompts
# require tokenization", vllm-project/vllm 00080ee1), TensorRT-LLM's LLM API in trtllm-serve's process
# (tensorrt_llm/llmapi/llm.py generate_async -> input_processor, NVIDIA/TensorRT-LLM 00966934), SGLang's
# TokenizerManager process (python/sglang/srt/managers/tokenizer_manager.py). The values are not those
# sources' figures. The structure, intercept + rate x prompt tokens, is the one that did best with each
# development model left out in turn among: the constant refitted, + streamed tokens/s, + prompt tokens,
# both, and the constants as they were + either term (experiments/ttft_frontend_load.py on `simulate
# validate --silicon --rows dev --cost-model aic --limit 300 --max-clients 128`, main f62d2f6; median
# |TTFT error| left out: vLLM 17.4% as they were, 13.7% constant refitted, 11.1% this; TensorRT-LLM 39.3%,
# 29.2%, 24.3%; SGLang 25.4% whatever the structure, so its constant stands). The values are that
# structure's fit on all the priced development rows of the engine (5 ms and 0.5 ms per 1000 tokens grid):
# vLLM 15 ms + 2.0 ms per 1000 prompt tokens, TensorRT-LLM 45 ms + 1.5. No held-out row was read to choose
# them; the constants before were held at a level a held-out run had decided (above), these are not. The
# rate also takes up whatever of the engine's prefill price grows with the prompt: these rows cannot tell
# the two apart. A load term (streamed tokens/s, concurrency) did no better with a model left out.
FRONTEND_LATENCY_S = {"vllm": 0.015, "trtllm": 0.045, "sglang": 0.145}
FRONTEND_S_PER_PROMPT_TOKEN = {"vllm": 2.0e-6, "trtllm": 1.5e-6}


def frontend_latency_s(backend: str, isl: int = 0) -> float:
    """The serving front end's time to first token outside the engine for a prompt of `isl` tokens
    (0 for an unknown engine)."""
    return FRONTEND_LATENCY_S.get(backend, 0.0) + FRONTEND_S_PER_PROMPT_TOKEN.get(backend, 0.0) * max(0, isl)


# The measured backend (`--cost-model aic`) prices kernels only; a served step also pays what the
# engine does around them. Each engine's terms (kernel scale, host time a step and a sequence) live with
# the cost model's constants: backends/sim/aic/cost_model.SERVING_TERMS, set on each aic row by
# sim/validate_rows.py (until 2026-12-05 here: AIC_HOST_TIME, the engine profile's host time for vLLM
# and SGLang rows).
