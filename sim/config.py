"""Study configuration: dataclasses with defaults for every field, loaded from TOML.

Tables: [engine], [model]/[hardware] (custom specs, sim.specs), [scheduler] (SchedulerConfig but
num_blocks), [workload] (WorkloadConfig), [slo], [run], [cluster], [search], [speculative], [kv_offload]; a
field left out keeps its default. Errors name the field, file and line; each field's knob (core/knobs.py) bounds its values so
none breaks a clock or a plot.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
from twinserve.backends.sim.precision import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS
from twinserve.core.errors import InvalidConfigError, unreadable_text
from twinserve.core.knobs import KnobError, check_value, knob, knob_of
from twinserve.core.routing import ROUTER_NAMES, RouterConfig, router_option_fields
from twinserve.core.sched.config import SCHEDULER_CHOICES, SchedulerConfig

from twinserve.sim.config_lines import field_error, find_line, replica_line, source_text  # noqa: F401
from twinserve.sim.errors import ConfigError
from twinserve.sim.kv_offload import KVOffloadSection, check_kv_offload
from twinserve.sim.speculative import SpeculativeSection, check_speculative, coerce_speculative
from twinserve.sim.trace_paths import UnknownBuiltinTrace, trace_path
from twinserve.sim.workload import ARRIVALS, LENGTH_DISTS, WorkloadConfig, range_bounds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(slots=True)
class EngineConfig:
    """Model, hardware, parallelism, memory and cost model of the simulated engine."""

    model: str = knob("Llama-3-8B",
                      help="a catalog name, a config.json path, an HF folder or a [model] table's name")
    hardware: str = knob("H100-SXM", help="a GPU of the hardware catalog or a [hardware] table's name")
    tensor_parallel_size: int = knob(1, help="tensor-parallel ranks per replica", unit="GPUs",
                                     range=(1, 4096))
    # Attention data-parallel ranks, experts split over expert_parallel_size GPUs (a divisor of
    # tp x dp; vLLM's --enable-expert-parallel is ep = tp x dp), pipeline stages (backends/sim/parallel.py).
    data_parallel_size: int = knob(1, help="attention data-parallel ranks per replica", unit="GPUs",
                                   range=(1, 4096))
    expert_parallel_size: int = knob(1, help="GPUs the experts are split over (a divisor of tp x dp)",
                                     unit="GPUs", range=(1, 4096))
    # SGLang's --ep-num-redundant-experts (EPLB replicas; default 0): the EP group holds E + R experts,
    # (E + R) / ep a GPU, so E + R, not E, must divide by expert_parallel_size (backends/sim/parallel.py).
    redundant_experts: int = knob(0, help="redundant expert replicas the expert-parallel group holds beside "
                                  "the model's experts (SGLang's --ep-num-redundant-experts): the experts "
                                  "plus these must divide by expert_parallel_size",
                                  unit="experts", range=(0, 4096))
    pipeline_parallel_size: int = knob(1, help="pipeline stages per replica", unit="stages", range=(1, 4096))
    gpu_memory_utilization: float = knob(0.9, help="share of GPU memory the engine may take",
                                         range=(0.0, 1.0), open="lo")
    kv_memory_basis: str = knob("total",
                                help="what gpu_memory_utilization is a share of: the GPU's total memory (vLLM, "
                                     "SGLang) or what is free after weights and activations (TensorRT-LLM's "
                                     "free_gpu_memory_fraction)",
                                choices=("total", "free"))
    num_gpu_blocks: int = knob(0,
                               help="KV blocks in the pool (every block is an object of the simulated pool)",
                               unit="blocks", range=(1, 2 ** 21), special={0: "derived from memory"})
    activation_reserve_gib: float = knob(-1.0, help="memory kept for activations", unit="GiB",
                                         range=(0.0, 1e6), special={-1: "estimated"})
    cost_model: str = knob("roofline",
                           help="how a step is priced: roofline, a fitted profile, or aic (measured kernels, "
                                "the [aic] extra)",
                           choices=("roofline", "fitted", "aic"))
    profile: str = knob("", help="cost_model fitted: a profile JSON path or builtin:NAME")
    aic_backend: str = knob("vllm", help="cost_model aic: whose kernel timings price the steps",
                            choices=("vllm", "sglang", "trtllm"))
    aic_version: str = knob("", help="cost_model aic: the backend's database version",
                            special={"": "aic's current one"})
    aic_kernel_scale: float = knob(1.0, help="cost_model aic: multiplies each step's kernel time (validate "
                                   "sets its engine's fitted serving scale, backends/sim/aic SERVING_TERMS)",
                                   range=(0.0, 10.0), open="lo")
    aic_mxfp4_moe_kernel: str = knob("default",
                                     help="cost_model aic, vLLM: the kernel of MXFP4 experts with 16-bit "
                                          "activations (gpt-oss on Hopper): the engine's default (aic's own "
                                          "table) or Marlin (VLLM_MXFP4_USE_MARLIN=1, priced from aic's "
                                          "Marlin MXFP4 MoE timings; backends/sim/aic/marlin.py)",
                                     choices=("default", "marlin"))
    aic_fp8_moe_kernel: str = knob("default",
                                   help="cost_model aic: the kernel of FP8 block-scaled or NVFP4 experts: aic's "
                                        "own table (TensorRT-LLM FP8: DeepGEMM on Blackwell; NVFP4: CUTLASS "
                                        "above 128 gathered tokens); trtllm, TensorRT-LLM's TRTLLM MoE backend "
                                        "(trtllm-gen: FP8 priced from aic's SGLang 0.5.14 timings of FlashInfer's "
                                        "trtllm_fp8_block_scale_moe, NVFP4 from aic's own trtllm-gen rows; "
                                        "backends/sim/aic/trtgen.py); triton, vLLM's Triton fused-MoE on FP8 "
                                        "block-scaled experts (VLLM_USE_FLASHINFER_MOE_FP8=0 and "
                                        "VLLM_MOE_USE_DEEP_GEMM=0 on Blackwell), priced from aic's vLLM 0.19.0 "
                                        "B200 timings of it (backends/sim/aic/vllm_triton.py)",
                                   choices=("default", "trtllm", "triton"))
    aic_nvfp4_moe_kernel: str = knob("default",
                                     help="cost_model aic, TensorRT-LLM: the MoE backend of NVFP4 experts where "
                                          "aic's own choice (trtllm-gen up to 128 gathered tokens, CUTLASS above) "
                                          "is not the engine's: cutlass, the CUTLASS backend (moe_config backend "
                                          "CUTLASS, TensorRT-LLM's default), priced from aic's CUTLASS NVFP4 rows "
                                          "at every token count, B200's from aic's GB200 table "
                                          "(backends/sim/aic/trtgen.py)",
                                     choices=("default", "cutlass"))
    aic_trtllm_wide_ep: bool = knob(False,
                                    help="cost_model aic, TensorRT-LLM, DeepSeek family, a disaggregated decode "
                                         "worker: every step's MoE block is aic's large-EP generation one (the NVLink two-sided all-to-all of the "
                                         "WIDEEP backend or of ConfigurableMoE with TRTLLM_FORCE_COMM_METHOD="
                                         "NVLINK_TWO_SIDED, and aic's wide-EP expert compute; FP8 block-scaled "
                                         "experts, which that table lacks, keep aic's MoE table, DeepGEMM) "
                                         "instead of the fused dispatch / MoE / combine (backends/sim/aic/"
                                         "graph.py); on GB300, "
                                         "whose aic tables hold no NVLink all-to-all, the all-to-all is priced "
                                         "from GB200's (a cross-system proxy: aic's system files give both the "
                                         "same NVLink 5 bandwidths; graph.py WIDE_EP_A2A_PROXY)")
    aic_moe_a2a: str = knob("default",
                            help="cost_model aic, SGLang: the MoE all-to-all under expert parallelism: aic's "
                                 "MoEDispatch for the backend; deepep_ll, a decode-only step's DeepEP low-latency "
                                 "(--moe-a2a-backend deepep --deepep-mode low_latency, priced from aic's "
                                 "large-EP deepep_ll dispatch / combine timings, and the experts from its "
                                 "DeepEP expert table where it has the layout); deepep_normal, a step with "
                                 "prefill's DeepEP normal mode (--deepep-mode normal, aic's deepep_ht timings and "
                                 "its DeepEP context expert table where it has the layout; backends/sim/aic/graph.py)",
                            choices=("default", "deepep_ll", "deepep_normal"))
    cpu_overhead_scale: float = knob(1.0,
                                     help="cost_model fitted: scale of the engine's CPU work (0.5 = twice "
                                          "as fast)",
                                     range=(0.0, None))
    allow_profile_mismatch: bool = knob(False,
                                        help="cost_model fitted: run a profile measured on another model or GPU")
    # -1 takes the GPU's own value from the catalog (backends/sim/catalog.py).
    eff_gemm: float = knob(-1.0, help="share of peak FLOPs that GEMMs reach", range=(0.0, 1.0), open="lo",
                           special={-1: "the GPU catalog's value"})
    eff_attention: float = knob(-1.0, help="share of peak FLOPs that attention reaches", range=(0.0, 1.0),
                                open="lo", special={-1: "the GPU catalog's value"})
    eff_memory: float = knob(-1.0, help="share of peak memory bandwidth reached", range=(0.0, 1.0), open="lo",
                             special={-1: "the GPU catalog's value"})
    eff_comm: float = knob(-1.0, help="share of peak interconnect bandwidth reached", range=(0.0, 1.0),
                           open="lo", special={-1: "the GPU catalog's value"})
    allreduce_latency_s: float = knob(-1.0, help="fixed latency of one all-reduce", unit="seconds",
                                      range=(0.0, 1.0), special={-1: "the GPU catalog's value"})
    allreduce_hop_s: float = knob(-1.0, help="latency per ring hop of an all-reduce", unit="seconds",
                                  range=(0.0, 1.0), special={-1: "the GPU catalog's value"})
    layer_floor_s: float = knob(-1.0, help="least time one layer takes", unit="seconds", range=(0.0, 1.0),
                                special={-1: "the GPU catalog's value"})
    # Host cost per step and per sequence: -1 takes engine_profile's (backends/sim/engine_profile.py).
    engine_profile: str = knob("eager_python", help="host costs per step and per sequence",
                               choices=tuple(ENGINE_PROFILES))
    step_overhead_s: float = knob(-1.0, help="host time per step", unit="seconds", range=(0.0, 1.0),
                                  special={-1: "engine_profile's"})
    per_seq_overhead_s: float = knob(-1.0, help="host time per sequence of a step", unit="seconds",
                                     range=(0.0, 1.0), special={-1: "engine_profile's"})
    # Precision, with vLLM's names (backends/sim/precision.py).
    dtype: str = knob("bfloat16", help="weights' and activations' dtype", choices=DTYPES)
    quantization: str = knob("none", help="weight quantization", choices=QUANTIZATIONS)
    kv_cache_dtype: str = knob("auto", help="KV cache dtype (auto: the model's dtype)",
                               choices=KV_CACHE_DTYPES)


def _scheduler_to_core(self: Any, num_blocks: int) -> SchedulerConfig:
    """The core's SchedulerConfig (validated there)."""
    values = {f.name: getattr(self, f.name) for f in fields(self)}
    return SchedulerConfig(num_blocks=num_blocks, **values)


