"""The server flags each InferenceX row was measured with (its recipe), as a small declared table.

InferenceX (SemiAnalysisAI/InferenceX) launches each engine from a script per model x GPU x precision
(`benchmarks/<model>_<precision>_<gpu>[_<engine>].sh`); the script sets the serving flags, sometimes
branching on the client count (CONC) or TP. What a measurement ran with is a fact about the measurement,
not a fit: each entry names its script (read at the commit given, through the library's code index;
the scripts changed over time, so a row measured before that commit may have run an earlier version).
A row with no entry (a model or GPU whose script was not found, a gap-analysis row, a disaggregated
row) runs its engine's defaults (sim/validate_engines.py): stream interval 1, receive every step. The
disaggregated SGLang DeepSeek-R1 rows take their prefill and decode workers' flags from the srt-slurm recipes
their InferenceX entries launch instead (DISAGG_RECIPES, at the end of this module).

Flags and what the simulator does with them:

- `--scheduler-recv-interval N` (SGLang): new requests are read every N decode steps, at once after a
  prefill step or on an idle engine: SchedulerConfig.recv_interval (core/sched/scheduler.py _received).
- `--chunked-prefill-size`, `--max-prefill-tokens` (SGLang): the step's prompt-token budget and the
  prefill_first admission cap: SchedulerConfig.max_num_batched_tokens and max_prefill_tokens.
- `--max-running-requests` (SGLang): the running-request cap: SchedulerConfig.max_num_seqs.
- `--mem-fraction-static` (SGLang: a share of the GPU's total memory) and `kv_cache_config.
  free_gpu_memory_fraction` (TensorRT-LLM: a share of what the weights leave free): the engine's memory
  share, EngineConfig.gpu_memory_utilization (its kv_memory_basis, total or free, is set per engine by
  sim/validate_rows.py). It sizes the KV pool, which binds where the clients' ISL + OSL is near it
  (DeepSeek-R1 FP8 at TP 4 on B200: the weights take 156.7 of 179.1 GiB a GPU).
- `--stream-interval N` (SGLang): recorded, and changes neither the client's TTFT nor its TPOT in the
  rows' SGLang versions (0.5.x): `stream_output_generation` (python/sglang/srt/managers/
  scheduler_output_processor_mixin.py) sends a streaming request's output when
  `len(req.output_ids) % stream_interval == 1` for an interval above 1 (`== 0` for 1), so the first
  token goes out at once, and a finished request always sends what it has. The client's TTFT (first
  chunk) and TPOT ((latency - TTFT) / (tokens - 1)) see the same times as with interval 1; only the
  chunks in between are grouped (sglang_stream_points). The older rule (`% stream_interval == 0`,
  which held the first token for N - 1 steps) is in older trees; sgl-project/sglang 5294b03 (mid 2025,
  `BatchTokenIDOut` era) and 004ec01 already have the one above.
- `speculative_config: {decoding_type: MTP, num_nextn_predict_layers: N}` (TensorRT-LLM): DeepSeek-R1's
  own NextN layer drafts N tokens a step: [speculative] method draft_model, draft_model "mtp"
  (ModelSpec.mtp_draft), k = N, each position accepted with MTP_ACCEPTANCE given the ones before it (the rate
  that gives the 2.50 tokens a step InferenceX measured on its chat-templated random prompts at 3 drafts).
  The rows carry no speculative-decoding field: InferenceX's config (`.github/configs/nvidia-master.yaml`)
  runs its MTP and non-MTP DeepSeek-R1 B200 TensorRT-LLM benchmarks from different images, which the
  rows' backend_version names (MTP_IMAGES).
- `batch_wait_timeout_iters`, `batch_wait_max_tokens_ratio` (TensorRT-LLM, `--extra_llm_api_options`):
  while requests decode, new prompts wait up to N iterations unless the step's tokens reach ratio x
  max_num_tokens: SchedulerConfig.batch_wait_iters / batch_wait_tokens_ratio (core/sched/batch_policy.py
  MixedBatchWait). `--max_num_tokens` (TensorRT-LLM): the step budget, SchedulerConfig.max_num_batched_tokens,
  with chunked prefill off as the PyTorch backend runs by default (`enable_chunked_prefill: False`,
  llmapi/llm_args.py; no recipe read here turns it on).
- `attention_dp_config: {enable_balance: true, timeout_iters: 60, batching_wait_iters: 0}` (TensorRT-LLM,
  every InferenceX DeepSeek-R1 script read, written only when DP_ATTENTION is true): with attention DP,
  new prompts wait until every rank has one or the balance's step count reaches 60:
  SchedulerConfig.adp_balance_iters / adp_batching_wait_iters (core/sched/batch_policy.py AdpBalance),
  which act only where the row's layout has attention DP ([engine] data_parallel_size > 1), as the
  scripts' condition does. The non-MTP FP4 B200 script's `--max_num_tokens` (CONC + ISL + 64 rounded up to
  64, each rank's under attention DP) is taken, with the prompt bound ISL (trt_script_max_num_tokens); the FP8 and
  H200 non-MTP scripts' is not.
- `VLLM_MXFP4_USE_MARLIN=1` (vLLM, gpt-oss on H100 / H200): its MXFP4 experts run on Marlin, not the
  Triton kernel aic's table times: EngineConfig.aic_mxfp4_moe_kernel 'marlin' (backends/sim/aic/marlin.py),
  under `--cost-model aic` only (the roofline does not tell kernels apart).
- `--gpu-memory-utilization` (vLLM: a share of the GPU's total memory): EngineConfig.gpu_memory_utilization,
  as SGLang's `--mem-fraction-static` above.
- `--enable-expert-parallel` (vLLM) where the script passes it whatever the configuration's EP (the MiniMax-M2.5
  H200 / B200 FP8 scripts' `[ "$EP_SIZE" -ge 1 ]` guard, always true): the experts run expert-parallel over the
  TP ranks (vLLM's EP size is TP x DP), not tensor-parallel as the row's moe_tp / moe_ep columns say:
  Recipe.expert_parallel, applied by sim/validate_rows.py row_plan to a TP-only single worker. SGLang's
  `--enable-ep-moe` (deprecated: it sets `ep_size = tp_size`, "Please set `--ep-size` to the same value as
  `--tp-size` instead", python/sglang/srt/server_args.py) is the same: InferenceX's DeepSeek-R1 FP4 B200 script
  passed it until PR #204, the rows with no image (_dsr1_fp4_b200_ep_moe).
- A vLLM launch that passes `--tensor-parallel-size` and nothing of the configuration's EP or attention DP (the
  Kimi-K2.5 FP4 B200 / B300 scripts before InferenceX#1658): vLLM runs one TP group with its experts
  tensor-parallel (`FusedMoEParallelConfig.make`: without enable_expert_parallel, ep_size 1 and the experts
  split over the TP ranks), whatever the row's moe_ep / attention_dp columns say: Recipe.tensor_parallel_only,
  applied by sim/validate_rows.py row_plan to a single worker (launch_tensor_parallel).
- Not modelled (said so, not approximated): speculative decoding elsewhere (MTP
  where nothing tells MTP runs from others: H200's rows up to 64 clients, SGLang's, the disaggregated
  Dynamo recipes), attention backends and other kernel choices, CUDA-graph batch caps.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, replace
from typing import Any, Callable

_INFERENCEX_REPO = "SemiAnalysisAI/InferenceX"


@dataclass(slots=True, frozen=True)
class Recipe:
    """The serving flags of one row's measurement (0: the flag not set, the engine's default)."""

    source: str  # the recipe script (InferenceX path @ commit), or why the defaults stand
    stream_interval: int = 1
    recv_interval: int = 1
    chunked_prefill_size: int = 0
    max_prefill_tokens: int = 0
    max_running_requests: int = 0
    unmodelled: str = ""  # flags the script sets that the simulator does not reproduce
    mtp: int = 0  # tokens DeepSeek's multi-token-prediction layer drafts a step (0: no speculation)
    max_num_tokens: int = 0  # TensorRT-LLM's --max_num_tokens (its step budget; chunked prefill off)
    # Under attention DP the MTP scripts' --max_num_tokens is a rank's, at MAX_BATCH_SIZE CONC / ranks: resolved
    # once the row's ranks are known (rank_max_num_tokens; sim/validate_rows.py sets SchedulerConfig.adp_per_rank).
    mtp_rank_budget: bool = False
    mtp_rank_whole_below: int = 0  # under this many clients the rank's MAX_BATCH_SIZE is CONC, not CONC / ranks
    max_seq_len: int = 0  # TensorRT-LLM's --max_seq_len (SchedulerConfig.max_model_len)
    batch_wait_iters: int = 0  # TensorRT-LLM's batch_wait_timeout_iters
    batch_wait_ratio: float = 0.0  # TensorRT-LLM's batch_wait_max_tokens_ratio
    mem_fraction: float = 0.0  # the engine's memory share (0: the engine's default)
    adp_balance_iters: int = 0  # TensorRT-LLM's attention_dp_config timeout_iters, enable_balance on (0: off)
    adp_batching_wait_iters: int = 0  # TensorRT-LLM's attention_dp_config batching_wait_iters
    mxfp4_moe_kernel: str = ""  # vLLM's MXFP4 expert kernel where the script forces one ('marlin'; '': default)
    # The FP8 block-scale / NVFP4 experts' kernel where the script sets one the model's table does not time
    # (`aic_fp8_moe_kernel`): 'trtllm', TensorRT-LLM's TRTLLM MoE backend; 'triton', vLLM's Triton fused-MoE.
    fp8_moe_kernel: str = ""
    # NVFP4 experts' TensorRT-LLM MoE backend where the script sets one aic's own choice does not run
    # (`aic_nvfp4_moe_kernel`): 'cutlass', `moe_config: backend: CUTLASS` (backends/sim/aic/trtgen.py).
    nvfp4_moe_kernel: str = ""
    # Experts EP = TP whatever the config's EP: vLLM's --enable-expert-parallel, SGLang's --enable-ep-moe
    expert_parallel: bool = False
    tensor_parallel_only: bool = False  # vLLM launched with --tensor-parallel-size only, whatever the config's EP /
    # attention DP (no --enable-expert-parallel, no --data-parallel-size): one TP group, its experts tensor-parallel
    overlap_scheduler: bool | None = None  # TensorRT-LLM's overlap scheduler as launched (None: the engine's default)
    # Under attention DP, max_num_tokens as given is each rank's budget (a script whose --max_num_tokens does not
    # depend on the layout: rank_max_num_tokens)
    adp_rank_budget: bool = False


DEFAULT = Recipe("no InferenceX recipe known for this row: the engine's defaults")


def _dsr1_fp8_h200(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_h200.sh @1fc5d73", stream_interval=10,
                  chunked_prefill_size=32768, max_prefill_tokens=32768,
                  max_running_requests=512 if (isl, osl) == (1024, 1024) else 256, mem_fraction=0.82,
                  unmodelled="--attention-backend flashinfer, --cuda-graph-max-bs")


def _dsr1_fp8_b200(isl: int, osl: int, conc: int, tp: int,
                   src: str = f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_b200.sh @1fc5d73") -> Recipe:
    rest = "--attention-backend trtllm_mla, --moe-runner-backend flashinfer_trtllm, --cuda-graph-max-bs"
    if tp == 4:  # the script's TP 4 branch (ISL 8192 / OSL 1024 only): --mem-fraction-static 0.95
        return Recipe(src, 30, 10, 8192, 8192, 32, rest, mem_fraction=0.95)
    return Recipe(src, 30, 30 if conc >= 16 else 10, 32768, 32768, 128, rest, mem_fraction=0.82)


def _dsr1_fp4_b200(isl: int, osl: int, conc: int, tp: int,
                   src: str = f"{_INFERENCEX_REPO} benchmarks/dsr1_fp4_b200.sh @1fc5d73") -> Recipe:
    return Recipe(src, stream_interval=10,
                  recv_interval=30 if conc >= 16 else 10, chunked_prefill_size=16384,
                  max_running_requests=256, mem_fraction=0.85,
                  unmodelled="--attention-backend trtllm_mla, --moe-runner-backend flashinfer_trtllm, "
                             "--enable-symm-mem, --cuda-graph-max-bs")


# The DeepSeek-R1 FP4 B200 SGLang rows with no image (measured 2025-11-02 and 11-10, "tp4" / "tp8" at EP 1) ran
# the script before InferenceX PR #204, which passed `--enable-ep-moe` (SGLang: ep_size = tp_size) and
# `--enable-flashinfer-trtllm-moe`; the matrix entries of the time gave TP alone, so the export writes EP 1.
# PR #204 (perf-changelog.yaml @000de6d: "Replace --enable-ep-moe with --ep-size $EP_SIZE", "Set ep:4 for all
# tp:4 entries, ep:8 for all tp:8 entries") kept the experts' layout; PR #242 (2025-11-17) says so for FP4 ("I
# re-enabled the EP for the fp4 workloads"). Every pre-#204 copy of dsr1_fp4_b200_docker.sh / _slurm.sh the
# library holds passes both flags; the docker copy's others are @1fc5d73's (chunk 16,384, 256 running, memory
# 0.85, stream 10, receive 10 / 30 by CONC), taken here (an earlier slurm copy, receive 10 and a 32,768 prefill
# cap, is not). The image is not in the rows (notes of the period quote the entry with
# lmsysorg/sglang:v0.5.3rc1-cu129-b200); aic's SGLang 0.5.14 tables price it, as every SGLang B200 row.
def _dsr1_fp4_b200_ep_moe(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    return replace(_dsr1_fp4_b200(isl, osl, conc, tp, f"{_INFERENCEX_REPO} benchmarks/dsr1_fp4_b200_docker.sh "
                                  "before PR #204 (--enable-ep-moe; no image given: 2025-11)"), expert_parallel=True)


# B300: `benchmarks/single_node/dsr1_fp{8,4}_b300.sh` "reuse the existing DSR1 FP8 (FP4) B200 SGLang recipe
# as-is" (their header): the same flags and branches (FP8: TP 8 recv 10 / 30 by CONC, chunk and prefill
# 32,768, 128 running, memory 0.82; TP 4 recv 10, 8,192, 32 running, 0.95. FP4: recv 10 / 30, chunk 16,384,
# 256 running, 0.85).
def _dsr1_fp8_b300(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return _dsr1_fp8_b200(isl, osl, conc, tp, f"{_INFERENCEX_REPO} benchmarks/single_node/dsr1_fp8_b300.sh @5632483")


def _dsr1_fp4_b300(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return _dsr1_fp4_b200(isl, osl, conc, tp, f"{_INFERENCEX_REPO} benchmarks/single_node/dsr1_fp4_b300.sh @5632483")


# GLM-5 FP8 B200: the rows (image lmsysorg/sglang:nightly-dev-cu13-20260317-1eea7448, measured 2026-03-20, TP 8 EP 1)
# ran SemiAnalysisAI/InferenceX PR #915's launch ("[NV] GLM5 fp8 b200 SGL", reviewed 2026-03-17 to 03-20; its
# perf-changelog.yaml entry: "Add GLM-5 FP8 SGLang benchmark for B200", TP8 and DEP8 with the NSA backend), not
# the earlier EAGLE script (benchmarks/glm5_fp8_b200.sh @87af9d6, issue #684, 2026-02-12): PR #1447 names that
# nightly as glm5-fp8-b200-sglang's image, and the EAGLE configuration glm5-fp8-b200-sglang-mtp only came with
# PR #1085 (2026-04-18, "mirroring the existing glm5-fp8-b200-sglang non-MTP recipe"). PR #915's script
# (benchmarks/single_node/glm5_fp8_b200.sh, read @4eca3fe; the flags below are the same in the PR's 2026-03-17
# review snapshots): --max-running-requests $CONC, --mem-fraction-static 0.85, --chunked-prefill-size and
# --max-prefill-tokens 32768, --stream-interval 30 (no effect on TTFT / TPOT: sglang_stream_points),
# --disable-radix-cache, --kv-cache-dtype fp8_e4m3, no speculative decoding.
def _glm5_fp8_b200(isl: int, osl: int, conc: int, tp: int,
                   src: str = f"{_INFERENCEX_REPO} benchmarks/single_node/glm5_fp8_b200.sh @4eca3fe (PR #915)",
                   unmodelled: str = "--nsa-decode-backend / --nsa-prefill-backend trtllm, --moe-runner-backend "
                   "flashinfer_trtllm, --enable-flashinfer-allreduce-fusion, --cuda-graph-max-bs") -> Recipe:
    return Recipe(src, stream_interval=30, chunked_prefill_size=32768, max_prefill_tokens=32768,
                  max_running_requests=conc, mem_fraction=0.85, unmodelled=unmodelled)


def _qwen35_fp8_b200(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/qwen3.5_fp8_b200.sh @01fa35c", stream_interval=30,
                  recv_interval=30 if conc >= 16 else 10, chunked_prefill_size=32768,
                  max_prefill_tokens=32768, max_running_requests=128,
                  unmodelled="--attention-backend trtllm_mha, --tokenizer-worker-num 6, --cuda-graph-max-bs")


# InferenceX's single-node MAX_MODEL_LEN for a row of ISL / OSL: `isl + osl + 200`, the sweep generator's
# single-node entry (utils/matrix_logic/generate_sweep_configs.py, `Fields.MAX_MODEL_LEN.value`, in the late-2025
# trees; later trees add 256). The Llama-3.1-70B TensorRT-LLM rows were measured 2025-10-29 (their
# silicon_data_source).
def _inferencex_max_model_len(isl: int, osl: int) -> int:
    return isl + osl + 200


def _llama70b_trt(isl: int, osl: int, conc: int, tp: int, *, script: str, max_num_tokens: int) -> Recipe:
    # benchmarks/70b_fp{8,4}_{b200,h200}_trt_slurm.sh: "For 1k/1k, use batch_wait_max_tokens_ratio and
    # batch_wait_timeout_iters": 0.9 and 20 when ISL == OSL == 1024 and TP < 8, neither otherwise;
    # stream_interval 10 (the first token is sent at once: py_executor.py `_handle_responses`,
    # `py_decoding_iter == 1`), kv_cache_config dtype fp8, block reuse off.
    wait = (isl, osl) == (1024, 1024) and tp < 8
    return Recipe(f"{_INFERENCEX_REPO} {script}", stream_interval=10, max_num_tokens=max_num_tokens,
                  max_seq_len=_inferencex_max_model_len(isl, osl),  # `--max_seq_len $MAX_MODEL_LEN`
                  batch_wait_iters=20 if wait else 0, batch_wait_ratio=0.9 if wait else 0.0,
                  unmodelled="cuda_graph_config (padding, batch 1024), --num_postprocess_workers 2")


def _llama70b_fp8_b200_trt(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return _llama70b_trt(isl, osl, conc, tp, script="benchmarks/70b_fp8_b200_trt_slurm.sh @a267b4b",
                         max_num_tokens=16384)  # `--max_num_tokens 16384`


def _llama70b_fp4_b200_trt(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # InferenceX's B200 docker runner (runners/launch_b200-nvd.sh @03a48b8) runs
    # `benchmarks/${EXP_NAME%%_*}_${PRECISION}_b200_trt_docker.sh`, whose 70b FP4 script sets
    # `--max_num_tokens 16384` like the FP8 one; the Slurm variant (70b_fp4_b200_trt_slurm.sh @73ef922) passes
    # $MAX_MODEL_LEN instead. Which runner measured a row is not recorded: the docker one is taken.
    return _llama70b_trt(isl, osl, conc, tp, script="benchmarks/70b_fp4_b200_trt_docker.sh @c2faa3d",
                         max_num_tokens=16384)  # `--max_num_tokens 16384`


def _llama70b_fp8_h200_trt(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    return _llama70b_trt(isl, osl, conc, tp, script="benchmarks/70b_fp8_h200_trt_slurm.sh @73ef922",
                         max_num_tokens=_inferencex_max_model_len(isl, osl))  # `--max_num_tokens $MAX_MODEL_LEN`


# `attention_dp_config: {batching_wait_iters: 0, enable_balance: true, timeout_iters: 60}`, appended by every
# InferenceX DeepSeek-R1 TensorRT-LLM aggregated script read when DP_ATTENTION is true:
# benchmarks/dsr1_fp8_b200_trt.sh and dsr1_fp4_b200_trt.sh @6320e9b, dsr1_fp8_h200_trt.sh and
# dsr1_fp8_h200_trt_mtp.sh @1fc5d73, dsr1_fp8_b200_trt_mtp.sh @111f031. batching_wait_iters 0 is
# AdpBalance's default.
ADP_BALANCE_TIMEOUT_ITERS = 60


def _gptoss_fp4_hopper_vllm(script: str) -> Callable[[int, int, int, int], Recipe]:
    # benchmarks/gptoss_fp4_h200.sh @16cd955 and gptoss_fp4_h100.sh @1fc5d73: `export VLLM_MXFP4_USE_MARLIN=1`
    # (vLLM's get_mxfp4_backend then returns its MARLIN MoE backend, not the Triton kernel Hopper runs by
    # default: backends/sim/aic/marlin.py); config.yaml's max-num-batched-tokens 8192, async scheduling and no
    # prefix caching, and --max-num-seqs $CONC, are what the vLLM row studies already run.
    def recipe(isl: int, osl: int, conc: int, tp: int) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", mxfp4_moe_kernel="marlin",
                      unmodelled="max-cudagraph-capture-size 2048")
    return recipe


def _dsr1_trt(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # The non-MTP FP8 scripts (their images: MTP_IMAGES' note): only the attention-DP balance is taken here. The
    # FP4 B200 rows run _dsr1_fp4_b200_trt (and _dsr1_fp4_b200_trt_rc6) since trtagg.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp{{4,8}}_b200_trt.sh @6320e9b, dsr1_fp8_h200_trt.sh "
                  "@1fc5d73 (attention_dp_config only)", adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,
                  unmodelled="kv_cache_config free_gpu_memory_fraction, stream_interval 10, moe_config "
                             "backend, cuda_graph_config, --max_num_tokens")


def trt_script_max_num_tokens(conc: int, isl: int, floor: int = 0) -> int:
    """The step budget InferenceX's DeepSeek-R1 FP4 B200 TensorRT-LLM script passes: `MAX_NUM_TOKENS=$((
    ($CONC+$ISL+64+63)/64*64 ))`, one whole prompt beside a token for every client, rounded up to 64; the later
    versions raise it to at least 8,192 (`floor`)."""
    return max(floor, (conc + isl + 64 + 63) // 64 * 64)


def fp4_b200_trt_cutlass(isl: int, osl: int, conc: int) -> bool:
    """Whether SemiAnalysisAI/InferenceX benchmarks/dsr1_fp4_b200_trt.sh @6320e9b sets `moe_config: backend: CUTLASS`
    (its MOE_BACKEND block, TP 4 and TP 8 alike): 1k/1k and 1k/8k from 256 clients, 8k/1k above 32; else TRTLLM."""
    if (isl, osl) in ((1024, 1024), (1024, 8192)):
        return conc >= 256
    return (isl, osl) == (8192, 1024) and conc > 32


def _dsr1_fp4_b200_trt(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # The non-MTP FP4 script as the 1.1.0rc2.post2 configuration ran it: the rows of that image LAYOUT_IMAGES does not
    # give the MTP script, and the rows with no image (measured 2025-11-02), whose (TP, clients) are the EP and
    # attention-DP entries of that configuration's search space (InferenceMAX's nvidia-master.yaml of the time, e.g.
    # the forks sureshnam/InferenceMAX @f0b6f4b and dukebw/InferenceMAX @00e77d0: dsr1-fp4-b200-trt from
    # release:1.1.0rc2.post2 over _FP4_B200_RC2_PLAIN's space, launched by benchmarks/dsr1_fp4_b200_trt_slurm.sh
    # @f0b6f4b, whose flags are @6320e9b's). SemiAnalysisAI/InferenceX benchmarks/dsr1_fp4_b200_trt.sh @6320e9b:
    # `--max_num_tokens` CONC + ISL + 64 rounded up to 64 (trt_script_max_num_tokens; chunked prefill off, the
    # PyTorch backend's default: one whole prompt a step beside the decodes; each rank's under attention DP), no
    # --max_batch_size (TensorRT-LLM's default, 2,048: sim/validate_engines.py), stream_interval 10.
    # `moe_config: backend` CUTLASS from 256 clients at 1k/1k and 1k/8k and above 32 at 8k/1k (TP 4 and TP 8, with
    # or without attention DP): carried (nvfp4_moe_kernel 'cutlass', fp4_b200_trt_cutlass). Not carried
    # (docs/validate-accuracy.md, trtagg): its TRTLLM elsewhere, and free_gpu_memory_fraction 0.8, under which the
    # simulator's pool holds 226 of 1k/8k's 256 clients at TP 4 where the rows' first tokens say the engine held
    # nearly all.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp4_b200_trt.sh @6320e9b (image 1.1.0rc2.post2, or none "
                  "given: 2025-11-02)", stream_interval=10,
                  nvfp4_moe_kernel="cutlass" if fp4_b200_trt_cutlass(isl, osl, conc) else "",
                  max_num_tokens=trt_script_max_num_tokens(conc, isl), adp_rank_budget=True,
                  adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,  # `attention_dp_config` (DP_ATTENTION only)
                  unmodelled="moe_config backend TRTLLM (below 256 clients at 1k prompts, to 32 at 8k), "
                             "kv_cache_config free_gpu_memory_fraction 0.8, cuda_graph_config (padding, batch 512)")


def _dsr1_fp4_b200_trt_rc6(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # dsr1-fp4-b200-trt from release:1.2.0rc6.post2 (SemiAnalysisAI/InferenceX PR #620, perf-changelog.yaml @000de6d:
    # "Change default MOE backend ... to TRTLLM", piecewise CUDA graphs for 1k1k TEP 8). The script as the later copy
    # has it (benchmarks/single_node/dsr1_fp4_b200_trt.sh @34bc7c4): `--max_num_tokens` max(8192, CONC + ISL + 64
    # rounded up to 64), each rank's under attention DP; no --max_batch_size; stream_interval 10. Not carried, as
    # for _dsr1_fp4_b200_trt: MOE_BACKEND TRTLLM and free_gpu_memory_fraction 0.8. Its CUTLASS under attention DP is
    # carried (nvfp4_moe_kernel 'cutlass': backends/sim/aic/trtgen.py).
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/dsr1_fp4_b200_trt.sh @34bc7c4 (image 1.2.0rc6.post2: "
                  "PR #620)", stream_interval=10, nvfp4_moe_kernel="cutlass" if attention_dp else "",
                  max_num_tokens=trt_script_max_num_tokens(conc, isl, 8192), adp_rank_budget=True,
                  adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,  # `attention_dp_config` (DP_ATTENTION only)
                  unmodelled="moe_config backend TRTLLM (without attention DP), kv_cache_config "
                             "free_gpu_memory_fraction 0.8, cuda_graph_config (padding, batch CONC or CONC / 4), "
                             "piecewise CUDA graphs (1k/1k TP 8 EP 8)")


def _sglang_mem(script: str, mem: float, unmodelled: str) -> Callable[[int, int, int, int], Recipe]:
    def recipe(isl: int, osl: int, conc: int, tp: int) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", mem_fraction=mem, unmodelled=unmodelled)
    return recipe


def _glm5_fp8_b300(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # benchmarks/single_node/glm5_fp8_b300.sh @5632483 ("reuses the existing GLM5 FP8 B200 SGLang recipe as-is":
    # PR #915's, no EAGLE flags): --max-running-requests $CONC, --mem-fraction-static 0.85, --chunked-prefill-size
    # and --max-prefill-tokens 32768, --stream-interval 30, --disable-radix-cache.
    return _glm5_fp8_b200(isl, osl, conc, tp, f"{_INFERENCEX_REPO} benchmarks/single_node/glm5_fp8_b300.sh @5632483",
                          "--attention-backend nsa (trtllm decode / prefill), --moe-runner-backend flashinfer_trtllm, "
                          "--enable-flashinfer-allreduce-fusion, --cuda-graph-max-bs")


def _glm5_fp4_b200(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # benchmarks/single_node/glm5_fp4_b200.sh @405c601 (one version read; the rows' image is
    # lmsysorg/sglang:nightly-dev-cu13-20260328): --chunked-prefill-size and --max-prefill-tokens 32768,
    # --mem-fraction-static 0.9, --scheduler-recv-interval 10, --stream-interval 30, --expert-parallel-size
    # $EP_SIZE (the row's), no --max-running-requests.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/glm5_fp4_b200.sh @405c601", stream_interval=30,
                  recv_interval=10, chunked_prefill_size=32768, max_prefill_tokens=32768, mem_fraction=0.9,
                  unmodelled="--nsa-decode-backend / --nsa-prefill-backend trtllm, --moe-runner-backend "
                  "flashinfer_trtllm, --enable-dp-lm-head, --enable-flashinfer-allreduce-fusion, --cuda-graph-max-bs, "
                  "--tokenizer-worker-num 6")


def _qwen35_fp8_h200(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # benchmarks/single_node/qwen3.5_fp8_h200.sh @2116fc4: --max-running-requests 128, --chunked-prefill-size and
    # --max-prefill-tokens 16384, --mem-fraction-static 0.8, --stream-interval 50, no receive interval.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/qwen3.5_fp8_h200.sh @2116fc4", stream_interval=50,
                  chunked_prefill_size=16384, max_prefill_tokens=16384, max_running_requests=128, mem_fraction=0.8,
                  unmodelled="--attention-backend flashinfer, --enable-flashinfer-allreduce-fusion, "
                             "--cuda-graph-max-bs, --tokenizer-worker-num 6, --mamba-ssm-dtype bfloat16")


def _qwen35_fp8_b300(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # benchmarks/single_node/qwen3.5_fp8_b300.sh @5632483: --max-running-requests $CONC, --chunked-prefill-size and
    # --max-prefill-tokens 16384, --mem-fraction-static 0.8, --scheduler-recv-interval 10 (at every CONC),
    # --stream-interval 50.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/qwen3.5_fp8_b300.sh @5632483", stream_interval=50,
                  recv_interval=10, chunked_prefill_size=16384, max_prefill_tokens=16384,
                  max_running_requests=conc, mem_fraction=0.8,
                  unmodelled="--attention-backend trtllm_mha, --moe-runner-backend flashinfer_trtllm, "
                             "--enable-symm-mem, --cuda-graph-max-bs, --tokenizer-worker-num 6")


def _qwen35_bf16_b200(isl: int, osl: int, conc: int, tp: int) -> Recipe:
    # benchmarks/single_node/qwen3.5_bf16_b200.sh @29d69fa: --scheduler-recv-interval 30 from 16 clients, else 10;
    # --mem-fraction-static 0.82, --chunked-prefill-size and --max-prefill-tokens 32768, --max-running-requests
    # 128, --stream-interval 30.
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/qwen3.5_bf16_b200.sh @29d69fa", stream_interval=30,
                  recv_interval=30 if conc >= 16 else 10, chunked_prefill_size=32768, max_prefill_tokens=32768,
                  max_running_requests=128, mem_fraction=0.82,
                  unmodelled="--attention-backend trtllm_mha, --moe-runner-backend flashinfer_trtllm, "
                             "--enable-flashinfer-allreduce-fusion, --cuda-graph-max-bs, --tokenizer-worker-num 6")


# Qwen3.5 on B300 (rows: lmsysorg/sglang:v0.5.10.post1-cu130, measured 2026-04-18, TP 4 / 8 and TP 4 at EP 2).
# benchmarks/single_node/qwen3.5_bf16_b300.sh @5632483 (and alike on every flag taken here: lishuoshuo-amd/InferenceX
# @ba8ef7d, richardhuo-nv/InferenceX @4b685a8): --scheduler-recv-interval 30 from 16 clients, else 10;
# --mem-fraction-static 0.82; --chunked-prefill-size and --max-prefill-tokens 32768; --max-running-requests 128;
# --stream-interval 30 (no effect on TTFT / TPOT: sglang_stream_points). The B200 BF16 recipe's flags.
# benchmarks/single_node/qwen3.5_fp4_b300.sh @5632483 ("Follows the SGLang cookbook recipe ... as of 2026-04-17", the
# day before the rows; alike: lishuoshuo-amd/InferenceX @ae7e241, mpashkovskii/InferenceX @01d209c): the same
# receive interval, chunk, prefill cap, 128 running and stream interval, --mem-fraction-static 0.8,
# --kv-cache-dtype fp8_e4m3 (what precision_fields gives an FP4 row), allreduce fusion at TP 8 only.
def _qwen35_b300(script: str, mem: float, unmodelled: str) -> Callable[[int, int, int, int], Recipe]:
    def recipe(isl: int, osl: int, conc: int, tp: int) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", stream_interval=30, recv_interval=30 if conc >= 16 else 10,
                      chunked_prefill_size=32768, max_prefill_tokens=32768, max_running_requests=128,
                      mem_fraction=mem, unmodelled=unmodelled)
    return recipe


_QWEN35_B300_UNMODELLED = ("--attention-backend trtllm_mha, --moe-runner-backend flashinfer_trtllm, "
                           "--cuda-graph-max-bs, --tokenizer-worker-num 6")


# Kimi-K2.5 NVFP4 on vLLM, B200 (rows: v0.17.0, TP 8; TP 4 at EP 4; TP 4 with attention DP) and B300 (v0.17.0 TP 4
# at EP 4, v0.19.0 TP 4 / 8). InferenceX's config gave these layouts (`kimik2.5-fp4-b200-vllm`, SemiAnalysisAI/
# InferenceX#862 of 2026-03-03: "TP=8/EP=1 (conc 4-128) and TP=4/EP=4 (conc 4-64)"), but every version of the
# scripts read passes `--tensor-parallel-size=$TP` and neither --enable-expert-parallel nor --data-parallel-size
# (EP_SIZE is not even among the variables they check): benchmarks/single_node/kimik2.5_fp4_b200.sh @04107b3,
# whn09/InferenceX @53605e0, mpashkovskii/InferenceX @01d209c (after 2026-04-17), lishuoshuo-amd/InferenceX
# @73d52a5 (after vLLM v0.20.2); kimik2.5_fp4_b300.sh @5632483 and lishuoshuo-amd @ba8ef7d ("reuses the existing
# Kimi-K2.5 FP4 B200 vLLM recipe as-is"). SemiAnalysisAI/InferenceX#1658 (2026-06-03, after every row) is the first
# to make "the B200/B300 benchmark scripts now require EP_SIZE and pass --enable-expert-parallel only when
# EP_SIZE > 1". vLLM then shards the experts over the TP ranks (vllm/model_executor/layers/fused_moe/config.py
# FusedMoEParallelConfig.make: `use_ep = ... and vllm_parallel_config.enable_expert_parallel`; not use_ep:
# ep_size 1, tp_size the TP group's). Memory 0.90 (vLLM's default) and --max-num-seqs $CONC are what the study runs
# already; the later versions' --max-num-batched-tokens ISL x 2 and --kv-cache-dtype fp8 (@01d209c, @73d52a5) are
# not tied to the rows' images, and the NVFP4 checkpoint's FP8 K/V is what auto gives anyway.
def _kimi_fp4_vllm(script: str) -> Callable[[int, int, int, int], Recipe]:
    def recipe(isl: int, osl: int, conc: int, tp: int) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", tensor_parallel_only=True,
                      unmodelled="--compilation_config.pass_config.fuse_allreduce_rms true")
    return recipe


def _vllm_mem(script: str, mem: float, unmodelled: str) -> Callable[[int, int, int, int], Recipe]:
    # A vLLM script whose only flag the simulator models differently from its defaults is the memory share
    # (--max-num-seqs $CONC, and vLLM's default 8,192-token budget, are what the row studies run already).
    def recipe(isl: int, osl: int, conc: int, tp: int) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", mem_fraction=mem, unmodelled=unmodelled)
    return recipe


# (backend, model, system, precision) -> the recipe for the row's (ISL, OSL, clients, TP). Models with
# InferenceX rows and no entry: looked up, no script found for that backend x GPU (the defaults stand):
# SGLang DeepSeek-V3 as such (its InferenceX rows are dsr1 configurations: recipe_model), SGLang DeepSeek-R1
# (dsr1) on GB200 aggregated, Qwen3.5 B200 FP4 (the script versions read disagree, and none is tied to the rows'
# nightly-dev-20260402 image: docs/validate-accuracy.md, "Held-out launch settings, the rest"). vLLM rows but
# gpt-oss-120b's on Hopper (its MXFP4 experts on Marlin), Kimi-K2.5's (INT4: memory; FP4: the TP-only launch) and
# MiniMax-M2.5's (PRECISION_IMAGES), and TensorRT-LLM's but
# Llama-3.1-70B's and DeepSeek-R1's: their recipes set no flag the simulator models differently from the defaults
# it runs (docs/validate-accuracy.md, 2026-12-05 notes and the 2026-12-06 launch audit).
RECIPES: dict[tuple[str, str, str, str], Callable[[int, int, int, int], Recipe]] = {
    ("sglang", "DeepSeek-R1", "h200_sxm", "fp8"): _dsr1_fp8_h200,
    ("sglang", "DeepSeek-R1", "b200_sxm", "fp8"): _dsr1_fp8_b200,
    ("sglang", "DeepSeek-R1", "b200_sxm", "fp4"): _dsr1_fp4_b200,
    ("sglang", "DeepSeek-R1", "b300_sxm", "fp8"): _dsr1_fp8_b300,
    ("sglang", "DeepSeek-R1", "b300_sxm", "fp4"): _dsr1_fp4_b300,
    ("sglang", "GLM-5", "b200_sxm", "fp8"): _glm5_fp8_b200,
    # benchmarks/single_node/glm5_fp8_h200.sh @0c82808: --tp-size, --mem-fraction-static 0.85, nothing else.
    ("sglang", "GLM-5", "h200_sxm", "fp8"): _sglang_mem("benchmarks/single_node/glm5_fp8_h200.sh @0c82808", 0.85, ""),
    ("sglang", "GLM-5", "b300_sxm", "fp8"): _glm5_fp8_b300,
    ("sglang", "GLM-5", "b200_sxm", "fp4"): _glm5_fp4_b200,
    # benchmarks/single_node/kimik2.5_int4_h200.sh @34bc7c4: --gpu-memory-utilization 0.95, --max-num-seqs $CONC;
    # kimik2.5_int4_b200.sh @2b7b694: 0.97 (no --max-num-seqs: vLLM's default, above every row's clients). Their
    # INT4 (W4A16) experts run vLLM's compressed-tensors WNA16 Marlin MoE, the kernel aic's vLLM int4_wo tables
    # time (kernel_source 'vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts'): no kernel to carry.
    ("vllm", "Kimi-K2.5", "h200_sxm", "int4"): _vllm_mem(
        "benchmarks/single_node/kimik2.5_int4_h200.sh @34bc7c4", 0.95,
        "--compilation_config.pass_config.fuse_allreduce_rms true"),
    ("vllm", "Kimi-K2.5", "b200_sxm", "int4"): _vllm_mem(
        "benchmarks/single_node/kimik2.5_int4_b200.sh @2b7b694", 0.97,
        "--compilation_config.pass_config.fuse_allreduce_rms true"),
    ("sglang", "Qwen3.5-397B-A17B", "b200_sxm", "fp8"): _qwen35_fp8_b200,
    ("sglang", "Qwen3.5-397B-A17B", "h200_sxm", "fp8"): _qwen35_fp8_h200,
    ("sglang", "Qwen3.5-397B-A17B", "b300_sxm", "fp8"): _qwen35_fp8_b300,
    ("sglang", "Qwen3.5-397B-A17B", "b200_sxm", "bf16"): _qwen35_bf16_b200,
    ("sglang", "Qwen3.5-397B-A17B", "b300_sxm", "bf16"): _qwen35_b300(
        "benchmarks/single_node/qwen3.5_bf16_b300.sh @5632483", 0.82,
        _QWEN35_B300_UNMODELLED + ", --enable-flashinfer-allreduce-fusion"),
    ("sglang", "Qwen3.5-397B-A17B", "b300_sxm", "fp4"): _qwen35_b300(
        "benchmarks/single_node/qwen3.5_fp4_b300.sh @5632483", 0.8,
        _QWEN35_B300_UNMODELLED + ", --fp4-gemm-backend flashinfer_cutlass, --mamba-ssm-dtype bfloat16, "
        "--enable-flashinfer-allreduce-fusion (TP 8)"),
    ("vllm", "Kimi-K2.5", "b200_sxm", "fp4"): _kimi_fp4_vllm("benchmarks/single_node/kimik2.5_fp4_b200.sh @04107b3"),
    ("vllm", "Kimi-K2.5", "b300_sxm", "fp4"): _kimi_fp4_vllm("benchmarks/single_node/kimik2.5_fp4_b300.sh @5632483"),
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8"): _dsr1_trt,
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp4"): _dsr1_fp4_b200_trt,
    ("trtllm", "DeepSeek-R1", "h200_sxm", "fp8"): _dsr1_trt,
    ("trtllm", "Llama-3.1-70B", "b200_sxm", "fp8"): _llama70b_fp8_b200_trt,
    ("trtllm", "Llama-3.1-70B", "b200_sxm", "fp4"): _llama70b_fp4_b200_trt,
    ("trtllm", "Llama-3.1-70B", "h200_sxm", "fp8"): _llama70b_fp8_h200_trt,
    ("vllm", "gpt-oss-120b", "h200_sxm", "fp4"): _gptoss_fp4_hopper_vllm("benchmarks/gptoss_fp4_h200.sh @16cd955"),
    ("vllm", "gpt-oss-120b", "h100_sxm", "fp4"): _gptoss_fp4_hopper_vllm("benchmarks/gptoss_fp4_h100.sh @1fc5d73"),
}


# InferenceX names each configuration by its model prefix (`.github/configs/nvidia-master.yaml`:
# `model-prefix: dsr1`, launched by `benchmarks/dsr1_<precision>_<gpu>[_<engine>].sh`), and keeps it at the
# head of the row ids of aiconfigurator's 2026-04-27 database dump (`dsr1_b200_sglang_fp8_agg_...`). That
# dump records those runs' checkpoint as deepseek-ai/DeepSeek-V3 (DeepSeek-R1-0528 in the yaml: the same
# architecture), so the model column alone misses the scripts they ran. prefix -> (the RECIPES model,
# the row models the prefix may stand for).
_INFERENCEX_MODEL_PREFIXES: dict[str, tuple[str, tuple[str, ...]]] = {
    "dsr1": ("DeepSeek-R1", ("DeepSeek-R1", "DeepSeek-V3")),
}


def recipe_model(row: Any) -> str:
    """The model a row's InferenceX recipe is filed under: its id's InferenceX model prefix where the
    table knows it and the row's model is that configuration's architecture, else the row's model."""
    model = str(row.get("model"))
    prefix = str(row.get("id", "")).split("_", 1)[0]
    known = _INFERENCEX_MODEL_PREFIXES.get(prefix)
    if known is not None and model in known[1]:
        return known[0]
    return model


# DeepSeek-R1's MTP drafts on InferenceX's benchmark prompts: random token ids sent through the chat template
# (`--use-chat-template` in every DeepSeek-R1 MTP script, e.g. benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2;
# SemiAnalysisAI/InferenceX PR #1079 made it a rule for every MTP script). SemiAnalysisAI/InferenceX PR #649
# (2026-02-05, "add --use-chat-template to mi355x fp8 disagg with mtp") measured DeepSeek-R1's MTP acceptance
# length (tokens a verify step, the bonus token counted) on such prompts: ~2.50 with the chat template, what
# MT-Bench's real prompts give (~2.50), and ~3.55 without it. A length of 3.55 needs at least 3 drafts (a step
# yields at most 1 + k tokens); InferenceX's DeepSeek-R1 MTP entries draft 3 (num_nextn_predict_layers 3,
# DECODE_MTP_SIZE=3), taken as the depth of both figures.
MTP_ACCEPTANCE_LENGTH = 2.50
MTP_ACCEPTANCE_LENGTH_DEPTH = 3


def acceptance_length(rate: float, depth: int) -> float:
    """Expected tokens a verify step yields with `depth` drafts, each accepted with `rate` given the ones
    before it: 1 + rate + rate^2 + ... + rate^depth (the target's own token always counts)."""
    return sum(rate ** i for i in range(depth + 1))


def conditional_rate(length: float, depth: int) -> float:
    """The rate, the same at every drafted position, whose acceptance_length at `depth` drafts is `length`."""
    if depth < 1 or not 1.0 <= length <= depth + 1:
        raise ValueError(f"an acceptance length of {length} cannot come from {depth} drafts (1 to {depth + 1})")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: acceptance_length rises with the rate
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if acceptance_length(mid, depth) < length else (lo, mid)
    return (lo + hi) / 2


# P(a drafted position is accepted | the ones before it were) for DeepSeek-R1's MTP drafts: the rate that gives
# MTP_ACCEPTANCE_LENGTH at 3 drafts (0.691), the same at every position (the same layer reused, TensorRT-LLM's
# MTP Eagle; no public source read gives DeepSeek-R1's per-position rates on these prompts). It was 0.85, the
# DeepSeek-V3 Technical Report's figure (arXiv:2412.19437, section 5.4.3: the second token's acceptance 85% to
# 90% across generation topics), which natural text gives: 3.19 tokens a step at 3 drafts, where InferenceX's
# prompts give 2.50. Not fitted to any row (docs/validate-accuracy.md, "MTP acceptance on InferenceX's prompts").
MTP_ACCEPTANCE = conditional_rate(MTP_ACCEPTANCE_LENGTH, MTP_ACCEPTANCE_LENGTH_DEPTH)


def mtp_script_max_num_tokens(mtp: int, max_batch_size: int, isl: int) -> int:
    """The step budget InferenceX's DeepSeek-R1 TensorRT-LLM MTP scripts pass: `MAX_NUM_TOKENS=$((
    ((MTP+1)*MAX_BATCH_SIZE+ISL+64+63)/64*64 ))`, a whole prompt beside every sequence's verify rows, rounded up
    to 64 (benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2, dsr1_fp8_b200_trt_mtp.sh @7506aee, dsr1_fp8_h200_trt_mtp.sh
    @1fc5d73, single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788; MAX_BATCH_SIZE is CONC without attention DP).
    With chunked prefill off (the PyTorch backend's default) a step holds one prompt of ISL and every running
    sequence's MTP + 1 rows, so prompts that arrive together are prefilled one a step."""
    return ((mtp + 1) * max_batch_size + isl + 64 + 63) // 64 * 64


def rank_max_num_tokens(recipe: Recipe, conc: int, isl: int, ranks: int) -> int:
    """One attention-DP rank's step budget under a recipe with mtp_rank_budget (0 without, or with one rank);
    under adp_rank_budget, the recipe's max_num_tokens (the non-MTP scripts pass the same budget at every layout,
    and TensorRT-LLM's max_num_tokens is each rank's scheduler's).
    With DP_ATTENTION the MTP scripts set `MAX_BATCH_SIZE=$((CONC/TP))` (TP the GPUs, each an attention-DP rank)
    and pass `--max_batch_size=$MAX_BATCH_SIZE --max_num_tokens=$MAX_NUM_TOKENS` with MAX_NUM_TOKENS from it
    (SemiAnalysisAI/InferenceX benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2 and dsr1_fp8_h200_trt_mtp.sh @1fc5d73,
    the `if [[ "$DP_ATTENTION" == "true" ]]; then MAX_BATCH_SIZE=$((CONC/TP))` block before MAX_NUM_TOKENS; and
    benchmarks/single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788, CONC / 8). TensorRT-LLM builds one scheduler per
    rank from max_batch_size and max_num_tokens (_util.py `create_py_executor_instance`: BindMicroBatchScheduler;
    SchedulerConfig.adp_per_rank): the budget holds one rank's prompt beside that rank's sequences' verify rows.
    The single_node FP8 script sets `MAX_BATCH_SIZE=$(( CONC < 8 ? CONC : CONC / 8 ))` (mtp_rank_whole_below 8)."""
    if recipe.adp_rank_budget and ranks > 1:
        return recipe.max_num_tokens
    if not recipe.mtp_rank_budget or ranks <= 1:
        return 0
    per_rank = conc if conc < recipe.mtp_rank_whole_below else conc // ranks
    return mtp_script_max_num_tokens(recipe.mtp, per_rank, isl)


def _dsr1_b200_trt_mtp(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # benchmarks/dsr1_fp8_b200_trt_mtp.sh @111f031 and dsr1_fp4_b200_trt_mtp.sh @13dd0c2: MTP=1 with
    # DP_ATTENTION=true, else 3 (num_nextn_predict_layers in speculative_config); stream_interval 10;
    # kv_cache_config free_gpu_memory_fraction 0.8 (both scripts). The FP8 rows of image 1.2.0rc6.post3 ran the
    # later version of the FP8 script (PRECISION_IMAGES: _dsr1_fp8_b200_trt_mtp_rc6); the rows this recipe serves
    # are FP4 ones (MTP_IMAGES, LAYOUT_IMAGES). The FP4 script's `moe_config: backend` is TRTLLM without attention DP
    # (trtllm-gen NVFP4 experts at every token count: `aic_fp8_moe_kernel` 'trtllm', backends/sim/aic/trtgen.py)
    # and CUTLASS with it (CUTLASS NVFP4 experts at every token count: `aic_nvfp4_moe_kernel` 'cutlass').
    # `--max_num_tokens` (mtp_script_max_num_tokens): without attention DP the engine's; with it a rank's, of
    # MAX_BATCH_SIZE CONC / TP (rank_max_num_tokens, resolved with the row's ranks).
    mtp = 1 if attention_dp else 3
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp{{4,8}}_b200_trt_mtp.sh @13dd0c2/111f031 (image "
                  "1.2.0rc6.post3: .github/configs/nvidia-master.yaml @48f302c, dsr1-fp{4,8}-b200-trt-mtp)",
                  stream_interval=10, mtp=mtp, mem_fraction=0.8,
                  fp8_moe_kernel="" if attention_dp else "trtllm", nvfp4_moe_kernel="cutlass" if attention_dp else "",
                  max_num_tokens=0 if attention_dp else mtp_script_max_num_tokens(mtp, conc, isl),
                  mtp_rank_budget=attention_dp,
                  adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,  # `attention_dp_config` (DP_ATTENTION only)
                  unmodelled="cuda_graph_config, --max_batch_size")


def _dsr1_fp8_h200_trt_mtp(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # benchmarks/dsr1_fp8_h200_trt_mtp.sh @1fc5d73 (the script of dsr1-fp8-h200-trt-mtp, image
    # release:1.1.0rc2.post2): `MOE_BACKEND="CUTLASS"`, MTP=1 with DP_ATTENTION=true, else 3;
    # kv_cache_config free_gpu_memory_fraction 0.75 (dtype fp8, no block reuse); stream_interval 10;
    # cuda_graph_config max_batch_size 128 with padding; `--max_batch_size` CONC (CONC / TP with DP_ATTENTION) and
    # `--max_num_tokens $(( ((MTP+1)*MAX_BATCH_SIZE+ISL+64+63)/64*64 ))` (mtp_script_max_num_tokens; a rank's
    # under attention DP: rank_max_num_tokens); attention_dp_config timeout_iters 60 with DP_ATTENTION.
    mtp = 1 if attention_dp else 3
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_h200_trt_mtp.sh @1fc5d73 (dsr1-fp8-h200-trt-mtp)",
                  stream_interval=10, mtp=mtp, mem_fraction=0.75,
                  max_num_tokens=0 if attention_dp else mtp_script_max_num_tokens(mtp, conc, isl),
                  mtp_rank_budget=attention_dp,  # a rank's under attention DP (rank_max_num_tokens)
                  adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,  # `attention_dp_config` (DP_ATTENTION only)
                  unmodelled="moe_config backend CUTLASS, cuda_graph_config, --max_batch_size")


def _dsr1_h200_trt_mtp(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe | None:
    # H200's MTP and non-MTP benchmarks share one image (release:1.1.0rc2.post2), but only
    # dsr1-fp8-h200-trt-mtp runs more than 64 clients (dsr1-fp8-h200-trt's search space ends at 64 for
    # every ISL/OSL; nvidia-master.yaml @48f302c): those rows are MTP runs. The rows up to 64 are told by
    # layout and date where they can be (fp8_h200_rc2_runs_mtp, LAYOUT_IMAGES); this rule serves the rest.
    if conc <= 64:
        return None
    r = _dsr1_fp8_h200_trt_mtp(isl, osl, conc, tp, attention_dp)
    return replace(r, source=f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_h200_trt_mtp.sh @1fc5d73 (over 64 clients "
                   "only dsr1-fp8-h200-trt-mtp runs: .github/configs/nvidia-master.yaml @48f302c)")


def _dsr1_fp8_b200_trt_rc6(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # nvidia-master.yaml @0a919c5 runs dsr1-fp8-b200-trt (no speculation) from release:1.2.0rc6.post2 (as
    # @48f302c), with TP 8 / TP 4 at EP 1 below 256 clients: the rows of that image. Its script,
    # benchmarks/dsr1_fp8_b200_trt.sh @0a919c5 (and @4a98d80, which agrees on every flag taken here):
    # `moe_config: backend: TRTLLM` (DEEPGEMM only at 1k/8k from 256 clients; at 1k/1k from 256 the two
    # versions differ, so the kernel is left to aic's table there), stream_interval 10,
    # free_gpu_memory_fraction 0.8 (0.75 at 8k/1k TP 4, 0.7 at 1k/8k from 256), `--max_num_tokens` =
    # max(8192, CONC + ISL + 64 rounded up to 64) (8,192 at 1k/1k below 256 clients, the budget the batch
    # wait's ratio is of), and at 1k/1k from 64 clients (below 256 in @0a919c5) `batch_wait_timeout_iters:
    # 40, batch_wait_max_tokens_ratio: 0.8`.
    # The older script (@6320e9b: DEEPGEMM, no per-length flags) fits the earlier configuration, which
    # InferenceMAX/InferenceMAX nvidia-master.yaml @525079a runs from release:1.1.0rc2.post2 at EP 8.
    big = conc >= 256
    kernel = "" if big and (isl, osl) in ((1024, 8192), (1024, 1024)) else "trtllm"
    mem = 0.7 if big and (isl, osl) == (1024, 8192) else 0.75 if (isl, osl) == (8192, 1024) and tp == 4 else 0.8
    wait = (isl, osl) == (1024, 1024) and 64 <= conc < 256
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_b200_trt.sh @0a919c5 (image 1.2.0rc6.post2: "
                  ".github/configs/nvidia-master.yaml @0a919c5, dsr1-fp8-b200-trt)",
                  stream_interval=10, fp8_moe_kernel=kernel, mem_fraction=mem,
                  batch_wait_iters=40 if wait else 0, batch_wait_ratio=0.8 if wait else 0.0,
                  adp_balance_iters=ADP_BALANCE_TIMEOUT_ITERS,  # `attention_dp_config` (DP_ATTENTION only)
                  unmodelled="cuda_graph_config (padding, max_batch_size CONC), piecewise CUDA graphs, "
                             "--max_num_tokens (8,192 where the batch wait applies: the engine default the "
                             "study runs), --max_seq_len")


