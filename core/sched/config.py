"""Scheduler and KV-cache knobs, named as in vLLM, validated."""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError
from twinserve.core.knobs import check_fields, knob
from twinserve.core.kv.hashing import HASH_FUNCTIONS
from twinserve.core.kv.host_policies import HOST_EVICTION_POLICIES
from twinserve.core.sched.batch_policy import BATCH_POLICIES
from twinserve.core.sched.policies import PREEMPTION_CHOICES, QUEUE_POLICIES


_INT32_MAX = 2 ** 31 - 1
CAPACITY_POLICIES = ("on_demand", "guaranteed_no_evict")

# CLIs offer these names, so a registration works everywhere.
SCHEDULER_CHOICES: dict[str, tuple[str, ...]] = {
    "policy": tuple(QUEUE_POLICIES),
    "preemption": PREEMPTION_CHOICES,
    "prefix_caching_hash_algo": tuple(HASH_FUNCTIONS),
    "kv_offloading_policy": tuple(HOST_EVICTION_POLICIES),
    "batch_policy": tuple(BATCH_POLICIES),
    "capacity_policy": CAPACITY_POLICIES,
}


@dataclass(slots=True)
class SchedulerConfig:
    """Who enters a batch, and how the KV pool is laid out."""

    max_num_batched_tokens: int = knob(2048, help="token budget of one step (prefill and decode together)",
                                       unit="tokens", range=(1, _INT32_MAX))
    max_num_seqs: int = knob(256, help="requests running at once", unit="requests", range=(1, _INT32_MAX))
    max_model_len: int = knob(4096, help="longest prompt plus output a request may have", unit="tokens",
                              range=(1, _INT32_MAX))
    # TensorRT-LLM sizes its step budget for the prompts it will serve, not for max_seq_len: InferenceX's MTP
    # launches pass `--max_num_tokens ((MTP+1) x max_batch_size + ISL + 127) / 64 x 64` beside `--max_seq_len`
    # ISL + OSL + 200, chunked prefill off (SemiAnalysisAI/InferenceX benchmarks/dsr1_fp4_b200_trt_mtp.sh @13dd0c2;
    # sim/validate_recipes.py mtp_script_max_num_tokens). Without chunking only a prompt must fit one step.
    max_prompt_len: int = knob(0, help="longest prompt a request may bring; with chunked prefill off the step "
                               "budget need hold only this, not max_model_len (0: max_model_len)", unit="tokens",
                               range=(0, _INT32_MAX), special={0: "max_model_len"})
    enable_chunked_prefill: bool = knob(True, help="split long prompts across steps to share the budget")
    long_prefill_token_threshold: int = knob(0, help="per-step prefill cap per request, so long prompts "
                                             "share the budget", unit="tokens", range=(0, _INT32_MAX),
                                             special={0: "no cap"})
    block_size: int = knob(16, help="tokens per KV cache block", unit="tokens", range=(1, _INT32_MAX))
    num_blocks: int = knob(1024, help="KV cache blocks in the pool (the engine sizes it from memory)",
                           unit="blocks", range=(1, _INT32_MAX), flag=False)
    enable_prefix_caching: bool = knob(True, help="reuse the KV blocks of prompts' shared prefixes")
    prefix_caching_hash_algo: str = knob("xxhash", help="hash naming a prefix block",
                                         choices=lambda: tuple(HASH_FUNCTIONS), accepts=callable)
    watermark: float = knob(0.0, help="fraction of KV blocks kept free after an admission",
                            range=(0.0, 1.0), open="hi")
    policy: str = knob("fcfs", help="queue order: fcfs, priority (lower first) or sjf (shortest prompt "
                       "first)", choices=lambda: tuple(QUEUE_POLICIES))
    preemption: str = knob("auto", help="preemption victim: the last admitted, the lowest priority, or "
                           "auto (follows policy)", choices=PREEMPTION_CHOICES)
    # core/sched/batch_policy.py; prefill_first is SGLang's default scheduler (sim/validate_engines.py).
    batch_policy: str = knob("mixed", help="what shares a step: mixed (prefill chunks beside decodes, as "
                             "vLLM V1) or prefill_first (a step that can prefill runs only prefill, "
                             "decodes wait; SGLang's default)", choices=lambda: tuple(BATCH_POLICIES))
    max_prefill_tokens: int = knob(0, help="prefill_first: past a step's first request, one joins only if "
                                   "its whole prompt fits in this less the step's tokens (SGLang's "
                                   "max_prefill_tokens)", unit="tokens", range=(1, _INT32_MAX),
                                   special={0: "no cap"})
    # TensorRT-LLM's batch_wait_timeout_iters / batch_wait_max_tokens_ratio (llmapi TorchLlmArgs; 0 and 0.0 by
    # default): core/sched/batch_policy.py MixedBatchWait.
    batch_wait_iters: int = knob(0, help="mixed: while requests decode, new prompts wait up to this many steps "
                                 "to batch together (TensorRT-LLM's batch_wait_timeout_iters)", unit="steps",
                                 range=(0, _INT32_MAX), special={0: "no wait"})
    batch_wait_tokens_ratio: float = knob(0.0, help="mixed: the wait ends early once the step's tokens (held "
                                          "prompts and decodes) reach this share of max_num_batched_tokens, so "
                                          "at 0 nothing waits (TensorRT-LLM's batch_wait_max_tokens_ratio)",
                                          range=(0.0, 1.0))
    # TensorRT-LLM's attention_dp_config {enable_balance, timeout_iters, batching_wait_iters} (llmapi
    # AttentionDpConfig; py_executor.py `_balance_adp_requests`): core/sched/batch_policy.py AdpBalance.
    adp_balance_iters: int = knob(0, help="mixed, attention DP ([engine] data_parallel_size > 1): new prompts "
                                  "wait until every rank has one, or until this many steps have passed on "
                                  "the balance's step count (TensorRT-LLM's attention_dp_config enable_balance "
                                  "with timeout_iters)", unit="steps", range=(0, _INT32_MAX),
                                  special={0: "no balance"})
    adp_batching_wait_iters: int = knob(0, help="mixed, attention-DP balance on: once every rank has a new "
                                        "prompt and a decode, the prompts wait this many steps more "
                                        "(TensorRT-LLM's attention_dp_config batching_wait_iters)", unit="steps",
                                        range=(0, _INT32_MAX), special={0: "no wait"})
    # TensorRT-LLM with enable_attention_dp: every attention-DP rank runs its own executor loop whose scheduler
    # (capacity + micro-batch) holds max_batch_size requests and max_num_tokens a step, and a new request is
    # placed on one rank when it is fetched (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/
    # executor_request_queue.py @007a750 `_fetch_new_requests_attention_dp`: at most max_num_active_requests a
    # rank, `_balance_requests_across_ranks` picks the rank with the fewest active tokens, then requests;
    # _util.py `create_py_executor_instance` builds each rank's BindMicroBatchScheduler(max_batch_size,
    # max_num_tokens), in the library's stored copy whose commit its index does not name). Scheduler._admit.
    adp_per_rank: bool = knob(False, help="attention DP (adp_ranks > 1): each new request is placed on one rank "
                              "(fewest active prompt tokens, then requests) and takes that rank's share of "
                              "max_num_seqs and max_num_batched_tokens, not the pooled ones (TensorRT-LLM's "
                              "per-rank scheduler)")
    adp_ranks: int = knob(1, help="attention-DP ranks whose batches this scheduler pools (set from [engine] "
                          "data_parallel_size)", unit="ranks", range=(1, _INT32_MAX), flag=False)
    # SGLang's --scheduler-recv-interval (managers/scheduler_recv_skipper.py): Scheduler._received.
    recv_interval: int = knob(1, help="new requests are read only every this many decode steps (a step "
                              "with a prefill, or an idle engine, reads at once; SGLang's "
                              "--scheduler-recv-interval)", unit="steps", range=(1, _INT32_MAX),
                              special={1: "read every step"})
    # TensorRT-LLM's overlap scheduler (`disable_overlap_scheduler`, False by default: llmapi TorchLlmArgs): the
    # PyTorch executor's `_executor_loop_overlap` fetches new requests before it handles the step in flight, so a
    # request that reaches a busy engine while a step runs is scheduled a step later (Scheduler._fetched_late).
    overlap_scheduler: bool = knob(False, help="mixed: requests that arrive while a step runs are read only at the "
                                   "next step's start, so they join one step later than the step after their "
                                   "arrival (an idle engine reads at once; TensorRT-LLM's overlap scheduler, on "
                                   "unless disable_overlap_scheduler)")
    # TensorRT-LLM's capacity scheduler (CapacitySchedulerPolicy, GUARANTEED_NO_EVICT its default): _admit.
    capacity_policy: str = knob("on_demand", help="KV admission: on_demand (a request is admitted on the blocks "
                                "its next chunk needs; running ones are preempted when the pool runs short, as "
                                "vLLM and SGLang) or guaranteed_no_evict (only when every running request's "
                                "blocks to its max_tokens and the new one's whole need fit; nothing is ever "
                                "preempted: TensorRT-LLM's default)", choices=CAPACITY_POLICIES)
    # 0 = strict order, which can starve requests forever.
    aging_interval_s: float = knob(30.0, help="against starvation: each interval waited raises a request "
                                   "one priority level", unit="seconds", range=(0.0, 1e9),
                                   special={0: "no aging"})
    sliding_window: int = knob(0, help="the model's all-layer sliding window (set from the model)",
                               unit="tokens", range=(1, _INT32_MAX), special={0: "full attention"},
                               flag=False)
    # From core.kv.groups.group_windows; () = one group (sliding_window's).
    kv_groups: tuple[int, ...] = knob((), help="each KV cache group's window, for a model mixing "
                                      "attention types (set from the model)", range=(0, _INT32_MAX),
                                      flag=False)

    # The host tier behind the device pool (core/kv/host_tier.py); the engine sizes it from
    # --kv-offloading-size GiB.
    kv_offloading_blocks: int = knob(0, help="KV blocks the host-memory tier holds for the prefix cache",
                                     unit="blocks", range=(1, _INT32_MAX), special={0: "no host tier"},
                                     flag=False)
    kv_offloading_policy: str = knob("lru", help="host tier eviction: lru, or lrfu (reuse-aware: "
                                     "frequency and recency)", choices=lambda: tuple(HOST_EVICTION_POLICIES))

    def __post_init__(self) -> None:
        self.validate()

    @property
    def prompt_limit(self) -> int:
        """The longest prompt a request may bring: max_prompt_len where set (and below max_model_len)."""
        return min(self.max_prompt_len, self.max_model_len) if self.max_prompt_len else self.max_model_len

    def validate(self) -> None:
        """Raise InvalidConfigError naming the first bad field."""
        check_fields(self)
        if len(self.kv_groups) > 1 and self.sliding_window:
            raise InvalidConfigError("sliding_window", self.sliding_window,
                                     "0 when kv_groups gives each group's window")
        if (self.batch_wait_iters or self.batch_wait_tokens_ratio) and self.batch_policy != "mixed":
            raise InvalidConfigError("batch_wait_iters", self.batch_wait_iters,
                                     f"0 (no batch wait) with batch_policy {self.batch_policy!r}: the wait is "
                                     "the mixed policy's (TensorRT-LLM's)")
        if self.overlap_scheduler and self.batch_policy != "mixed":
            raise InvalidConfigError("overlap_scheduler", self.overlap_scheduler,
                                     f"False with batch_policy {self.batch_policy!r}: the overlap loop is the mixed "
                                     "policy's (TensorRT-LLM's)")
        if (self.adp_balance_iters or self.adp_batching_wait_iters) and self.batch_policy != "mixed":
            raise InvalidConfigError("adp_balance_iters", self.adp_balance_iters,
                                     f"0 (no attention-DP balance) with batch_policy {self.batch_policy!r}: the "
                                     "balance is the mixed policy's (TensorRT-LLM's)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.prompt_limit:
            bound = "max_prompt_len" if self.prompt_limit < self.max_model_len else "max_model_len"
            raise InvalidConfigError(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f">= {bound} ({self.prompt_limit}) when chunked prefill is off, "
                "or a prompt could never be scheduled",
            )