# The core scheduler's knobs, derived from SchedulerConfig so a new knob needs no edit
# here; num_blocks is left out because it comes from the engine's memory, the host tier's
# because [kv_offload] sizes it (sim/kv_offload.py), adp_ranks because it is [engine]
# data_parallel_size (sim/build.py).
FROM_ELSEWHERE = ("num_blocks", "kv_offloading_blocks", "kv_offloading_policy", "adp_ranks")
SchedulerSection = dataclasses.make_dataclass(
    "SchedulerSection",
    [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in fields(SchedulerConfig)
     if f.name not in FROM_ELSEWHERE],
    namespace={"to_core": _scheduler_to_core,
               "__doc__": "The core scheduler's knobs (num_blocks comes from the engine's memory)."},
    slots=True,
)
SchedulerSection.__module__ = __name__  # so sweeps can pickle it into worker processes


@dataclass(slots=True)
class SLOConfig:
    """Latency targets for goodput."""

    ttft_s: float = knob(2.0, help="time-to-first-token target for goodput", unit="seconds",
                         range=(1e-6, 1e5))
    tpot_s: float = knob(0.1, help="time-per-output-token target for goodput", unit="seconds",
                         range=(1e-6, 1e5))


@dataclass(slots=True)
class SearchConfig:
    """`simulate search`: rate bracketing and the prices that rank configurations."""

    start_rate: float = knob(1.0, help="first rate tried; the bracket grows or shrinks from it",
                             unit="requests/s", range=(1e-4, 1e6))
    min_rate: float = knob(0.01, help="below this, a configuration is reported as meeting no rate",
                           unit="requests/s", range=(1e-4, 1e6))
    max_rate: float = knob(1000.0, help="above this, the search stops and reports the cap", unit="requests/s",
                           range=(1e-4, 1e6))
    tolerance: float = knob(0.02, help="stop when (hi - lo) / hi is within this", range=(0.0, None),
                            open="lo")
    target_rate: float = knob(0.0, help="rate to provision for", unit="requests/s", range=(0.0, None),
                              special={0: "rank by cost per token"})
    # USD per GPU-hour by hardware name; a GPU not listed takes the catalog's price.
    prices: dict[str, float] = knob(default_factory=dict,
                                    help="USD per GPU-hour by hardware name (a GPU not listed: the "
                                         "catalog's price)",
                                    flag=False)
    # Axes searched when --grid gives none, e.g. { hardware = ["A100-80GB", "H100-SXM"] }.
    grid: dict[str, list] = knob(default_factory=dict, help="axes searched when --grid gives none",
                                 flag=False)
    # Requests per run (0 = [workload] num_requests), doubled until the answer moves less than
    # `convergence` (sim/convergence.py; default chosen in docs/capacity.md).
    requests_per_run: int = knob(2000, help="requests per run, doubled until the answer converges",
                                 range=(0, None), special={0: "[workload] num_requests"})
    convergence: float = knob(0.05, help="stop doubling when the answer moves less than this",
                              range=(0.0, None), open="lo")
    max_requests_per_run: int = knob(16000, help="most requests per run while doubling", range=(1, None))
    estimate: bool = knob(True, help="place each configuration's first run at the cost model's "
                                     "steady-state rate (sim/search_run.py)")
    early_stop: bool = knob(True, help="end a run once an SLO percentile is lost for sure")
    band_seeds: int = knob(2, help="extra seeds run near each answer for its band", unit="seeds",
                           range=(0, 64), special={0: "no seed band"})
    model_error: str = knob("", help="`simulate validate`'s summary.json giving the cost model's error",
                            special={"": "simulate-validate/summary.json if present"})
    axis: str = knob("rate", help="what is searched: the highest open-loop rate or the most "
                                  "closed-loop clients meeting the SLOs", choices=("rate", "concurrency"))
    disaggregation: str = knob("off", help="'auto' also runs each point as the prefill/decode splits of "
                                           "gpu_budget (sim/search_disagg.py)", choices=("off", "auto"))
    gpu_budget: int = knob(0, help="GPUs a deployment may take", unit="GPUs", range=(0, None),
                           special={0: "no limit"})
    # A configuration whose cost, with its rate this much higher, still exceeds the cheapest's
    # with its rate this much lower cannot be the pick or a tie: its first answer stands.
    screen_margin: float = knob(0.35, help="rechecks and seed bands only for configurations within "
                                           "this relative rate margin of the cheapest (sim/search_screen.py)",
                                range=(0.0, None), special={0: "recheck and band every configuration"})
    first_tolerance: float = knob(0.05, help="bracket tolerance of the first run length when answers "
                                             "are rechecked at longer ones (they bisect to tolerance)",
                                  range=(0.0, None), special={0: "tolerance"})