def _dsr1_fp8_b200_trt_mtp_rc6(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # The release:1.2.0rc6.post3 image came to dsr1-fp8-b200-trt-mtp with SemiAnalysisAI/InferenceX PR #632
    # ("[NV] dsr1 fp8 b200 trt agg mtp update", 2026-02-05; perf-changelog.yaml @000de6d: "Update to the latest
    # TRTLLM 1.2 release container version", TP only for most points, piecewise CUDA graphs). Its description:
    # "For most of the tests we switch to the TRTLLM backend", DEEPGEMM only for the attention-DP points (with
    # ENABLE_CONFIGURABLE_MOE=1). The rows of that image were measured 2026-02-05 / 02-06 at the layouts it sets
    # (TP 8 with EP 1, or attention DP 8). The script as that PR left it (benchmarks/single_node/
    # dsr1_fp8_b200_trt_mtp.sh @2f3a788, the later copy): MOE_BACKEND TRTLLM, MTP 3, free_gpu_memory_fraction
    # 0.8, piecewise CUDA graphs above the narrow counts; with DP_ATTENTION DEEPGEMM, MTP 1, 0.7, max_batch_size
    # CONC / 8. The earlier copies (benchmarks/dsr1_fp8_b200_trt_mtp.sh @7506aee, @111f031: DEEPGEMM at every
    # point, cuda graphs to 256) predate PR #632 and its image. TensorRT-LLM's TRTLLM backend runs FP8
    # block-scaled experts on trtllm-gen (`get_moe_cls`: TRTLLM + fp8_block_scales -> TRTLLMGenFusedMoE,
    # tensorrt_llm/_torch/modules/fused_moe/create_moe.py): backends/sim/aic/trtgen.py's price.
    r = _dsr1_b200_trt_mtp(isl, osl, conc, tp, attention_dp)
    return replace(r, source=f"{_INFERENCEX_REPO} benchmarks/single_node/dsr1_fp8_b200_trt_mtp.sh @2f3a788 as PR "
                   "#632 left it (image 1.2.0rc6.post3, dsr1-fp8-b200-trt-mtp)",
                   fp8_moe_kernel="" if attention_dp else "trtllm", nvfp4_moe_kernel="",
                   mem_fraction=0.7 if attention_dp else 0.8,
                   mtp_rank_whole_below=8,  # `MAX_BATCH_SIZE=$(( CONC < 8 ? CONC : CONC / 8 ))` (DP_ATTENTION)
                   unmodelled="piecewise CUDA graphs, cuda_graph_config max_batch_size, --max_batch_size (CONC / 8 "
                              "under attention DP), ENABLE_CONFIGURABLE_MOE")


# The MoE backend of DeepSeek-R1 FP8 TensorRT-LLM disaggregated workers, by launch group: the (MoE EP, attention DP)
# worker shapes whose recipes set `moe_config: backend: TRTLLM` (aic's `fp8_block` rows are DeepGEMM's:
# backends/sim/aic/trtgen.py).
# - B200 (the srt-slurm recipes InferenceX's dsr1-fp8-b200-dynamo-trt entries launch, ishandhanani/srt-slurm
#   recipes/trtllm/b200-fp8): every worker read at `moe_expert_parallel_size: 1` sets TRTLLM
#   (1k1k/stp/ctx1_gen3_tp8_batch1024_eplb0_mtp0_128 and 1k1k/mtp/ctx1_gen8_tp8_batch4_eplb0_mtp3_32 decode @fe2cd90;
#   8k1k/stp/ctx1_gen4_tp8_batch32_eplb0_mtp0_128, ctx1_gen6_tp8_batch16_eplb0_mtp0_96 prefill and decode and
#   8k1k/mtp/ctx2_gen3_dep8_batch8_eplb0_mtp3_224 prefill @e71238b), every one at EP 8 `DEEPGEMM` (the 1k/1k prefill
#   workers, the DEP 8 decode of ctx2_gen3_dep8): aic's own table there.
# - B300 (dsr1-fp8-b300-dynamo-trt: recipes/trtllm/b300-fp8/{1k1k,8k1k}/{mtp,stp}/, the sa-submission-q1-2026
#   recipes nvidia-master.yaml @0004cf5 names; the one stored copy is the fork connorcarpenter15/srt-slurm @5a156f6,
#   whose file names are the matrix's): every worker read sets TRTLLM, the prefill workers (TP 4, attention DP, EP 1)
#   and the decode workers at EP 1 (`tp8`, `dp8`) and at EP 8 (`dep8`): 8k1k/mtp ctx1_gen4_tp8_batch1_eplb0_mtp3_8,
#   ctx1_gen4_tp8_batch4_eplb0_mtp3_20, ctx1_gen2_tp8_batch16_eplb0_mtp3_40, ctx1_gen1_dp8_batch8_eplb0_mtp3_72,
#   ctx2_gen1_dp8_batch16_eplb0_mtp3_144; 8k1k/stp ctx1_gen8_tp8_batch2_eplb0_mtp0_16,
#   ctx1_gen4_tp8_batch16_eplb0_mtp0_64, ctx3_gen5_tp8_batch64_eplb0_mtp0_256, ctx7_gen1_dep8_batch384_eplb0_mtp0_3072;
#   1k1k/mtp ctx1_gen8_tp8_batch1_eplb0_mtp3_10, ctx1_gen8_tp8_batch16_eplb0_mtp3_160,
#   ctx1_gen5_dep8_batch16_eplb0_mtp2_720, ctx1_gen2_dep8_batch128_eplb0_mtp1_2560; 1k1k/stp
#   ctx1_gen8_tp8_batch64_eplb0_mtp0_12, ctx1_gen1_dep8_batch256_eplb0_mtp0_2112 (15 of the 27 files; some of the
#   fork's files run other `concurrencies` than their names give). Until 2026-12-06 these workers kept aic's DeepGEMM
#   rows: a TP 8 decode step of DeepSeek-R1 at 4 rows priced 12.1 ms on B300 against 7.4 ms on B200's TRTLLM experts
#   (58 MoE layers, DeepGEMM 0.13 ms a layer there against trtllm-gen's 0.05).
# - GB300 (dsr1-fp8-gb300-dynamo-trt: recipes/trtllm/gb300-fp8/{1k1k,8k1k,1k8k}/{mtp,stp}/, the files the matrix names;
#   all 39 of the fork connorcarpenter15/srt-slurm @5a156f6 read, and NVIDIA/srt-slurm's own copies at @527855c
#   (8k1k/mtp/ctx1_gen4_tep8_batch1_eplb0_mtp3_8), @93c7904 (1k1k/stp/ctx1_gen4_tep8_batch1_eplb0_mtp0_4), @69ad102
#   (1k8k/mtp/ctx1_gen4_tep8_batch4_eplb0_mtp3_16), @9f8ddd9 (8k1k/mtp/ctx8_gen1_dep16_batch64_eplb0_mtp3_666) agree):
#   the decode workers at TP attention with EP 8 (`tep8`: `enable_attention_dp: false`, `moe_expert_parallel_size: 8`)
#   set TRTLLM (13 files: 1k1k mtp _8, _24, stp _4, _24, _84; 8k1k mtp _8, _24, stp _4, _24, _36; 1k8k mtp _4, _16,
#   stp _4, _36); the attention-DP decode workers (`dep8`, `dep16`, `dep32`: EP 8, 16, 32) set DEEPGEMM, and so does
#   every prefill worker (TP 4, attention DP, EP 4). So EP alone does not tell GB300's TRTLLM workers apart (EP 8 is
#   both): the table holds (EP, attention DP) pairs. The fork's decode workers also export `ENABLE_CONFIGURABLE_MOE=1`
#   (NVIDIA's earlier copies do not), which wraps the same expert class in ConfigurableMoE and keeps its kernel:
#   NVIDIA/TensorRT-LLM tensorrt_llm/_torch/modules/fused_moe/create_moe.py @01f8de5 `create_moe` (`get_moe_cls`:
#   TRTLLM + fp8_block_scales -> TRTLLMGenFusedMoE, DEEPGEMM -> DeepGemmFusedMoE, either wrapped). aic's GB300 SGLang
#   0.5.14 table (device "NVIDIA GB300") holds the trtllm-gen FP8 block-scale rows at MoE TP 1, EP 8.
# Only for rows whose workers an InferenceX entry gives (sim/validate_inferencex.py).


def _any_attention(*eps: int) -> frozenset[tuple[int, bool]]:
    """(MoE EP, attention DP) pairs: these EPs with attention DP on or off."""
    return frozenset((ep, adp) for ep in eps for adp in (False, True))


DISAGG_TRTGEN_WORKERS: dict[tuple[str, str, str, str], frozenset[tuple[int, bool]]] = {
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8"): _any_attention(1),
    ("trtllm", "DeepSeek-R1", "b300_sxm", "fp8"): _any_attention(1, 8),
    ("trtllm", "DeepSeek-R1", "gb300", "fp8"): frozenset({(8, False)}),
}


def disagg_fp8_moe_kernel(row: Any, moe_ep: int, attention_dp: bool) -> str:
    """aic_fp8_moe_kernel of a disaggregated worker at MoE EP `moe_ep`, attention DP on or off, of this row:
    'trtllm' where its launch group's recipes run the TRTLLM MoE backend at that EP and attention
    (DISAGG_TRTGEN_WORKERS), else 'default'."""
    key = (str(row.get("backend")), recipe_model(row), str(row.get("system")), str(row.get("precision")))
    return "trtllm" if (moe_ep, bool(attention_dp)) in DISAGG_TRTGEN_WORKERS.get(key, frozenset()) else "default"


# The MoE backend of DeepSeek-R1 NVFP4 GB200 TensorRT-LLM disaggregated prefill ("ctx") workers: both GB200 FP4
# recipes in the library run their ctx worker at TP 4 / EP 4 with attention DP and `moe_config: backend: TRTLLM`
# (ishandhanani/srt-slurm recipes/trtllm/gb200-fp4/8k1k/mtp/ctx1_gen4_tep8_batch4_eplb0_mtp3.yaml @46d030c, the
# recipe of InferenceX's 8k/1k MTP entry at 4-48 clients; 1k8k/mtp/ctx1_gen7_tep8_batch1_eplb0_mtp3_lowconc.yaml
# @12b62f4), the shape every dsr1-fp4-gb200-dynamo-trt entry gives its prefill workers (sim/validate_inferencex.py);
# TensorRT-LLM's deployment guide allows CUTLASS or TRTLLM for NVFP4 at EP <= 8 (quick-start-recipe-for-deepseek-r1-
# on-trtllm.md @a98a906, "MoE Backend Support Matrix"). TRTLLM runs NVFP4 experts on trtllm-gen (create_moe.py
# `get_moe_cls`: TRTLLMGenFusedMoE); aic answers its CUTLASS rows above 128 gathered tokens, which every prompt step
# passes: backends/sim/aic/trtgen.py Nvfp4Trtgen prices them on aic's own trtllm-gen rows.
DISAGG_TRTGEN_PREFILL_WORKERS = {("trtllm", "DeepSeek-R1", "gb200", "fp4")}
DISAGG_TRTGEN_PREFILL_MAX_EP = 8


def disagg_prefill_trtgen(row: Any, moe_ep: int) -> bool:
    """Whether a disaggregated prefill worker at MoE EP `moe_ep` of this row runs TensorRT-LLM's TRTLLM MoE backend
    on NVFP4 experts (DISAGG_TRTGEN_PREFILL_WORKERS, to EP DISAGG_TRTGEN_PREFILL_MAX_EP)."""
    key = (str(row.get("backend")), recipe_model(row), str(row.get("system")), str(row.get("precision")))
    return key in DISAGG_TRTGEN_PREFILL_WORKERS and moe_ep <= DISAGG_TRTGEN_PREFILL_MAX_EP


# TensorRT-LLM's MoE backend of DeepSeek-R1 NVFP4 workers on GB200 NVL72 at EP > 8: WIDEEP. NVIDIA/TensorRT-LLM
# docs/source/deployment-guide/quick-start-recipe-for-deepseek-r1-on-trtllm.md @a98a906, "MoE Backend Support Matrix":
# "GB200 NVL72 EP>8 | NVFP4 | WIDEEP" (EP <= 8: CUTLASS or TRTLLM; "The default moe backend is CUTLASS, so for the
# combination which is not supported by CUTLASS, one must set the moe_config.backend explicitly"); TensorRT-LLM's own
# disaggregated DEP 32 generation example sets `moe_config: backend: WIDEEP` (its disaggregated benchmark README, a
# stored copy). The later srt-slurm recipe of the same worker shape on GB300 (NVIDIA/srt-slurm recipes/trtllm/
# gb300-fp8/1k1k/stp/ctx2_gen1_dep32_batch32_eplb0_mtp0_1229.yaml @3aea726: FP8, DEP 32) runs ConfigurableMoE instead
# (`ENABLE_CONFIGURABLE_MOE=1`, DEEPGEMM experts) with `TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED`: the same NVLink
# two-sided all-to-all; the GB200 FP4 rows' own recipe is not in the library (their expert kernel not read). Priced by
# aic's large-EP decode block (backends/sim/aic/graph.py _wide_ep_generation_ops), whose all-to-all only aic's GB200
# TensorRT-LLM tables hold (comm/trtllm/1.3.0rc10 trtllm_alltoall). FP8 at EP > 8 ("WIDEEP without EPLB") is not
# carried: aic holds no Blackwell FP8 wide-EP expert table (moe/trtllm/1.3.0rc10 wideep_moe_perf: nvfp4 only there).
# GB300 NVFP4 at EP > 8: the recipes InferenceX's dsr1-fp4-gb300-dynamo-trt entries launch (connorcarpenter15/srt-slurm
# @5a156f6 recipes/trtllm/gb300-fp4/, the matrix's file names; every DEP 16 / DEP 32 decode worker read, 1k1k, 1k8k,
# 8k1k, MTP or not: e.g. 1k1k/stp/ctx3_gen1_dep32_batch64_eplb0_mtp0.yaml, 8k1k/stp/ctx9_gen1_dep16_batch64_eplb0_
# mtp0.yaml) set `moe_config: backend: CUTEDSL`, `use_low_precision_moe_combine: true` under attention DP, and no
# TRTLLM_FORCE_COMM_METHOD (DEP 4 / DEP 8 workers: CUTLASS): TensorRT-LLM's own choice of all-to-all over the NVL72
# NVLink domain (communication_factory.py `create_strategy`, NVIDIA/TensorRT-LLM @03c36d6: NVLinkOneSided, then
# NVLinkTwoSided, before any network path; which of the two the rows' image chose is not read). Priced by the same
# large-EP block: its all-to-all from GB200's NVLinkTwoSided tables, a cross-system proxy (aic holds none for GB300;
# aic's gb200.yaml and gb300.yaml give both the same NVLink 5 figures: graph.py WIDE_EP_A2A_PROXY), its expert
# compute from GB300's own wide-EP NVFP4 table (CUTLASS rows: aic holds no CuteDSL MoE timings).
# GB300 FP8 at EP > 8: every DEP 16 / DEP 32 decode worker of the dsr1-fp8-gb300-dynamo-trt recipes (the fork's 39
# files, docs/validate-accuracy.md "gb300trt"; NVIDIA/srt-slurm's copies 1k1k/stp/ctx2_gen1_dep32_batch32_eplb0_mtp0_1229
# @3aea726, 1k1k/mtp/ctx2_gen1_dep16_batch128_eplb0_mtp1_2253 @4729d9e, 8k1k/stp/ctx7_gen1_dep16_batch64_eplb0_mtp0_1229
# @5f23377) exports ENABLE_CONFIGURABLE_MOE=1 and TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED with `moe_config: backend:
# DEEPGEMM`: the same NVLink two-sided all-to-all (GB200's tables, the proxy) around aic's own DeepGEMM experts (its
# MoE table; graph.py _wide_ep_generation_ops for experts the wide-EP table has no rows for). Their DEP 8 workers
# (the same exports) and the FP4 DEP 4 / DEP 8 ones (CUTLASS, the engine's own all-to-all choice) keep aic's fused
# block: WIDE_EP_MIN_EP, as on GB200.
WIDE_EP_WORKERS = {("trtllm", "DeepSeek-R1", "gb200", "fp4"), ("trtllm", "DeepSeek-R1", "gb300", "fp4"),
                   ("trtllm", "DeepSeek-R1", "gb300", "fp8")}
WIDE_EP_MIN_EP = 9


def disagg_wide_ep(row: Any, moe_ep: int) -> bool:
    """Whether a disaggregated worker at MoE EP `moe_ep` of this row runs TensorRT-LLM's WIDEEP MoE backend
    (WIDE_EP_WORKERS, from EP WIDE_EP_MIN_EP)."""
    key = (str(row.get("backend")), recipe_model(row), str(row.get("system")), str(row.get("precision")))
    return key in WIDE_EP_WORKERS and moe_ep >= WIDE_EP_MIN_EP


# MiniMax-M2.5 FP8 vLLM on H200 and B200, told apart by the rows' image (vLLM v0.16.0 / v0.18.0 on H200, measured
# 2026-03-01 and 2026-03-27/28; v0.17.0 on B200, 2026-03-11 and 03-28). The script versions those dates fall between:
# - H200 before SemiAnalysisAI/InferenceX#869 (merged 2026-03-05, "H200 MINIMAX vLLM extend configs": TP 4 -> 8, and
#   the script's EP_SIZE check added): benchmarks/single_node/minimaxm2.5_fp8_h200.sh @1c3aa8b, --gpu-memory-
#   utilization 0.95 and no --enable-expert-parallel, no --kv-cache-dtype. The v0.16.0 rows (TP 4) ran it.
# - From #869 until #1354 (merged 2026-05-12, after every row: it adds `--kv-cache-dtype fp8`, `--moe-backend triton`
#   and per-CONC --max-num-batched-tokens, @0949de5 as read): `if [ "$EP_SIZE" -ge 1 ]; then EP=" --enable-expert-
#   parallel"`, always true (SemiAnalysisAI/InferenceX#966's review, 2026-03-27, names the guard in both the H200 and
#   the B200 FP8 script "a pre-existing bug ... making the else branch ... unreachable"; whn09/InferenceX @53605e0 and
#   lishuoshuo-amd/InferenceX @f2931b4, the latter after #966's --no-enable-prefix-caching, still carry it), 0.95,
#   no --kv-cache-dtype. The v0.18.0 rows (TP 8) ran it: their experts EP 8, not TP 8 as the rows' columns say.
# - B200: benchmarks/single_node/minimaxm2.5_fp8_b200.sh @13453b4 passes --enable-expert-parallel unconditionally and
#   @07e171a through the same `-ge 1` guard; both --gpu-memory-utilization 0.95, --block-size 32, no --kv-cache-dtype
#   (@07e171a also `VLLM_USE_FLASHINFER_MOE_FP8=0`, `VLLM_MOE_USE_DEEP_GEMM=0`, as vllm-project/recipes#272 of
#   2026-03-11 gives for B200 FP8 from InferenceX#757). The later versions (`-gt 1`, --kv-cache-dtype fp8,
#   --max-num-batched-tokens ISL x 2: lishuoshuo-amd/InferenceX @f2931b4, xinli-sw/InferenceX @09fc774) are not
#   tied to an image; the v0.19.0 rows keep the defaults (their layouts written tp T x attention DP T, EP T x T are
#   the entry tp T, ep T on T GPUs: validate_layouts.vllm_tp_ep_layout).
# The K/V dtype of these launches (no flag: bf16 on MiniMax-M2.5's block-FP8 checkpoint) is KV_AUTO_LAUNCHES' /
# KV_AUTO_IMAGES'.
_MINIMAX_UNMODELLED_B200 = "--block-size 32"


# The experts' kernel of the v0.17.0 B200 rows (all 40 of them, and no other row): the image's script exported
# VLLM_USE_FLASHINFER_MOE_FP8=0 and VLLM_MOE_USE_DEEP_GEMM=0 from InferenceX#757 (its diff under review on 2026-03-05
# already exports the first; vllm-project/recipes#272 of 2026-03-11 gives both for B200 FP8 from #757) until #947
# (2026-04-03) removed both with the move to v0.19.0 (@07e171a is the version read; @13453b4, with neither, is an
# earlier copy). With both set vLLM v0.17.0 runs its Triton fused-MoE (oracle/fp8.py select_fp8_moe_backend:
# backends/sim/aic/vllm_triton.py), while aic's vLLM 0.24.0 B200 table times FlashInfer TRTLLM only: priced from
# aic's vLLM 0.19.0 B200 Triton rows ('triton'). The other MiniMax-M2.5 FP8 groups keep the model's table, which
# times the kernel vLLM picks there by default: H200 v0.18.0 / H100 v0.18.0 (experts EP > 1): FlashInfer CUTLASS
# (fp8.py's "On Hopper for Block Fp8, prefer Triton for TP and FI CUTLASS for EP", v0.17.0 on), the only source of
# aic's 0.24.0 Hopper rows at EP > 1; B200 / B300 v0.19.0: FlashInfer TRTLLM through its modular experts
# (TrtLlmFp8ExpertsModular, v0.18.0 on: the monolithic one refuses MiniMax's routing), aic's trtllm-gen rows. Not
# carried: H200 v0.16.0 (TP 4, experts TP): v0.16.0 has no Hopper reordering, so FlashInfer CUTLASS comes first and
# supports block FP8 on 9.0, but aic's Hopper rows of it at this shape are EP-only (its Triton rows, the ones priced,
# are TP-only).
_MINIMAX_B200_V017_FP8_MOE_KERNEL = "triton"


def _minimax_fp8_h200_v016(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/minimaxm2.5_fp8_h200.sh @1c3aa8b (before #869; image "
                  "v0.16.0)", mem_fraction=0.95)


def _minimax_fp8_h200_v018(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/minimaxm2.5_fp8_h200.sh between #869 and #1354 "
                  "(whn09/InferenceX @53605e0; image v0.18.0)", mem_fraction=0.95, expert_parallel=True)


def _minimax_fp8_b200_v017(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    return Recipe(f"{_INFERENCEX_REPO} benchmarks/single_node/minimaxm2.5_fp8_b200.sh @07e171a / @13453b4 (image "
                  "v0.17.0)", mem_fraction=0.95, expert_parallel=True, unmodelled=_MINIMAX_UNMODELLED_B200,
                  fp8_moe_kernel=_MINIMAX_B200_V017_FP8_MOE_KERNEL)


def _minimax_b300_v019(script: str) -> Callable[[int, int, int, int, bool], Recipe]:
    # benchmarks/single_node/minimaxm2.5_fp{8,4}_b300.sh @5632483 (one version read each; both "reuse the existing
    # MiniMax-M2.5 FP8 (FP4) B200 vLLM recipe as-is"): --max-num-batched-tokens ISL x 2 (vLLM's step budget, chunked
    # prefill on as vLLM runs by default), --gpu-memory-utilization 0.90 (vLLM's default), --kv-cache-dtype fp8,
    # --enable-expert-parallel only where EP_SIZE > 1 (FP4: DP_ATTENTION runs TP 1 x DP $TP with EP, on the same
    # $TP GPUs; the rows' layouts: validate_layouts.vllm_tp_ep_layout). Taken for the v0.19.0 image's rows
    # (measured 2026-04-17 / 04-21).
    def recipe(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
        return Recipe(f"{_INFERENCEX_REPO} {script}", chunked_prefill_size=2 * isl,
                      unmodelled="--stream-interval 20, --max-cudagraph-capture-size 2048, --block-size 32 (FP8)")
    return recipe


# (backend, model, system, precision, backend_version) -> the recipe of a row of that precision measured from
# that image, where the image tells one script version from another (the image of MTP_IMAGES' note).
PRECISION_IMAGES: dict[tuple[str, str, str, str, str], Callable[[int, int, int, int, bool], Recipe]] = {
    ("sglang", "DeepSeek-R1", "b200_sxm", "fp4", ""): _dsr1_fp4_b200_ep_moe,  # no image: before PR #204
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8", "1.2.0rc6.post2"): _dsr1_fp8_b200_trt_rc6,
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8", "1.2.0rc6.post3"): _dsr1_fp8_b200_trt_mtp_rc6,
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp4", "1.2.0rc6.post2"): _dsr1_fp4_b200_trt_rc6,
    ("vllm", "MiniMax-M2.5", "h200_sxm", "fp8", "0.16.0"): _minimax_fp8_h200_v016,
    ("vllm", "MiniMax-M2.5", "h200_sxm", "fp8", "0.18.0"): _minimax_fp8_h200_v018,
    ("vllm", "MiniMax-M2.5", "b200_sxm", "fp8", "0.17.0"): _minimax_fp8_b200_v017,
    ("vllm", "MiniMax-M2.5", "b300_sxm", "fp8", "0.19.0"): _minimax_b300_v019(
        "benchmarks/single_node/minimaxm2.5_fp8_b300.sh @5632483"),
    ("vllm", "MiniMax-M2.5", "b300_sxm", "fp4", "0.19.0"): _minimax_b300_v019(
        "benchmarks/single_node/minimaxm2.5_fp4_b300.sh @5632483"),
}


# DeepSeek-R1 FP4 B200 TensorRT-LLM from release:1.1.0rc2.post2: dsr1-fp4-b200-trt and dsr1-fp4-b200-trt-mtp share
# the image (nvidia-master.yaml @0a919c5 and InferenceMAX/InferenceMAX @525079a, whose two search spaces are the
# same), but not every layout at every client count: (ISL, OSL) -> (TP, EP, attention DP, first, last clients) of
# each. A row whose layout and count only one of them holds ran that one; where both hold it, nothing is told.
_FP4_B200_RC2_PLAIN = {
    (1024, 1024): ((4, 1, False, 4, 32), (4, 4, False, 64, 128), (4, 4, True, 256, 256), (8, 1, False, 4, 8),
                   (8, 8, False, 16, 128), (8, 8, True, 256, 256)),
    (1024, 8192): ((4, 1, False, 4, 32), (4, 4, False, 64, 128), (4, 4, True, 256, 256), (8, 1, False, 4, 16),
                   (8, 8, False, 32, 128), (8, 8, True, 256, 256)),
    (8192, 1024): ((4, 4, False, 4, 32), (4, 4, True, 64, 256), (8, 1, False, 4, 32), (8, 8, True, 64, 256)),
}
_FP4_B200_RC2_MTP = {
    (1024, 1024): ((4, 1, False, 4, 8), (4, 4, False, 16, 64), (4, 4, True, 128, 256), (8, 1, False, 4, 8),
                   (8, 8, False, 16, 32), (8, 8, True, 64, 256)),
    (1024, 8192): ((4, 1, False, 4, 16), (4, 4, False, 32, 64), (4, 4, True, 128, 256), (8, 1, False, 4, 4),
                   (8, 8, False, 8, 64), (8, 8, True, 128, 256)),
    (8192, 1024): ((4, 1, False, 4, 16), (4, 4, True, 32, 256), (8, 1, False, 4, 16), (8, 8, True, 32, 256)),
}


def _in_space(space: dict, isl: int, osl: int, conc: int, layout: tuple[int, int, bool]) -> bool:
    return any((tp, ep, dp) == layout and lo <= conc <= hi for tp, ep, dp, lo, hi in space.get((isl, osl), ()))


# The measurement dates (the dump rows' `measured=`) of the DeepSeek-R1 1.1.0rc2.post2 sweep that ran the MTP
# configurations. InferenceX PR #392 added the three of them, dsr1-fp4-b200-trt-mtp, dsr1-fp8-b200-trt-mtp and
# dsr1-fp8-h200-trt-mtp (perf-changelog.yaml @000de6d: "Add MTP (Multi-Token Prediction) support for single-node
# TRT configs"), and 2026-01-14 is the date of those three groups only: of every row in the dump, the ones measured
# that day are the B200 FP4 and FP8 and the H200 FP8 TensorRT-LLM DeepSeek-R1 aggregated rows of that image (the
# 2026-03-25 export stamps its B200 FP4 and H200 records of that day alike, 22:26:21Z).
# B200: the development rows of that image (FP4 and FP8, 40) were measured on two days. Every one measured
# 2026-01-14 lies in its precision's MTP search space, seven in it alone (e.g. FP4 1k/1k TP 4 EP 4 at 16 clients,
# FP8 1k/1k attention DP 8 at 128), none in the plain space alone; every one measured 2025-12-15 lies in the plain
# space alone (e.g. FP4 1k/1k TP 4 at 32 clients, FP8 8k/1k TP 8 EP 8 at 64). The dump keeps one record a point,
# so a point both spaces hold measured 2026-01-14 is the MTP configuration's: the plain configurations' own points
# carry the other day.
# H200 (_FP8_H200_RC2_PLAIN, _FP8_H200_RC2_MTP; configuration columns and dates read, no figure): the rows of that
# image measured 2026-01-14 (41 development records) are the 21 points of dsr1-fp8-h200-trt-mtp's space, every one
# of them and no other, six in it alone; the rows measured 2025-12-15 (B200's plain day; 15 records, all held out,
# the dump names their model DeepSeek-V3) are the 15 points of dsr1-fp8-h200-trt's space, every one and no other.
# Two development records carry 2026-01-28 (1k/8k TP 8 EP 8 at 64 clients, both spaces; 1k/8k attention DP 8 at
# 256, the MTP space alone), stamped with the same second as two H200 gpt-oss-120b TensorRT-LLM records: a run of
# several configurations, not either sweep; the first stays untold.
RC2_MTP_SWEEPS = ("2026-01-14",)


def measured_date(row: Any) -> str:
    """The `measured=YYYY-MM-DD` date of a dump row's silicon_data_source ('' where none)."""
    from twinserve.sim.validate_twins import measured_day
    return measured_day(row.get("silicon_data_source") or "")


def _rc2_runs_mtp(plain_space: dict, mtp_space: dict, isl: int, osl: int, conc: int, tp: int, ep: int,
                  attention_dp: int, measured: str) -> bool | None:
    """True / False where only the MTP / the plain configuration's search space holds this layout (TP as
    attention's tensor parallel size, or the ranks under attention DP) at this count, or True where both do and
    the row was measured on the MTP sweep's day (RC2_MTP_SWEEPS); None where nothing tells."""
    layout = (max(tp, attention_dp), ep, attention_dp > 1)
    mtp = _in_space(mtp_space, isl, osl, conc, layout)
    plain = _in_space(plain_space, isl, osl, conc, layout)
    if mtp != plain:
        return mtp
    return True if mtp and measured in RC2_MTP_SWEEPS else None


def _told_mtp_recipe(row: Any, runs_mtp: Callable[..., bool | None],
                     build: Callable[[int, int, int, int, bool], Recipe], source: str = "") -> Recipe | None:
    """build's recipe (its source replaced where `source` is given) for a row `runs_mtp` tells an MTP run (its folded
    dump layout unfolded, its measurement date read), else None (the image's other recipes decide)."""
    from twinserve.sim.validate_layouts import aggregated_layout
    tp, attention_dp, _, moe_ep = aggregated_layout(row)
    isl, osl, conc = _int(row.get("isl")), _int(row.get("osl")), _int(row.get("concurrency"), 1)
    if runs_mtp(isl, osl, conc, tp, moe_ep, attention_dp, measured_date(row)) is not True:
        return None
    r = build(isl, osl, conc, tp, attention_dp > 1)
    return replace(r, source=source) if source else r


def fp4_b200_rc2_runs_mtp(isl: int, osl: int, conc: int, tp: int, ep: int, attention_dp: int,
                          measured: str = "") -> bool | None:
    """_rc2_runs_mtp over dsr1-fp4-b200-trt's and dsr1-fp4-b200-trt-mtp's spaces."""
    return _rc2_runs_mtp(_FP4_B200_RC2_PLAIN, _FP4_B200_RC2_MTP, isl, osl, conc, tp, ep, attention_dp, measured)


def _dsr1_fp4_b200_trt_rc2(row: Any) -> Recipe | None:
    # The MTP configuration's script: benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2 (MTP 3 and TRTLLM experts, or
    # MTP 1 and CUTLASS under attention DP; CUTLASS priced as such: nvfp4_moe_kernel); plain or not told:
    # None (the image's other recipe stands).
    return _told_mtp_recipe(row, fp4_b200_rc2_runs_mtp, _dsr1_b200_trt_mtp,
                            f"{_INFERENCEX_REPO} benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2 (image "
                            "1.1.0rc2.post2: dsr1-fp4-b200-trt-mtp's layout at this count, or its sweep's date; "
                            "nvidia-master.yaml @0a919c5 and InferenceMAX @525079a)")


# DeepSeek-R1 FP8 B200 TensorRT-LLM from release:1.1.0rc2.post2: InferenceMAX/InferenceMAX nvidia-master.yaml @525079a
# runs dsr1-fp8-b200-trt and dsr1-fp8-b200-trt-mtp from that image, both at EP = TP 8 ("For all sequence lengths,
# EP=TP"), over these (ISL, OSL) -> (TP, EP, attention DP, first, last clients). The MTP space holds every plain
# point but one (8k/1k TP 8 EP 8 at 64 clients) and attention-DP points the plain one lacks (1k/1k from 128, 1k/8k
# from 128, 8k/1k from 64).
_FP8_B200_RC2_PLAIN = {
    (1024, 1024): ((8, 8, False, 4, 32), (8, 8, True, 64, 64)),
    (1024, 8192): ((8, 8, False, 4, 64),),
    (8192, 1024): ((8, 8, False, 4, 64),),
}
_FP8_B200_RC2_MTP = {
    (1024, 1024): ((8, 8, False, 4, 32), (8, 8, True, 64, 256)),
    (1024, 8192): ((8, 8, False, 4, 64), (8, 8, True, 128, 256)),
    (8192, 1024): ((8, 8, False, 4, 32), (8, 8, True, 64, 256)),
}


def fp8_b200_rc2_runs_mtp(isl: int, osl: int, conc: int, tp: int, ep: int, attention_dp: int,
                          measured: str = "") -> bool | None:
    """_rc2_runs_mtp over dsr1-fp8-b200-trt's and dsr1-fp8-b200-trt-mtp's spaces."""
    return _rc2_runs_mtp(_FP8_B200_RC2_PLAIN, _FP8_B200_RC2_MTP, isl, osl, conc, tp, ep, attention_dp, measured)


def _dsr1_fp8_b200_trt_mtp_rc2(isl: int, osl: int, conc: int, tp: int, attention_dp: bool) -> Recipe:
    # SemiAnalysisAI/InferenceX benchmarks/dsr1_fp8_b200_trt_mtp.sh @7506aee (and @111f031): `MOE_BACKEND="DEEPGEMM"`
    # at every point (aic's own fp8_block table: its `deepgemm` rows), MTP 3 (1 with DP_ATTENTION), `--max_batch_size`
    # CONC (CONC / TP a rank with DP_ATTENTION) and `--max_num_tokens` from it (mtp_script_max_num_tokens),
    # free_gpu_memory_fraction 0.8, stream_interval 10, CUDA graphs to 256 with padding.
    r = _dsr1_b200_trt_mtp(isl, osl, conc, tp, attention_dp)
    return replace(r, source=f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_b200_trt_mtp.sh @7506aee (image 1.1.0rc2.post2: "
                   "dsr1-fp8-b200-trt-mtp, InferenceMAX nvidia-master.yaml @525079a)", fp8_moe_kernel="",
                   nvfp4_moe_kernel="",
                   unmodelled="cuda_graph_config (padding, batch 256), --max_batch_size")


def _dsr1_fp8_b200_trt_rc2(row: Any) -> Recipe | None:
    # The MTP configuration's script where fp8_b200_rc2_runs_mtp says so; otherwise None (the image's other recipe,
    # _dsr1_trt, stands).
    return _told_mtp_recipe(row, fp8_b200_rc2_runs_mtp, _dsr1_fp8_b200_trt_mtp_rc2)


# DeepSeek-R1 FP8 H200 TensorRT-LLM from release:1.1.0rc2.post2: InferenceMAX/InferenceMAX nvidia-master.yaml @525079a
# runs dsr1-fp8-h200-trt and dsr1-fp8-h200-trt-mtp from that image ("For all sequence lengths, EP=TP"; the MTP one
# "MOE_BACKEND=CUTLASS, MTP=3 (or MTP=1 when DP_ATTN=true)"), over these (ISL, OSL) -> (TP, EP, attention DP, first,
# last clients). The MTP space holds every plain point, and points past the plain one's: 1k/1k attention DP 8 at
# 128-256, 1k/8k TP 8 EP 8 at 128 and attention DP 8 at 256, 8k/1k attention DP 8 at 128-256. So a row the plain
# configuration could have run is told by its date alone (RC2_MTP_SWEEPS).
_FP8_H200_RC2_PLAIN = {
    (1024, 1024): ((8, 8, False, 4, 64),),
    (1024, 8192): ((8, 8, False, 4, 64),),
    (8192, 1024): ((8, 8, False, 4, 32), (8, 8, True, 64, 64)),
}
_FP8_H200_RC2_MTP = {
    (1024, 1024): ((8, 8, False, 4, 64), (8, 8, True, 128, 256)),
    (1024, 8192): ((8, 8, False, 4, 128), (8, 8, True, 256, 256)),
    (8192, 1024): ((8, 8, False, 4, 32), (8, 8, True, 64, 256)),
}


def fp8_h200_rc2_runs_mtp(isl: int, osl: int, conc: int, tp: int, ep: int, attention_dp: int,
                          measured: str = "") -> bool | None:
    """_rc2_runs_mtp over dsr1-fp8-h200-trt's and dsr1-fp8-h200-trt-mtp's spaces."""
    return _rc2_runs_mtp(_FP8_H200_RC2_PLAIN, _FP8_H200_RC2_MTP, isl, osl, conc, tp, ep, attention_dp, measured)


def _dsr1_fp8_h200_trt_rc2(row: Any) -> Recipe | None:
    # The MTP configuration's script (_dsr1_fp8_h200_trt_mtp) where fp8_h200_rc2_runs_mtp says so; otherwise None
    # (MTP_IMAGES' rule past 64 clients, then the image's other recipe, _dsr1_trt).
    return _told_mtp_recipe(row, fp8_h200_rc2_runs_mtp, _dsr1_fp8_h200_trt_mtp,
                            f"{_INFERENCEX_REPO} benchmarks/dsr1_fp8_h200_trt_mtp.sh @1fc5d73 (image "
                            "1.1.0rc2.post2: dsr1-fp8-h200-trt-mtp's layout at this count, or its sweep's date; "
                            "InferenceMAX nvidia-master.yaml @525079a)")


# (backend, model, system, precision, backend_version) -> the recipe of a row told by its image and layout
# (None: not told; the other tables decide).
LAYOUT_IMAGES: dict[tuple[str, str, str, str, str], Callable[[Any], Recipe | None]] = {
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp4", "1.1.0rc2.post2"): _dsr1_fp4_b200_trt_rc2,
    ("trtllm", "DeepSeek-R1", "b200_sxm", "fp8", "1.1.0rc2.post2"): _dsr1_fp8_b200_trt_rc2,
    ("trtllm", "DeepSeek-R1", "h200_sxm", "fp8", "1.1.0rc2.post2"): _dsr1_fp8_h200_trt_rc2,
}


# (backend, model, system, backend_version) -> the recipe of a row measured from that image (None: the
# image does not tell). InferenceX's nvidia-master.yaml @48f302c runs dsr1-fp8-b200-trt and
# dsr1-fp4-b200-trt (no speculation) from tensorrt-llm release:1.2.0rc6.post2, and dsr1-fp8-b200-trt-mtp
# and dsr1-fp4-b200-trt-mtp from release:1.2.0rc6.post3; H200's two share release:1.1.0rc2.post2.
MTP_IMAGES: dict[tuple[str, str, str, str], Callable[[int, int, int, int, bool], Recipe | None]] = {
    ("trtllm", "DeepSeek-R1", "b200_sxm", "1.2.0rc6.post3"): _dsr1_b200_trt_mtp,
    ("trtllm", "DeepSeek-R1", "h200_sxm", "1.1.0rc2.post2"): _dsr1_h200_trt_mtp,
}


# The K/V cache dtype each InferenceX launch ran, where it is not precision_fields' (FP8 K/V for an FP8 or FP4
# row, the 16-bit dtype for BF16 and INT4), audited group by group from the launch and the checkpoint.
#
# What a launch that passes no flag gets is the engine's default, "auto", and what auto means:
# - SGLang `--kv-cache-dtype auto`: the checkpoint's own dtype, unless its quantization config names an FP8
#   KV cache (`kv_cache_quant_algo`; python/sglang/srt/model_executor/model_runner.py `configure_kv_cache_dtype`,
#   sgl-project/sglang, read through the library's code index; older trees: `init_memory_pool`, "auto" ->
#   `self.dtype`).
# - vLLM `--kv-cache-dtype auto` (CacheConfig.cache_dtype, vllm/config/cache.py: "If "auto", will use model
#   data type"); since vllm-project/vllm#29980 (merged 2025-12) a ModelOpt checkpoint whose hf_quant_config.json
#   names `kv_cache_quant_algo: FP8` gets FP8 K/V under auto too (vllm-project/vllm#34752 describes both).
# - TensorRT-LLM `kv_cache_config: dtype: auto` (the default, llmapi/llm_args.py KvCacheConfig.dtype: "Use
#   'auto' to follow checkpoint metadata"): the checkpoint's `kv_cache_quant_algo`, else the model's dtype.
# The checkpoints, as aiconfigurator-core ships their configs (aiconfigurator_core/model_configs/):
# deepseek-ai/DeepSeek-R1 and zai-org/GLM-5-FP8 (block FP8 weights, `quant_method: fp8`, no KV entry),
# openai/gpt-oss-120b (`quant_method: mxfp4`, attention unquantized, no KV entry) and MiniMaxAI/MiniMax-M2.5
# (block FP8, no KV entry) keep bf16 K/V under auto; the NVIDIA ModelOpt NVFP4 checkpoints (DeepSeek-V3.x,
# GLM-5, Kimi-K2.5, MiniMax-M2.5, Qwen3.5-397B-A17B: `kv_cache_quant_algo: FP8`) get FP8 K/V under auto.
#
# Launches that pass no K/V dtype (or TensorRT-LLM's `dtype: auto`) on a checkpoint with no FP8 KV entry:
# - SGLang DeepSeek-R1 FP8 on Hopper, aggregated and disaggregated: benchmarks/dsr1_fp8_h200.sh @1fc5d73 and
#   the srt-slurm recipes its disaggregated H200 / H100 entries launch (NVIDIA/srt-slurm recipes/h200/8k1k/
#   bs64-2p3d.yaml, named by nvidia-master.yaml @0004cf5's dsr1-fp8-h200-dynamo-sglang; ishandhanani/srt-slurm
#   recipes/h100/1k1k/stp/h100-fp8-2p4d-max-tp.yaml).
# - vLLM gpt-oss-120b on H100 / H200: benchmarks/gptoss_fp4_h200.sh @16cd955 and single_node/ @34bc7c4,
#   gptoss_fp4_h100.sh @1fc5d73, gptoss_fp4_h100_slurm.sh @2e46dba and single_node/ @34bc7c4: no
#   kv-cache-dtype in config.yaml nor on the command line (the B200 script's config.yaml sets `kv-cache-dtype:
#   fp8`: gptoss_fp4_b200.sh @1fc5d73).
# - TensorRT-LLM gpt-oss-120b on H200: benchmarks/gptoss_fp4_h200_trt.sh @111f031 and single_node/ @187f575,
#   gptoss_fp4_h200_trt_slurm.sh @2e46dba: `kv_cache_config: dtype: auto` (B200's gptoss_fp4_b200_trt.sh
#   @1825e7f and single_node/ @34bc7c4 set `dtype: fp8`).
# - SGLang GLM-5 FP8 on H200: benchmarks/single_node/glm5_fp8_h200.sh @0c82808 (no --kv-cache-dtype; B200's
#   single_node/glm5_fp8_b200.sh @4eca3fe (PR #915, the rows' launch; the earlier EAGLE script @87af9d6 too) and
#   B300's single_node/glm5_fp8_b300.sh @5632483 pass fp8_e4m3).
# - vLLM MiniMax-M2.5 FP8 on H100: benchmarks/single_node/minimaxm2.5_fp8_h100.sh @34bc7c4 (no
#   --kv-cache-dtype; one version read. B300's minimaxm2.5_fp8_b300.sh @5632483 passes fp8).
# - vLLM MiniMax-M2.5 FP8 on H200 (every row) and on B200 from the v0.17.0 image: the script versions before
#   InferenceX#1354 (H200) and @07e171a / @13453b4 (B200) pass none (the MiniMax notes above PRECISION_IMAGES;
#   the first K/V audit read H200 at @0949de5, #1354's version, merged 2026-05-12 after every row).
# Every other InferenceX group read passes an FP8 K/V dtype or runs an FP8-KV checkpoint under auto, which is
# what precision_fields gives already; the audit's table is in docs/validate-accuracy.md (2026-12-05, K/V audit).
KV_AUTO_LAUNCHES: dict[tuple[str, str, str, str], tuple[str, ...]] = {
    # (backend, recipe model, system, precision) -> the modes whose launches ran auto on a bf16-KV checkpoint
    ("sglang", "DeepSeek-R1", "h200_sxm", "fp8"): ("agg", "disagg"),
    ("sglang", "DeepSeek-R1", "h100_sxm", "fp8"): ("agg", "disagg"),
    ("vllm", "gpt-oss-120b", "h200_sxm", "fp4"): ("agg",),
    ("vllm", "gpt-oss-120b", "h100_sxm", "fp4"): ("agg",),
    ("trtllm", "gpt-oss-120b", "h200_sxm", "fp4"): ("agg",),
    ("sglang", "GLM-5", "h200_sxm", "fp8"): ("agg",),
    ("vllm", "MiniMax-M2.5", "h100_sxm", "fp8"): ("agg",),
    # Every H200 MiniMax-M2.5 row predates #1354 (2026-05-12), which first passes --kv-cache-dtype fp8 (the version
    # the first K/V audit read, @0949de5): @1c3aa8b and the #869-#1354 versions pass none (the MiniMax notes above).
    ("vllm", "MiniMax-M2.5", "h200_sxm", "fp8"): ("agg",),
}
# The same, for the rows of one image only (backend, recipe model, system, precision, backend_version): the B200
# FP8 v0.17.0 launches (@07e171a / @13453b4: no --kv-cache-dtype; the later versions pass fp8).
KV_AUTO_IMAGES: dict[tuple[str, str, str, str, str], tuple[str, ...]] = {
    ("vllm", "MiniMax-M2.5", "b200_sxm", "fp8", "0.17.0"): ("agg",),
}
_KV_FLAG = {"sglang": "SGLang's --kv-cache-dtype auto", "vllm": "vLLM's --kv-cache-dtype auto",
            "trtllm": "TensorRT-LLM's kv_cache_config dtype auto"}


def kv_cache_dtype(row: Any) -> str | None:
    """The [engine] kv_cache_dtype a row's launch ran where it differs from precision_fields' (FP8 K/V for an
    FP8 or FP4 row): "auto" (the checkpoint's bf16) for the InferenceX groups of KV_AUTO_LAUNCHES (and the images of
    KV_AUTO_IMAGES); None (keep
    precision_fields') for every other row."""
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    key = (str(row.get("backend")), recipe_model(row), str(row.get("system")), str(row.get("precision")))
    modes = KV_AUTO_LAUNCHES.get(key) or KV_AUTO_IMAGES.get((*key, str(row.get("backend_version"))))
    mode = "disagg" if row.get("mode") == "disagg" else "agg"
    if modes is not None and mode in modes and harness(row) == INFERENCEX:
        return "auto"
    return None


def kv_cache_note(row: Any) -> str:
    """The engine default a row's K/V dtype came from where kv_cache_dtype overrides it, else ''."""
    if kv_cache_dtype(row) is None:
        return ""
    return f"K/V bf16: {_KV_FLAG.get(str(row.get('backend')), 'the engine default')}, not set by the launch"


def _int(v: Any, default: int = 0) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(f) else int(f)


def row_version(row: Any) -> str:
    """The row's backend_version as the image tables key it: '' where the row gives none (blank or NaN)."""
    v = row.get("backend_version")
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).strip()


def row_recipe(row: Any) -> Recipe:
    """The recipe a row was measured with; DEFAULT where none is known (disaggregated, a gap-analysis row
    aic_generated_recipe does not cover, or no InferenceX script for its backend x model x GPU x precision;
    the model as recipe_model reads it)."""
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    if row.get("mode") == "disagg":
        return DEFAULT
    if harness(row) != INFERENCEX:
        return aic_generated_recipe(row) or DEFAULT
    by_layout = LAYOUT_IMAGES.get((str(row.get("backend")), recipe_model(row), str(row.get("system")),
                                   str(row.get("precision")), row_version(row)))
    recipe = by_layout(row) if by_layout is not None else None
    if recipe is not None:
        return recipe
    by_image = PRECISION_IMAGES.get((str(row.get("backend")), recipe_model(row), str(row.get("system")),
                                     str(row.get("precision")), row_version(row)))
    if by_image is not None:
        return by_image(_int(row.get("isl")), _int(row.get("osl")), _int(row.get("concurrency"), 1),
                        _int(row.get("tp_size"), 1), _int(row.get("attention_dp_size"), 1) > 1)
    mtp = MTP_IMAGES.get((str(row.get("backend")), recipe_model(row), str(row.get("system")),
                          row_version(row)))
    if mtp is not None:
        recipe = mtp(_int(row.get("isl")), _int(row.get("osl")), _int(row.get("concurrency"), 1),
                     _int(row.get("tp_size"), 1), _int(row.get("attention_dp_size"), 1) > 1)
        if recipe is not None:
            return recipe
    fn = RECIPES.get((str(row.get("backend")), recipe_model(row), str(row.get("system")),
                      str(row.get("precision"))))
    if fn is None:
        return DEFAULT
    return fn(_int(row.get("isl")), _int(row.get("osl")), _int(row.get("concurrency"), 1),
              _int(row.get("tp_size"), 1))


# The gap-analysis rows' launch is not published (sim/validate_protocol.py). aiconfigurator's own generator, the
# one its `eval` pipeline launches Dynamo with (src/aiconfigurator/eval/main.py @5e16187), renders a TensorRT-LLM
# worker's `disable_overlap_scheduler: {{ disable_overlap_scheduler | default(true) }}`: the overlap off unless
# the generator sets it (generator/templates/trtllm/extra_engine_args.yaml.j2 @d40b94c, the template its older
# generator falls back to for 1.0.0rc3, generator/backends/trtllm.py @77cd250, which sets it on disaggregated
# workers only; and backend_templates/trtllm/extra_engine_args.1.0.0rc3.yaml.j2 @71a2b03 alike). The later
# rule-file generator sets `agg disable_overlap_scheduler = false` (generator/rule_plugin/trtllm.rule @17676b3),
# so only TensorRT-LLM 1.0.0rc3's rows (the older generator's era) are read with the overlap off. That generator's
# aggregated step budget, `max_num_tokens = bs + isl + 1500`, is NOT carried: with it every Qwen3-32B H100 row's
# wave splits into whole-prompt pairs and the simulated first tokens come 34% early at the median, their growth
# with the clients twice the measured one (log-log slope 0.55 against 0.25; docs/validate-accuracy.md,
# "Qwen3-32B on TensorRT-LLM: the gap rows' launch"); the choice between the two readings was made on these
# rows, Qwen3-32B's only (no other development model has TensorRT-LLM gap rows to leave it out against).
AIC_GENERATOR_TRT_VERSIONS = ("1.0.0rc3",)
_AIC_GENERATOR_SRC = ("ai-dynamo/aiconfigurator generator templates/trtllm/extra_engine_args.yaml.j2 @d40b94c "
                      "disable_overlap_scheduler default(true) (assumed: the gap-analysis harness is not published)")


def aic_generated_recipe(row: Any) -> Recipe | None:
    """The overlap scheduler off for an aggregated TensorRT-LLM gap-analysis row of a version in
    AIC_GENERATOR_TRT_VERSIONS (aiconfigurator's generator template default); None for any other row."""
    if str(row.get("backend")) != "trtllm" or str(row.get("backend_version")) not in AIC_GENERATOR_TRT_VERSIONS:
        return None
    return Recipe(_AIC_GENERATOR_SRC, overlap_scheduler=False,
                  unmodelled="the generator's max_num_tokens bs + isl + 1500 (not carried), max_batch_size bs, "
                             "cuda_graph_config batch_sizes, enable_block_reuse")


def apply_recipe(recipe: Recipe, sched: Any) -> None:
    """Set the recipe's flags on a row study's SchedulerConfig (flags not set leave the defaults)."""
    sched.recv_interval = max(1, recipe.recv_interval)
    if recipe.chunked_prefill_size:
        sched.max_num_batched_tokens = recipe.chunked_prefill_size
    if recipe.max_prefill_tokens:  # else SGLang's default (16,384) stays
        sched.max_prefill_tokens = recipe.max_prefill_tokens
    if recipe.max_running_requests:
        sched.max_num_seqs = recipe.max_running_requests
    if recipe.max_seq_len:
        sched.max_model_len = recipe.max_seq_len
    if recipe.max_num_tokens:  # TensorRT-LLM's budget, prompts whole (chunked prefill off)
        sched.max_num_batched_tokens = recipe.max_num_tokens
        sched.enable_chunked_prefill = False
    sched.batch_wait_iters = recipe.batch_wait_iters
    sched.batch_wait_tokens_ratio = recipe.batch_wait_ratio
    sched.adp_balance_iters = recipe.adp_balance_iters  # acts only with attention DP (AdpBalance)
    sched.adp_batching_wait_iters = recipe.adp_batching_wait_iters
    if recipe.overlap_scheduler is not None:
        sched.overlap_scheduler = recipe.overlap_scheduler


def apply_memory(recipe: Recipe, engine: Any) -> None:
    """Set the recipe's memory share on a row study's EngineConfig (not set: the engine's default stays)."""
    if recipe.mem_fraction:
        engine.gpu_memory_utilization = recipe.mem_fraction


def apply_kernels(recipe: Recipe, engine: Any, cost_model: str) -> None:
    """Set the recipe's kernel choice on a row study's EngineConfig where the cost model prices it (aic)."""
    if recipe.mxfp4_moe_kernel and cost_model == "aic":
        engine.aic_mxfp4_moe_kernel = recipe.mxfp4_moe_kernel
    if recipe.fp8_moe_kernel and cost_model == "aic":
        engine.aic_fp8_moe_kernel = recipe.fp8_moe_kernel
    if recipe.nvfp4_moe_kernel and cost_model == "aic":
        engine.aic_nvfp4_moe_kernel = recipe.nvfp4_moe_kernel


def launch_expert_parallel(recipe: Recipe, worker: Any) -> bool:
    """Lay a single TP-only worker's experts out expert-parallel over its TP ranks where the launch passed vLLM's
    --enable-expert-parallel or SGLang's --enable-ep-moe whatever the configuration's EP (Recipe.expert_parallel);
    True where it changed."""
    if not recipe.expert_parallel or worker.tp <= 1 or worker.attention_dp > 1 or worker.moe_ep > 1:
        return False
    worker.moe_tp, worker.moe_ep = 1, worker.tp
    return True


def launch_tensor_parallel(recipe: Recipe, worker: Any) -> bool:
    """Lay a single worker out as the one TP group its launch ran where the launch passed vLLM only
    --tensor-parallel-size (Recipe.tensor_parallel_only): no attention DP, the experts split over the TP ranks;
    True where it changed the row's layout."""
    if not recipe.tensor_parallel_only or (worker.attention_dp, worker.moe_tp, worker.moe_ep) == (1, worker.tp, 1):
        return False
    worker.attention_dp, worker.moe_tp, worker.moe_ep = 1, worker.tp, 1
    return True


def apply_speculative(recipe: Recipe, spec: Any) -> None:
    """Set the recipe's speculative decoding on a row study's SpeculativeSection (none: left off)."""
    set_mtp(spec, recipe.mtp)


def set_mtp(spec: Any, depth: int) -> None:
    """MTP drafts of `depth` tokens with the model's own NextN layer on a SpeculativeSection (0: left off)."""
    if depth <= 0:
        return
    from twinserve.sim.specs import MTP_DRAFT
    spec.method, spec.draft_model = "draft_model", MTP_DRAFT
    spec.num_speculative_tokens = depth
    spec.acceptance_rates = [MTP_ACCEPTANCE] * depth


def sglang_stream_points(num_tokens: int, interval: int) -> list[int]:
    """Output-token counts at which SGLang 0.5.x sends a streaming request's output to the client.

    `stream_output_generation`: unfinished, interval > 1: `len(output_ids) % interval == 1`; interval 1:
    every token; finished: always. So the first token (count 1) is always sent at once, and so is the
    last: the client's TTFT and TPOT do not depend on the interval.
    """
    if num_tokens < 1 or interval < 1:
        raise ValueError(f"num_tokens {num_tokens} and interval {interval} must be >= 1")
    if interval == 1:
        return list(range(1, num_tokens + 1))
    pts = [n for n in range(1, num_tokens) if n % interval == 1]
    return pts + [num_tokens]


# ---------------------------------------------------------------------------------------------------------
# Disaggregated SGLang rows: the prefill and decode workers' flags, from the srt-slurm recipe each InferenceX
# entry launches. SemiAnalysisAI/InferenceX `.github/configs/nvidia-master.yaml` @0004cf5 names, for each
# `dsr1-*-dynamo-sglang(-mtp)` search-space entry, its `CONFIG_FILE=recipes/...` (the srt-slurm branch
# sa-submission-q1-2026 of ishandhanani/srt-slurm, linked beside several entries). The recipes were read
# through the library's code index, one stored version each, at the commit given: ishandhanani/srt-slurm where
# it holds the file, else qiching/srt-slurm @5063eb4, a fork of NVIDIA/srt-slurm that holds the H100 / H200 /
# B200 FP8 recipes (elvischenv/srt-slurm @b6efcc2's copy of recipes/h200/1k1k/low-latency-1p9d.yaml sets the
# same values). A run may have launched another version of the same file.
#
# Each recipe's `backend.sglang_config.prefill` / `.decode` sets the flags per worker kind; carried here
# (0: not set, the row study's default stands):
# - `--mem-fraction-static`: the worker's EngineConfig.gpu_memory_utilization (SGLang's basis: the GPU total).
# - `--chunked-prefill-size`, `--max-prefill-tokens`: the prefill worker's step budget and prefill cap
#   (SchedulerConfig.max_num_batched_tokens / max_prefill_tokens), on workers without attention DP only: under
#   attention DP SGLang runs a scheduler per DP rank and divides the chunk among them (server_args.py
#   `_handle_data_parallelism`: `chunked_prefill_size // dp_size`, sgl-project/sglang, read through the
#   library's code index), which was not matched to how the row study's budget spreads over its ranks.
# - `--max-running-requests`: SchedulerConfig.max_num_seqs, on workers without attention DP only (likewise).
#
# Where the row's entry is not told apart from its MTP (or non-MTP) twin of the same workers and client count
# (the same image: sim/validate_inferencex.py gives mtp None), each flag is carried only where every fitting
# entry's recipe sets the same value (DisaggRecipe.common); a fitting entry whose recipe was not read leaves the
# row at the defaults.
#
# Not carried (said so, not approximated): `--max-total-tokens` (the prefill worker's KV pool cap, 8,192 or
# 32,768 tokens in the GB200 / GB300 low-latency recipes: the simulator's num_gpu_blocks would replace the
# memory-sized pool, not cap it), `--scheduler-recv-interval` (the decode server's receive poll gates its
# pre-allocation queue, not the transferred requests the simulator's poll would hold), `--cuda-graph-max-bs` /
# `--cuda-graph-bs`, `--disable-cuda-graph`, `--stream-interval` (no effect on TTFT / TPOT:
# sglang_stream_points), the decode worker's chunked-prefill / max-prefill flags (it runs no prefill), attention /
# MoE / GEMM backends, DeepEP modes, EAGLE drafting (the MTP recipes' speculative-* flags: their depth is the
# entry's, validate_inferencex SGLANG_MTP_STEPS, not carried here). `--num-reserved-decode-tokens`: no recipe read
# sets it, so SGLang's 512 stays ([cluster] disagg_reserved_decode_tokens).


@dataclass(slots=True, frozen=True)
class WorkerFlags:
    """One worker kind's flags from a disaggregated recipe (0: not set)."""

    mem_fraction: float = 0.0
    chunked_prefill_size: int = 0
    max_prefill_tokens: int = 0
    max_running_requests: int = 0

    def overrides(self) -> dict[str, Any]:
        """The flags as per-replica [engine]/[scheduler] overrides (cluster.replicas entries)."""
        out: dict[str, Any] = {}
        if self.mem_fraction:
            out["engine.gpu_memory_utilization"] = self.mem_fraction
        if self.chunked_prefill_size:
            out["scheduler.max_num_batched_tokens"] = self.chunked_prefill_size
        if self.max_prefill_tokens:
            out["scheduler.max_prefill_tokens"] = self.max_prefill_tokens
        if self.max_running_requests:
            out["scheduler.max_num_seqs"] = self.max_running_requests
        return out

    def common(self, other: WorkerFlags) -> WorkerFlags:
        """The flags both set to the same value (0 where they differ)."""
        return WorkerFlags(*(a if a == b else type(a)(0) for a, b in zip(astuple(self), astuple(other))))


@dataclass(slots=True, frozen=True)
class DisaggRecipe:
    """A disaggregated row's launch: the recipe file(s) and its prefill and decode workers' flags."""

    source: str
    prefill: WorkerFlags
    decode: WorkerFlags

    def common(self, other: DisaggRecipe) -> DisaggRecipe:
        """What two recipes that may each have been the row's launch agree on."""
        if other.source == self.source:
            return self
        return DisaggRecipe(f"{self.source} + {other.source} (the flags both set alike)",
                            self.prefill.common(other.prefill), self.decode.common(other.decode))


def _r(path: str, commit: str, prefill: WorkerFlags, decode: WorkerFlags, repo: str = "ishandhanani/srt-slurm"
       ) -> DisaggRecipe:
    return DisaggRecipe(f"{repo} {path} @{commit}", prefill, decode)


_QC = "qiching/srt-slurm"
_P, _W = WorkerFlags, WorkerFlags
# The B200 FP4 8k/1k non-MTP recipes (recipes/b200-fp4/8k1k/stp/*.yaml @6951981) all set, on both workers,
# --mem-fraction-static 0.85, --chunked-prefill-size and --max-prefill-tokens 32,768, --max-running-requests 512.
_B200_FP4_8K_STP_PRE_TP = _P(0.85, 32768, 32768, 512)
_B200_FP4_8K_STP_PRE_DEP = _P(0.85)  # attention DP (dp 4): the memory share only
_B200_FP4_8K_STP_DEC = _W(0.85, 0, 0, 512)

# (system, precision, isl, osl, prefill (count, tp, ep, dp-attn), decode (count, tp, ep, dp-attn), MTP entry)
# -> the recipe that entry launches (its worker shapes as sim/validate_inferencex.py TABLE has them).
DISAGG_RECIPES: dict[tuple, DisaggRecipe] = {
    # dsr1-fp8-gb200-dynamo-sglang: recipes/gb200-fp8/{1k1k,8k1k}/low-latency.yaml (8k/1k: no max-prefill).
    ("gb200", "fp8", 1024, 1024, (1, 4, 1, False), (1, 4, 1, False), False): _r(
        "recipes/gb200-fp8/1k1k/low-latency.yaml", "ab58651", _P(0.95, 8192, 0, 512), _W(0.95, 0, 0, 128)),
    ("gb200", "fp8", 8192, 1024, (1, 8, 1, False), (1, 8, 1, False), False): _r(
        "recipes/gb200-fp8/8k1k/low-latency.yaml", "ab58651", _P(0.8, 24576, 0, 512), _W(0.8, 0, 0, 512)),
    # dsr1-fp4-gb200-dynamo-sglang: recipes/gb200-fp4/{1k1k,8k1k}/low-latency.yaml (decode: no max-running).
    ("gb200", "fp4", 1024, 1024, (1, 4, 1, False), (2, 4, 1, False), False): _r(
        "recipes/gb200-fp4/1k1k/low-latency.yaml", "f64d2b9", _P(0.95, 8192, 0, 512), _W(0.95)),
    ("gb200", "fp4", 8192, 1024, (1, 4, 1, False), (4, 4, 1, False), False): _r(
        "recipes/gb200-fp4/8k1k/low-latency.yaml", "ab58651", _P(0.95, 24576, 0, 512), _W(0.95)),
    # dsr1-fp8-gb300-dynamo-sglang: recipes/gb300-fp8/{1k1k,8k1k}/stp/low-latency.yaml, 8k1k/stp/mid.yaml.
    ("gb300", "fp8", 1024, 1024, (1, 4, 1, False), (4, 4, 1, False), False): _r(
        "recipes/gb300-fp8/1k1k/stp/low-latency.yaml", "f64d2b9", _P(0.95, 8192, 8192, 128), _W(0.85, 0, 0, 128)),
    ("gb300", "fp8", 8192, 1024, (1, 4, 1, False), (1, 4, 1, False), False): _r(
        "recipes/gb300-fp8/8k1k/stp/low-latency.yaml", "f64d2b9", _P(0.95, 32768, 32768, 128), _W(0.85, 0, 0, 128)),
    ("gb300", "fp8", 8192, 1024, (5, 8, 8, True), (1, 32, 32, True), False): _r(
        "recipes/gb300-fp8/8k1k/stp/mid.yaml", "f64d2b9", _P(0.75), _W(0.82)),  # attention DP both sides
    # dsr1-fp4-gb300-dynamo-sglang: recipes/gb300-fp4/{1k1k,8k1k}/low_latency.yaml (decode: no max-running).
    ("gb300", "fp4", 1024, 1024, (1, 4, 1, False), (2, 4, 1, False), False): _r(
        "recipes/gb300-fp4/1k1k/low_latency.yaml", "ab58651", _P(0.95, 8192, 0, 512), _W(0.95)),
    ("gb300", "fp4", 8192, 1024, (1, 4, 1, False), (4, 4, 1, False), False): _r(
        "recipes/gb300-fp4/8k1k/low_latency.yaml", "f64d2b9", _P(0.95, 24576, 0, 512), _W(0.95)),
    # dsr1-fp4-b200-dynamo-sglang 8k/1k: recipes/b200-fp4/8k1k/stp/*.yaml.
    ("b200_sxm", "fp4", 8192, 1024, (1, 4, 1, False), (1, 8, 1, False), False): _r(
        "recipes/b200-fp4/8k1k/stp/low-latency-tp4-1p-tp8-1d.yaml", "6951981", _B200_FP4_8K_STP_PRE_TP,
        _B200_FP4_8K_STP_DEC),
    ("b200_sxm", "fp4", 8192, 1024, (1, 4, 4, True), (1, 8, 8, False), False): _r(
        "recipes/b200-fp4/8k1k/stp/low-latency-dep4-1p-tep8-1d.yaml", "6951981", _B200_FP4_8K_STP_PRE_DEP,
        _B200_FP4_8K_STP_DEC),
    ("b200_sxm", "fp4", 8192, 1024, (1, 4, 4, True), (5, 8, 8, False), False): _r(
        "recipes/b200-fp4/8k1k/stp/low-latency-dep4-1p-tep8-5d.yaml", "6951981", _B200_FP4_8K_STP_PRE_DEP,
        _B200_FP4_8K_STP_DEC),
    ("b200_sxm", "fp4", 8192, 1024, (2, 4, 4, True), (5, 8, 8, False), False): _r(
        "recipes/b200-fp4/8k1k/stp/low-latency-dep4-2p-tep8-5d.yaml", "6951981", _B200_FP4_8K_STP_PRE_DEP,
        _B200_FP4_8K_STP_DEC),
    # dsr1-fp8-b200-dynamo-sglang(-mtp) 1k/1k, 1 prefill and 3 decode TEP 8: recipes/b200-fp8/1k1k/{stp,mtp}/
    # low-latency-tep8-1p3d.yaml, alike on these flags (both workers 0.85, 32,768, 32,768, 512).
    ("b200_sxm", "fp8", 1024, 1024, (1, 8, 8, False), (3, 8, 8, False), False): _r(
        "recipes/b200-fp8/1k1k/stp/low-latency-tep8-1p3d.yaml", "5063eb4", _P(0.85, 32768, 32768, 512),
        _W(0.85, 0, 0, 512), _QC),
    ("b200_sxm", "fp8", 1024, 1024, (1, 8, 8, False), (3, 8, 8, False), True): _r(
        "recipes/b200-fp8/1k1k/mtp/low-latency-tep8-1p3d.yaml", "5063eb4", _P(0.85, 32768, 32768, 512),
        _W(0.85, 0, 0, 512), _QC),
    # dsr1-fp8-b200-dynamo-sglang(-mtp) 8k/1k (nvidia-master.yaml @0004cf5; sim/validate_inferencex.py
    # _TWIN_DATED): recipes/b200-fp8/8k1k/{stp,mtp}/low-latency-tep8-1p1d.yaml, stp/low-latency-tep8-1p4d.yaml,
    # both workers 0.85, 32,768, 32,768, 512 running; stp/max-tpt-dep8-1p1d.yaml and -2p1d.yaml, attention DP both
    # sides, 0.85. Their `benchmark: concurrencies` ("4x32x64", "16x32x64", "64", "128", "256") are the db-dump
    # records' counts of those layouts (configs 455, 453, 457, 459).
    ("b200_sxm", "fp8", 8192, 1024, (1, 8, 8, False), (1, 8, 8, False), False): _r(
        "recipes/b200-fp8/8k1k/stp/low-latency-tep8-1p1d.yaml", "5063eb4", _P(0.85, 32768, 32768, 512),
        _W(0.85, 0, 0, 512), _QC),
    ("b200_sxm", "fp8", 8192, 1024, (1, 8, 8, False), (1, 8, 8, False), True): _r(
        "recipes/b200-fp8/8k1k/mtp/low-latency-tep8-1p1d.yaml", "5063eb4", _P(0.85, 32768, 32768, 512),
        _W(0.85, 0, 0, 512), _QC),
    ("b200_sxm", "fp8", 8192, 1024, (1, 8, 8, False), (4, 8, 8, False), False): _r(
        "recipes/b200-fp8/8k1k/stp/low-latency-tep8-1p4d.yaml", "5063eb4", _P(0.85, 32768, 32768, 512),
        _W(0.85, 0, 0, 512), _QC),
    ("b200_sxm", "fp8", 8192, 1024, (1, 8, 8, True), (1, 8, 8, True), False): _r(
        "recipes/b200-fp8/8k1k/stp/max-tpt-dep8-1p1d.yaml", "5063eb4", _P(0.85), _W(0.85), _QC),
    ("b200_sxm", "fp8", 8192, 1024, (2, 8, 8, True), (1, 8, 8, True), False): _r(
        "recipes/b200-fp8/8k1k/stp/max-tpt-dep8-2p1d.yaml", "5063eb4", _P(0.85), _W(0.85), _QC),
    # Its prefill-EP-1 run (TABLE's entries from ishandhanani/srt-slurm recipes/b200-fp8/8k1k.yaml @50f459c): the
    # prefill worker at attention DP 8, 0.6; low-latency decode TP 8 (EP 1) at 0.75 with max-running-requests 32,
    # 32, 22 for 3, 4, 6 decode workers; max-throughput decode DEP 8 at 0.75 (attention DP: the memory share
    # only). The stp and mtp zip overrides set these alike.
    **{("b200_sxm", "fp8", 8192, 1024, p, d, mtp): _r("recipes/b200-fp8/8k1k.yaml", "50f459c", _P(0.6), dec)
       for mtp in (False, True) for p, d, dec in (
           ((1, 8, 1, True), (3, 8, 1, False), _W(0.75, 0, 0, 32)),
           ((1, 8, 1, True), (4, 8, 1, False), _W(0.75, 0, 0, 32)),
           ((1, 8, 1, True), (6, 8, 1, False), _W(0.75, 0, 0, 22)),
           ((1, 8, 1, True), (2, 8, 8, True), _W(0.75)),
           ((1, 8, 1, True), (1, 8, 8, True), _W(0.75)),
           ((2, 8, 1, True), (1, 8, 8, True), _W(0.75)),
           ((3, 8, 1, True), (1, 8, 8, True), _W(0.75)))},
    # dsr1-fp8-h200-dynamo-sglang 1k/1k: recipes/h200/1k1k/low-latency-1p9d(-mtp).yaml and bs256-1p6d-dep(-mtp).
    ("h200_sxm", "fp8", 1024, 1024, (1, 8, 1, False), (9, 8, 1, False), False): _r(
        "recipes/h200/1k1k/low-latency-1p9d.yaml", "5063eb4", _P(0.82, 163840, 163840, 256), _W(0.82, 0, 0, 256),
        _QC),
    ("h200_sxm", "fp8", 1024, 1024, (1, 8, 1, False), (9, 8, 1, False), True): _r(
        "recipes/h200/1k1k/low-latency-1p9d-mtp.yaml", "5063eb4", _P(0.82, 163840, 163840, 256),
        _W(0.75, 0, 0, 64), _QC),
    ("h200_sxm", "fp8", 1024, 1024, (1, 8, 8, True), (6, 8, 8, True), False): _r(
        "recipes/h200/1k1k/bs256-1p6d-dep.yaml", "5063eb4", _P(0.75), _W(0.82), _QC),  # attention DP both sides
    ("h200_sxm", "fp8", 1024, 1024, (1, 8, 8, True), (6, 8, 8, True), True): _r(
        "recipes/h200/1k1k/bs256-1p6d-dep-mtp.yaml", "5063eb4", _P(0.82), _W(0.75), _QC),
    # 8k/1k: recipes/h200/8k1k/bs4-1p7d(-mtp).yaml, bs8-1p6d(-mtp).yaml.
    ("h200_sxm", "fp8", 8192, 1024, (1, 8, 1, False), (7, 8, 1, False), False): _r(
        "recipes/h200/8k1k/bs4-1p7d.yaml", "5063eb4", _P(0.82, 32768, 32768, 16), _W(0.82, 0, 0, 8), _QC),
    ("h200_sxm", "fp8", 8192, 1024, (1, 8, 1, False), (7, 8, 1, False), True): _r(
        "recipes/h200/8k1k/bs4-1p7d-mtp.yaml", "5063eb4", _P(0.82, 32768, 32768, 16), _W(0.75, 0, 0, 2), _QC),
    ("h200_sxm", "fp8", 8192, 1024, (1, 8, 1, False), (6, 8, 1, False), False): _r(
        "recipes/h200/8k1k/bs8-1p6d.yaml", "5063eb4", _P(0.82, 32768, 32768, 16), _W(0.82, 0, 0, 16), _QC),
    ("h200_sxm", "fp8", 8192, 1024, (1, 8, 1, False), (6, 8, 1, False), True): _r(
        "recipes/h200/8k1k/bs8-1p6d-mtp.yaml", "5063eb4", _P(0.82, 32768, 32768, 16), _W(0.82, 0, 0, 16), _QC),
    # dsr1-fp8-h100-dynamo-sglang (every entry MTP), TEP 16 decode: recipes/h100/{1k1k,8k1k}/mtp/
    # h100-fp8-1p{2,1}d-max-tp-mtp.yaml: prefill 0.6, 2,048, 2,048, 2 running; decode 0.9, 128 running.
    ("h100_sxm", "fp8", 1024, 1024, (1, 16, 1, False), (2, 16, 1, False), True): _r(
        "recipes/h100/1k1k/mtp/h100-fp8-1p2d-max-tp-mtp.yaml", "5063eb4", _P(0.6, 2048, 2048, 2),
        _W(0.9, 0, 0, 128), _QC),
    ("h100_sxm", "fp8", 8192, 1024, (1, 16, 1, False), (1, 16, 1, False), True): _r(
        "recipes/h100/8k1k/mtp/h100-fp8-1p1d-max-tp-mtp.yaml", "5063eb4", _P(0.6, 2048, 2048, 2),
        _W(0.9, 0, 0, 128), _QC),
}

def disagg_recipe(row: Any) -> DisaggRecipe | None:
    """The srt-slurm recipe an InferenceX disaggregated SGLang DeepSeek-R1 row launched (the flags every entry it
    may be agrees on), where its entries (InferenceX's matrix, sim/validate_inferencex.py) and their recipes are
    known; None elsewhere."""
    from twinserve.sim.validate_inferencex import candidates, inferencex_workers
    from twinserve.sim.validate_protocol import INFERENCEX, harness
    if row.get("mode") != "disagg" or str(row.get("backend")) != "sglang" or harness(row) != INFERENCEX:
        return None
    if inferencex_workers(row) is None:  # no entry fits, or the fitting ones disagree on the workers
        launch = dump_layout_launch(row)  # a run known by its db-dump layout (DUMP_LAYOUT_LAUNCHES)
        return launch.recipe if launch is not None else None
    system, precision = str(row.get("system")), str(row.get("precision"))
    fits = candidates(row)  # the row's image already picks between plain and MTP entries (ENTRY_IMAGES)
    out: DisaggRecipe | None = None
    for e in fits:
        p, d = e.prefill, e.decode
        recipe = DISAGG_RECIPES.get((system, precision, _int(row.get("isl")), _int(row.get("osl")),
                                     (p.count, p.tp, p.ep, p.dp_attn), (d.count, d.tp, d.ep, d.dp_attn), e.mtp != 0))
        if recipe is None:  # an entry the row may be whose recipe was not read
            return None
        out = recipe if out is None else out.common(recipe)
    if out is None or not (out.prefill.overrides() or out.decode.overrides()):  # nothing the entries agree on
        return None
    return out


def apply_disagg_recipe(recipe: DisaggRecipe, base: Any, prefill: dict[str, Any],
                        decode: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The prefill and decode replicas' overrides with the recipe's flags on each; a flag one worker sets and
    the other does not is written on the other as the base study's value (not inherited across kinds)."""
    pre, dec = recipe.prefill.overrides(), recipe.decode.overrides()
    for dotted in set(pre) | set(dec):
        section, name = dotted.split(".", 1)
        value = getattr(getattr(base, section), name)
        pre.setdefault(dotted, value)
        dec.setdefault(dotted, value)
    return {**prefill, **pre}, {**decode, **dec}


# ---------------------------------------------------------------------------------------------------------
# Disaggregated SGLang runs that no entry of nvidia-master.yaml @0004cf5 fits (DISAGG_RECIPES needs one), known by
# the layout their db-dump record writes (sim/validate_inferencex.py db_dump_shape: (count, GPUs a worker, moe_ep,
# attention DP)), their image and ISL/OSL: the record itself and the dump row it twins (sim/validate_twins.py).
#
# SGLang GB200 FP8 1k/1k, image lmsysorg/sglang:v0.5.5.post2, measured 2025-12-21, db-dump config 227 (1 prefill,
# 4 decode workers, each tp 1 x attention DP 4, written moe_tp 4 x ep 1). The matrix of the period,
# SemiAnalysisAI/InferenceX .github/configs/nvidia-master.yaml @48f302c, `dsr1-fp8-gb200-dynamo-sglang` (image
# v0.5.5.post2), 1k/1k "Bottom of curve (1 prefill worker at DEP4 and 4 decode workers at DEP4)": conc-list
# 2, 4, 8, 16, 64, 128; prefill 1 worker, decode 4, each `ep: 4`, `dp-attn: true`, one 4-GPU node a worker; its
# comment says the tp / ep / dp-attn fields "do nothing" and the Dynamo launch scripts set them. The InferenceX
# launcher of the period clones ai-dynamo/dynamo (branch ishan/sa-1.1-sgl-dsr1-fp8) for 1k/1k and runs its
# examples/backends/sglang/slurm_jobs/submit_disagg.sh with the nodes and workers; that directory's
# scripts/gb200-fp8/disagg/1p_4d.sh (@341b5df, one of 7 stored versions; context length 2,200) launches both
# worker kinds with `--tp-size` and `--dp-size` the worker's GPUs, `--enable-dp-attention`, `--moe-a2a-backend
# deepep` (normal on prefill, low_latency on decode) and `--mem-fraction-static 0.95`. SGLang sets ep_size = tp_size
# under the DeepEP backend (sgl-project/sglang python/sglang/srt/server_args.py, `moe_a2a_backend == "deepep"`,
# read through the library's code index): EP 4 on every worker, not the record's moe_tp 4. Carried: EP 4 and the
# memory share (under attention DP the chunk and running caps are not: DISAGG_RECIPES' rule above). Not carried:
# its `--ep-num-redundant-experts 32` (288 experts over 4 GPUs would not fit a GB200's memory at all; the
# redundant-expert rule, sim/validate_inferencex.py redundant_experts, adds none where EP divides 256),
# `--max-total-tokens 8192` on prefill, `--cuda-graph-max-bs 128`, stream / receive intervals.
@dataclass(slots=True, frozen=True)
class DumpLayoutLaunch:
    """A run's launch known by its db-dump layout: its workers' flags and EP (prefill, decode)."""

    recipe: DisaggRecipe
    prefill_ep: int
    decode_ep: int


DUMP_LAYOUT_LAUNCHES: dict[tuple, DumpLayoutLaunch] = {
    # (backend, system, precision, isl, osl, image, prefill (count, GPUs, moe_ep, adp), decode (...)).
    ("sglang", "gb200", "fp8", 1024, 1024, "lmsysorg/sglang:v0.5.5.post2", (1, 4, 1, True), (4, 4, 1, True)):
        DumpLayoutLaunch(_r("examples/backends/sglang/slurm_jobs/scripts/gb200-fp8/disagg/1p_4d.sh", "341b5df",
                            _P(0.95), _W(0.95), "ai-dynamo/dynamo"), 4, 4),
}


def dump_layout_launch(row: Any) -> DumpLayoutLaunch | None:
    """The launch of a disaggregated row that no InferenceX entry fits, from its db-dump layout (its own columns
    for a db-dump record, its twin's for a row with a db-dump twin) and its image (DUMP_LAYOUT_LAUNCHES); None
    elsewhere."""
    from twinserve.sim.validate_inferencex import db_dump_image, db_dump_record, db_dump_shape, inferencex_workers
    from twinserve.sim.validate_inferencex import row_image
    if row.get("mode") != "disagg":
        return None
    if db_dump_record(row):
        prefix, image = "", db_dump_image(row)
    elif str(row.get("twin_id") or "").startswith("dsr1_"):
        prefix, image = "twin_", row_image(row)
    else:
        return None
    shapes = [db_dump_shape(row, side, prefix) for side in ("prefill", "decode")]
    if any(s is None for s in shapes):
        return None
    key = (str(row.get("backend")), str(row.get("system")), str(row.get("precision")), _int(row.get("isl")),
           _int(row.get("osl")), image, *(astuple(s) for s in shapes))
    launch = DUMP_LAYOUT_LAUNCHES.get(key)
    if launch is None or inferencex_workers(row) is not None:  # an entry's layout and recipe come first
        return None
    return launch