@dataclass(slots=True)
class RunConfig:
    """Seed, stepping mode and a name for the outputs."""

    seed: int = knob(0, help="seed of every random stream of the study", range=(0, None))
    fast_forward: bool = knob(True, help="jump over steps whose outcome is known (the results are the same)")
    name: str = knob("study", help="a name for the outputs")


ROUTERS = ROUTER_NAMES  # the core's registry (twinserve.core.routing.ROUTERS)


@dataclass(slots=True)
class _ClusterBase:
    """Replicas behind a router; one replica (the default) is the single-engine simulator."""

    num_replicas: int = knob(1, help="engine replicas behind the router", unit="replicas", range=(1, 1024))
    router: str = field(default=RouterConfig.__dataclass_fields__["router"].default,
                        metadata=RouterConfig.__dataclass_fields__["router"].metadata)
    # Per-replica [engine]/[scheduler] overrides, e.g. [{hardware = "H100-SXM"}]; entry i is replica i.
    replicas: list = knob(default_factory=list,
                          help="per-replica [engine]/[scheduler] overrides; entry i is replica i", flag=False)
    # Disaggregation: the first num_prefill_replicas only prefill (0 = colocated).
    num_prefill_replicas: int = knob(0, help="disaggregation: the first N replicas only prefill",
                                     range=(0, None), special={0: "colocated"})
    kv_link_bandwidth: float = knob(0.0, help="disaggregation: KV transfer bandwidth of one decode GPU's link",
                                    unit="bytes/s", range=(1e6, 1e15),
                                    special={0: "the catalog's NVLink where a prefill and a decode worker fit "
                                                "one NVLink domain, else its network (sim/cluster_study.kv_link)"})
    kv_link_latency_s: float = knob(20e-6, help="disaggregation: KV transfer latency", unit="seconds",
                                    range=(0.0, 60.0))
    # Where a disaggregated request's first token reaches the client (sim/disagg.py): "prefill", the
    # prefill replica's sampled token (the default, as before); "decode", the decode replica's first
    # step for it, after the KV transfer, as the serving front ends stream it (trtllm-serve's disaggregated
    # server relays the generation server's stream; vLLM's P/D proxies and Dynamo stream from the decode
    # worker; SGLang's router returns the decode server's response); "decode_admit", the decode replica's
    # loop iteration that takes the transferred request, before any step runs it: SGLang's decode server
    # turns the transferred requests into a prebuilt batch and streams their first token without a forward
    # (sgl-project/sglang python/sglang/srt/disaggregation/decode.py, event_loop_normal_disagg_decode:
    # "Generate fake extend output", stream_output on the extend batch; read through the library's code
    # index, the same in every stored version).
    disagg_first_token: str = knob("prefill", help="disaggregation: the client's first token, from the prefill "
                                   "replica, the decode replica's first step (after the KV transfer), or the "
                                   "decode replica's loop iteration that admits it (decode_admit: SGLang)",
                                   choices=("prefill", "decode", "decode_admit"))
    # How a decode replica prices the one token of a transferred request past its transferred KV (the prefill's
    # sampled token, whose KV the decode replica computes in the request's first step there; sim/disagg.py):
    # "prefill" (the default, as before), a one-token prefill row; "decode", a decode row at the prompt's
    # context, as the engine runs it: SGLang's decode server merges the transferred requests into its running
    # batch and their first forward is a decode step's (sgl-project/sglang @278e503
    # python/sglang/srt/disaggregation/decode.py, get_next_disagg_decode_batch_to_run, process_prebuilt_extend);
    # under attention DP the rank that takes them runs an idle batch in that iteration, its own decodes held back
    # (event_loop_overlap_disagg_decode, _prepare_idle_batch_and_run): priced as the step lasting
    # (1 + ranks taking requests / ranks) times as long (sim/disagg.py DecodeExecutor.join_ranks).
    disagg_join_row: str = knob("prefill", help="disaggregation: the decode replica prices a transferred "
                                "request's first token as a one-token prefill row or as a decode row",
                                choices=("prefill", "decode"))
    # Which decode replica takes a disaggregated request once its prefill is done: the least loaded (the
    # default, as before), or each in turn whatever its load, as Dynamo's frontend does by default
    # (`--router-mode` round-robin; docs.nvidia.com/dynamo, Router Guide / Frontend reference).
    disagg_decode_router: str = knob("least_outstanding", help="disaggregation: how a decode replica is chosen "
                                     "for a prefilled request", choices=("least_outstanding", "round_robin"))
    # When a disaggregated request's prefill may start (sim/disagg.py): "transfer" (the default, as before),
    # at once, the decode replica taking the KV whenever it arrives; "prealloc", once its decode replica has
    # pre-allocated KV for the prompt, as SGLang's decode server does before the prefill server lets the
    # request out of its bootstrap queue (python/sglang/srt/disaggregation/decode.py, prefill.py).
    disagg_admission: str = knob("transfer", help="disaggregation: prefill at once ('transfer') or only once "
                                 "the decode replica pre-allocated the prompt's KV ('prealloc', SGLang)",
                                 choices=("transfer", "prealloc"))
    # SGLang's --num-reserved-decode-tokens (server_args.py, 512): under disagg_admission "prealloc" a decode
    # replica keeps this many free KV tokens per request it runs, holds in flight or has waiting.
    disagg_reserved_decode_tokens: int = knob(512, help="disaggregation, 'prealloc' admission: free KV tokens "
                                              "a decode replica keeps per request it holds",
                                              unit="tokens", range=(0, None))


def _router_config(self: Any) -> RouterConfig:
    """The router and its options' values as the core's RouterConfig."""
    return RouterConfig(self.router, {name: getattr(self, name) for name in router_option_fields()})


# Every registered router's own options (core.routing, e.g. prefix_affinity's prefix_blocks and
# load_factor) are [cluster] fields, declared once with their router.
ClusterConfig = dataclasses.make_dataclass(
    "ClusterConfig",
    [(name, f.type, field(default=f.default, metadata=f.metadata))
     for name, (_, f) in router_option_fields().items()],
    bases=(_ClusterBase,), slots=True,
    namespace={"router_config": _router_config, "__doc__": _ClusterBase.__doc__},
)
ClusterConfig.__module__ = __name__  # so sweeps can pickle it into worker processes


@dataclass(slots=True)
class StudyConfig:
    """A whole simulation: engine, scheduler, workload, SLOs, run options."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    speculative: SpeculativeSection = field(default_factory=SpeculativeSection)
    kv_offload: KVOffloadSection = field(default_factory=KVOffloadSection)
    source: str | None = None  # the file it came from, for error messages
    # True: workload.num_requests is the trace's row count (the study did not set it).
    num_requests_from_trace: bool = False
    short_trace_given: bool = False  # the study's own allow_short_trace, back when num_requests is set
    # A [model] / [hardware] table's spec (sim/specs.py), found by its name like a catalog entry.
    custom_model: Any = None
    custom_hardware: Any = None
    # 'section.field' names set from the file or --set (not left at their defaults).
    explicit: set = field(default_factory=set)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The config as nested tables."""
        return {s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}


SECTIONS: dict[str, type] = {"engine": EngineConfig, "scheduler": SchedulerSection,
                             "workload": WorkloadConfig, "slo": SLOConfig, "run": RunConfig,
                             "cluster": ClusterConfig, "search": SearchConfig,
                             "speculative": SpeculativeSection, "kv_offload": KVOffloadSection}

# Tables that define a spec rather than set fields: a model's config keys, a GPU's figures.
SPEC_TABLES = ("model", "hardware")
def section_table(section: str) -> str:
    """The Markdown knob table of one study table (core.knob_gen)."""
    from twinserve.core.knob_gen import knob_table

    return knob_table(SECTIONS[section])


def all_fields() -> dict[str, str]:
    """Every settable field as 'section.name' -> python type name."""
    out = {}
    for sname, cls in SECTIONS.items():
        for f in fields(cls):
            out[f"{sname}.{f.name}"] = f.type if isinstance(f.type, str) else f.type.__name__
    return out


def resolve_field(name: str) -> str:
    """'section.field', or a bare field name that exists in exactly one section."""
    known = all_fields()
    if name in known:
        return name
    if "." not in name:
        hits = [k for k in known if k.split(".", 1)[1] == name]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ConfigError(name, f"ambiguous: say one of {', '.join(hits)}")
    raise ConfigError(name, "no such field; known fields: " + ", ".join(sorted(known)))


def coerce(dotted: str, value: Any, file: str | None = None, line: int | None = None) -> Any:
    """Check (and, from strings, convert) a value for a field; ConfigError if it does not fit."""
    section, name = dotted.split(".", 1)
    ftype = next(f.type for f in fields(SECTIONS[section]) if f.name == name)
    tname = ftype if isinstance(ftype, str) else ftype.__name__

    def bad(msg: str) -> ConfigError:
        return ConfigError(dotted, msg, file, line)

    if dotted == "cluster.replicas":
        return _coerce_replicas(value, bad, file, line)
    if dotted == "search.grid":
        return _coerce_grid(value, bad, file, line)
    if dotted == "speculative.acceptance_rates":
        return coerce_speculative(name, value, bad)

    if isinstance(value, str) and tname != "str":
        text = value.strip()
        try:
            if tname == "bool":
                if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError
                value = text.lower() in ("true", "1", "yes", "on")
            elif tname == "int":
                value = int(text)
            elif tname == "float":
                value = float(text)
        except ValueError:
            kind = {"int": "an integer", "float": "a number", "bool": "true/false"}.get(tname, f"a {tname}")
            raise bad(f"{value!r} is not {kind}") from None
    if tname == "bool" and not isinstance(value, bool):
        raise bad(f"{value!r} is not true/false")
    if tname == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad(f"{value!r} is not an integer")
    if tname == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"{value!r} is not a number")
        try:
            value = float(value)
        except OverflowError:
            raise bad("the number is too large") from None
        if not math.isfinite(value):
            raise bad(f"{value!r} is not a finite number")
    if tname == "str" and not isinstance(value, str):
        raise bad(f"{value!r} is not a string")
    if tname.startswith("tuple"):  # scheduler.kv_groups: "0,1024", "[0, 1024]" or a TOML list
        if isinstance(value, str):
            text = value.strip().strip("[]()")
            try:
                value = [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                raise bad(f"{value!r} is not a list of integers (e.g. 0,1024)") from None
        if not isinstance(value, (list, tuple)) or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in value):
            raise bad(f"{value!r} is not a list of integers >= 0 (e.g. [0, 1024]; 0 = full attention)")
        value = tuple(value)
    if tname.startswith("dict"):
        if not isinstance(value, dict):
            raise bad(f"{value!r} is not a table (e.g. {{ \"A100-80GB\" = 1.8 }})")
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise bad(f"{k} = {v!r}: a price must be a number >= 0")
        value = {str(k): float(v) for k, v in value.items()}
    knob_field = SECTIONS[section].__dataclass_fields__[name]
    if knob_of(knob_field) is not None:  # declared with its range or choices (core/knobs.py)
        try:
            value = check_value(name, value, knob_field)
        except KnobError as e:
            raise bad(f"{value!r} is invalid: allowed {e.allowed}") from None
    if section == "speculative":
        return coerce_speculative(name, value, bad)
    return value


def _coerce_replicas(value: Any, bad: Any, file: str | None, line: int | None) -> list:
    """A list of per-replica override tables, each key an [engine] or [scheduler] field."""
    if isinstance(value, str):
        raise bad("per-replica overrides are set in the TOML file: "
                  "replicas = [{hardware = \"H100-SXM\"}, ...]")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise bad("must be a list of tables, e.g. [{hardware = \"H100-SXM\"}, {}]")
    out = []
    for i, table in enumerate(value):
        entry = {}
        for key, v in table.items():
            try:
                dotted = resolve_field(key)
            except ConfigError:
                raise bad(f"replica {i}: {key!r} is not an [engine] or [scheduler] field") from None
            if dotted.split(".", 1)[0] not in ("engine", "scheduler"):
                raise bad(f"replica {i}: only [engine] and [scheduler] fields may differ "
                          f"per replica, not {dotted}")
            entry[dotted] = coerce(dotted, v, file, line)
        out.append(entry)
    return out


def _coerce_grid(value: Any, bad: Any, file: str | None, line: int | None) -> dict[str, list[str]]:
    """[search.grid]: field = [values]; each field resolved and each value checked like --grid."""
    if not isinstance(value, dict):
        raise bad('must be a table of lists, e.g. { hardware = ["A100-80GB", "H100-SXM"] }')
    grid: dict[str, list[str]] = {}
    for key, values in value.items():
        if not isinstance(values, list) or not values:
            text = Path(file).read_text() if file and Path(file).is_file() else ""
            # The axis's own line in a [search.grid] table, else the caller's.
            at = (find_line(text, "search.grid", key) if text else None) or line
            raise ConfigError("search.grid", f"{key}: give a non-empty list of values", file, at)
        try:
            dotted = resolve_field(key)
        except ConfigError:
            raise bad(f"{key!r} is not a study field") from None
        if dotted in ("workload.rate", "search.grid"):
            raise bad(f"{key!r} cannot be a search axis")
        for v in values:
            coerce(dotted, v, file, line)
        grid[dotted] = [str(v) for v in values]
    return grid


def check_set(dotted: str, value: Any, file: str | None = None, line: int | None = None) -> None:
    """Checks of a value a user set (the default itself may mean 'off')."""
    if dotted == "workload.concurrency" and value < 1:
        raise ConfigError(dotted, f"{value!r} must be an integer >= 1 (closed-loop clients); "
                          "leave concurrency out for open-loop arrivals", file, line)


# Fields of an open-loop arrival process: none of them may be set beside a concurrency.
OPEN_LOOP_FIELDS = ("workload.arrival", "workload.rate", "workload.burstiness",
                    "workload.time_scale")
CLOSED_LOOP_FIELDS = ("workload.think_time_s", "workload.warmup_requests")


def use_closed_loop(cfg: "StudyConfig", concurrency: int) -> None:
    """Switch a study to N closed-loop clients, dropping the open-loop fields it set (for searches)."""
    check_set("workload.concurrency", concurrency)
    cfg.workload.concurrency = coerce("workload.concurrency", concurrency)
    cfg.explicit.difference_update(OPEN_LOOP_FIELDS)
    cfg.explicit.add("workload.concurrency")
    if cfg.workload.arrival == "trace":
        cfg.workload.arrival = "poisson"  # unused by clients; a trace still gives the lengths


def _check_loop(cfg: "StudyConfig", text: str) -> None:
    """Open loop (an arrival process) or closed loop (concurrency), never both."""
    w, file = cfg.workload, cfg.source
    if w.concurrency > 0:
        both = [f for f in OPEN_LOOP_FIELDS if f in cfg.explicit]
        if w.arrival == "trace" and "workload.arrival" not in both:
            both.append("workload.arrival")
        if both:
            names = " and ".join(f.split(".", 1)[1] for f in both)
            raise ConfigError("workload.concurrency", f"concurrency = {w.concurrency} (closed loop) "
                              f"is set together with {names} (an open-loop arrival process); "
                              "give one: concurrency for N clients, or arrival/rate",
                              file, find_line(text, "workload", "concurrency"))
        return
    for f in CLOSED_LOOP_FIELDS:
        name = f.split(".", 1)[1]
        if getattr(w, name):
            raise ConfigError(f, f"{name} = {getattr(w, name)!r} needs closed-loop clients: set "
                              "workload.concurrency = N (or leave it out)", file,
                              find_line(text, "workload", name))


def _check_range_ratio(cfg: "StudyConfig", text: str) -> None:
    """random_range_ratio applies to 'fixed' lengths, and its range stays in [min, max]."""
    w, file = cfg.workload, cfg.source
    r = w.random_range_ratio
    if r <= 0:
        return
    line = find_line(text, "workload", "random_range_ratio")
    fixed = [k for k in ("prompt", "output") if getattr(w, f"{k}_dist") == "fixed"]
    if not fixed:
        raise ConfigError("workload.random_range_ratio", f"{r:g} applies to 'fixed' lengths, and "
                          f"prompt_dist = {w.prompt_dist!r}, output_dist = {w.output_dist!r}: set "
                          "one of them to 'fixed' (its mean is L)", file, line)
    for k in fixed:
        low, high = range_bounds(getattr(w, f"{k}_mean"), r)
        lo, hi = getattr(w, f"{k}_min"), getattr(w, f"{k}_max")
        if low < lo or high > hi:
            raise ConfigError("workload.random_range_ratio", f"{r:g} draws {k} lengths in "
                              f"[{low}, {high}], outside {k}_min = {lo}, {k}_max = {hi}; widen "
                              f"{k}_min/{k}_max or lower the ratio", file, line)


def replica_config(cfg: StudyConfig, index: int) -> StudyConfig:
    """The study as replica `index` sees it: the base tables with its overrides applied."""
    overrides = cfg.cluster.replicas[index] if index < len(cfg.cluster.replicas) else {}
    if not overrides:
        return cfg
    rc = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine),
                             scheduler=dataclasses.replace(cfg.scheduler))
    for dotted, value in overrides.items():
        section, name = dotted.split(".", 1)
        setattr(getattr(rc, section), name, value)
    return rc


def set_field(cfg: StudyConfig, name: str, value: Any, file: str | None = None,
              line: int | None = None) -> None:
    """Set one field by (possibly bare) name, with type checks."""
    dotted = resolve_field(name)
    section, fname = dotted.split(".", 1)
    value = coerce(dotted, value, file, line)
    check_set(dotted, value, file, line)
    setattr(getattr(cfg, section), fname, value)
    cfg.explicit.add(dotted)
    if dotted == "workload.num_requests" and cfg.num_requests_from_trace:
        cfg.num_requests_from_trace = False  # set now: a trace short of it is an error again
        cfg.workload.allow_short_trace = cfg.short_trace_given
    elif dotted == "workload.allow_short_trace" and cfg.num_requests_from_trace:
        cfg.short_trace_given = value  # what it goes back to once num_requests is set
        cfg.workload.allow_short_trace = True
    elif dotted in ("workload.trace", "workload.trace_cycle") and "workload.num_requests" not in cfg.explicit:
        follow_trace_length(cfg)  # another trace (--set, a grid axis): count its rows, not the old one's


def from_dict(data: dict[str, Any], file: str | None = None, text: str = "") -> StudyConfig:
    """Build a StudyConfig from nested tables; unknown tables and keys are errors."""
    cfg = StudyConfig(source=file)
    for section, table in data.items():
        if section in SPEC_TABLES:
            continue  # read after [engine], which may name them (sim/specs.py)
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown table [{section}]; known: {', '.join(SECTIONS)}",
                              file, find_line(text, section, None))
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table", file, find_line(text, None, section))
        names = {f.name for f in fields(SECTIONS[section])}
        for key, value in table.items():
            line = find_line(text, section, key)
            if key not in names:
                raise ConfigError(f"{section}.{key}", "no such field; known: "
                                  + ", ".join(sorted(names)), file, line)
            value = coerce(f"{section}.{key}", value, file, line)
            check_set(f"{section}.{key}", value, file, line)
            setattr(getattr(cfg, section), key, value)
            cfg.explicit.add(f"{section}.{key}")
    if any(t in data for t in SPEC_TABLES):
        from twinserve.sim.specs import read_spec_tables
        read_spec_tables(cfg, data, text)
    if "workload.num_requests" not in cfg.explicit:
        follow_trace_length(cfg)
    validate(cfg, text)
    return cfg


def follow_trace_length(cfg: StudyConfig) -> None:
    """num_requests when the study did not set it: every row of a (not replayed) trace, else the default.

    Called when the file is read and again whenever trace or trace_cycle is set after it.
    """
    if cfg.num_requests_from_trace:  # undo the last trace's count first
        cfg.num_requests_from_trace = False
        cfg.workload.num_requests = WorkloadConfig().num_requests
        cfg.workload.allow_short_trace = cfg.short_trace_given
    if cfg.workload.trace and not cfg.workload.trace_cycle:
        default_to_trace_length(cfg)


def default_to_trace_length(cfg: StudyConfig) -> None:
    """A trace without num_requests serves every row it has (not the 400 of a drawn workload)."""
    from twinserve.sim.traces import read_trace

    try:
        path = Path(trace_path(cfg.workload.trace, cfg.source or ""))
    except UnknownBuiltinTrace:
        return  # the build names the unknown trace
    if not path.is_file():
        return  # the build names the missing file
    cfg.workload.num_requests = max(1, sum(1 for _ in read_trace(path)))
    # Rows dropped as over-long are counted as such, not as a short trace (study.check_turns).
    cfg.short_trace_given = cfg.workload.allow_short_trace
    cfg.workload.allow_short_trace = True
    cfg.num_requests_from_trace = True


def validate(cfg: StudyConfig, text: str = "") -> None:
    """Cross-field checks, reusing the core's own validation of scheduler fields."""
    file = cfg.source
    w = cfg.workload
    for section, table in (("engine", cfg.engine), ("scheduler", cfg.scheduler), ("workload", w),
                           ("slo", cfg.slo), ("run", cfg.run), ("cluster", cfg.cluster),
                           ("search", cfg.search), ("speculative", cfg.speculative),
                           ("kv_offload", cfg.kv_offload)):
        for f in fields(table):  # fields set in code bypass coerce(): check (and convert) them all again
            tname = f.type if isinstance(f.type, str) else f.type.__name__
            if tname not in ("int", "float", "bool", "str"):
                continue
            setattr(table, f.name, coerce(f"{section}.{f.name}", getattr(table, f.name), file,
                                          find_line(text, section, f.name)))
    if not isinstance(cfg.cluster.replicas, list):
        raise ConfigError("cluster.replicas", "must be a list of tables", file, find_line(text, "cluster", "replicas"))
    try:
        cfg.scheduler.to_core(1)
    except InvalidConfigError as e:
        raise ConfigError(f"scheduler.{e.field}", str(e), file,
                          find_line(text, "scheduler", e.field)) from None
    for kind in ("prompt", "output"):
        lo, hi = getattr(w, f"{kind}_min"), getattr(w, f"{kind}_max")
        if lo > hi:
            raise ConfigError(f"workload.{kind}_min", f"{kind}_min={lo} is above {kind}_max={hi}", file,
                              find_line(text, "workload", f"{kind}_min"))
    if w.system_prompt_len > cfg.scheduler.max_model_len:
        raise ConfigError("workload.system_prompt_len", f"{w.system_prompt_len} is above scheduler.max_model_len="
                          f"{cfg.scheduler.max_model_len}", file, find_line(text, "workload", "system_prompt_len"))
    if w.on_overlong == "drop" and "trace" not in (w.prompt_dist, w.output_dist):
        def least(kind: str) -> int:  # the shortest length the distribution can draw
            lo, hi = getattr(w, f"{kind}_min"), getattr(w, f"{kind}_max")
            mean = getattr(w, f"{kind}_mean")
            return min(max(round(mean), lo), hi) if getattr(w, f"{kind}_dist") == "fixed" else lo
        if least("prompt") + least("output") > cfg.scheduler.max_model_len:
            raise ConfigError("workload.on_overlong", f"'drop' would drop every request: the shortest "
                              f"is {least('prompt')} + {least('output')} tokens, above max_model_len = "
                              f"{cfg.scheduler.max_model_len}", file, find_line(text, "workload", "on_overlong"))
    _check_loop(cfg, text)
    _check_range_ratio(cfg, text)
    if "trace" in (w.arrival, w.prompt_dist, w.output_dist) and not w.trace:
        raise ConfigError("workload.trace", "a trace file is needed for arrival or lengths "
                          "'trace'", file, find_line(text, "workload", "trace"))
    if cfg.search.min_rate > cfg.search.max_rate:
        raise ConfigError("search.min_rate", f"min_rate = {cfg.search.min_rate:g} is above max_rate = "
                          f"{cfg.search.max_rate:g} req/s", file, find_line(text, "search", "min_rate"))
    c = cfg.cluster
    if len(c.replicas) > c.num_replicas:
        raise ConfigError("cluster.replicas", f"{len(c.replicas)} per-replica entries for "
                          f"num_replicas = {c.num_replicas}", file,
                          replica_line(text, c.num_replicas))
    if c.num_prefill_replicas and c.num_prefill_replicas >= c.num_replicas:
        raise ConfigError("cluster.num_prefill_replicas", f"{c.num_prefill_replicas} prefill "
                          f"replicas leave no decode replica out of {c.num_replicas}", file,
                          find_line(text, "cluster", "num_prefill_replicas"))
    for i in range(len(c.replicas)):
        try:
            replica_config(cfg, i).scheduler.to_core(1)
        except InvalidConfigError as e:
            raise ConfigError(f"cluster.replicas[{i}].{e.field}", str(e), file,
                              replica_line(text, i, e.field)) from None
    check_speculative(cfg.speculative, lambda name, msg: ConfigError(
        f"speculative.{name}", msg, file, find_line(text, "speculative", name)))
    check_kv_offload(cfg.kv_offload, lambda name, msg: ConfigError(
        f"kv_offload.{name}", msg, file, find_line(text, "kv_offload", name)))
    if cfg.engine.cost_model == "fitted" and not cfg.engine.profile:
        raise ConfigError("engine.profile", "cost_model 'fitted' needs a profile JSON path",
                          file, find_line(text, "engine", "profile"))


def load_config(path: str | Path) -> StudyConfig:
    """Read a study TOML file; errors name the field, the file and the line."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError("--config", "file not found", str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        line, why = unreadable_text(p, e)
        raise ConfigError("--config", why, str(p), line) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        line = getattr(e, "lineno", None)
        if line is None and "line " in msg:
            try:
                line = int(msg.rsplit("line ", 1)[1].split(",")[0].rstrip(")"))
            except ValueError:
                line = None
        raise ConfigError("<toml>", f"not valid TOML ({msg})", str(p), line) from None
    return from_dict(data, str(p), text)
