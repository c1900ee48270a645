"""Turn a StudyConfig into a running Simulation: catalog look-ups, cost model, KV pool."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from twinserve.backends.sim.capacity import KVCapacity, kv_capacity, model_kv_groups
from twinserve.core.kv.model_kv import kv_groups_for as core_kv_groups_for, with_model_kv
from twinserve.backends.sim.capacity import DoesNotFitError
from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec
from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
from twinserve.backends.sim.precision import Precision
from twinserve.backends.sim.cost_model import CostModel, DraftModelSteps, Efficiency, RooflineCostModel, WorkTotals
from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.cost_model import roofline_for
from twinserve.backends.sim.parallel import Parallelism, ParallelismError
from twinserve.backends.sim.fitted import FittedCostModel, ProfileError, check_profile_model
from twinserve.backends.sim.host_link import HostLink, HostTierExecutor, host_link_from_profile
from twinserve.backends.sim.spec import SpecAcceptance
from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import InvalidConfigError

from twinserve.sim.config import StudyConfig, field_error, replica_config, replica_line, source_text, validate
from twinserve.sim.errors import ConfigError
from twinserve.sim.kv_offload import host_tier_blocks
from twinserve.sim.specs import MTP_DRAFT, resolve_draft_model, resolve_hardware, resolve_model
from twinserve.sim.workload import Workload
from twinserve.sim.trace_paths import BUILTIN_TRACES, DATA_DIR, UnknownBuiltinTrace, trace_path  # noqa: F401
from twinserve.sim.world import RunResult, Simulation

# Efficiency attribute -> [engine] field; a negative field keeps the catalog's value.
EFFICIENCY_FIELDS = {"gemm": "eff_gemm", "attention": "eff_attention", "memory": "eff_memory",
                     "comm": "eff_comm", "allreduce_latency_s": "allreduce_latency_s",
                     "allreduce_hop_s": "allreduce_hop_s", "layer_floor_s": "layer_floor_s"}



class DoesNotFit(ConfigError):
    """The model's weights leave no KV room on this GPU at this TP (a capacity answer, not a typo)."""

    def __init__(self, err: ConfigError) -> None:
        super().__init__(err.field, err.args[1], err.file, err.line)


def fit_problem(cfg: StudyConfig) -> str:
    """Why this configuration cannot hold the model ('' when it can); other errors raise."""
    try:
        model, hw, _, _ = build_cost_models(cfg)
    except ConfigError as err:
        if err.field in ("engine.tensor_parallel_size", "engine.expert_parallel_size", "engine.redundant_experts",
                         "engine.pipeline_parallel_size", "engine.data_parallel_size"):  # a split the shape does not allow
            return str(err.args[1])
        raise
    e, s = cfg.engine, cfg.scheduler
    reserve = None if e.activation_reserve_gib < 0 else e.activation_reserve_gib * 2**30
    try:
        kv_capacity(model, hw, e.tensor_parallel_size, s.block_size, e.gpu_memory_utilization,
                    s.max_num_batched_tokens, s.max_num_seqs, reserve, e.num_gpu_blocks or None,
                    parallel=parallelism(cfg), memory_basis=e.kv_memory_basis)
    except DoesNotFitError as err:
        allowed = str(err.args[2])  # "a value leaving room for KV blocks: <why>"
        return allowed.split(": ", 1)[-1]
    return ""


@dataclass(slots=True)
class BuiltStudy:
    """The pieces of one study, kept for the report."""

    cfg: StudyConfig
    model: ModelSpec
    hardware: HardwareSpec
    roofline: RooflineCostModel
    cost_model: CostModel
    capacity: KVCapacity
    workload: Workload
    simulation: Simulation


def _cfg_error(cfg: StudyConfig, section: str, field: str, msg: str) -> ConfigError:
    return field_error(cfg, f"{section}.{field}", msg)


def resolve_trace(cfg: StudyConfig) -> str:
    """The trace path: a builtin name, or a path (relative to the config file when given)."""
    try:
        return trace_path(cfg.workload.trace, cfg.source or "")
    except UnknownBuiltinTrace as e:
        raise _cfg_error(cfg, "workload", "trace", str(e)) from None


def parallelism(cfg: StudyConfig) -> Parallelism:
    """The engine's TP, attention-DP, EP and PP sizes."""
    e = cfg.engine
    return Parallelism(e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size,
                       e.pipeline_parallel_size, e.redundant_experts)


def build_cost_models(cfg: StudyConfig) -> tuple[ModelSpec, HardwareSpec, RooflineCostModel,
                                                 CostModel]:
    """Model and hardware specs, the roofline (always, for MFU/MBU) and the step-time model."""
    e = cfg.engine
    model = resolve_model(cfg).with_precision(
        Precision(e.dtype, e.quantization, e.kv_cache_dtype))
    hw = resolve_hardware(cfg)
    overrides = {name: getattr(e, field) for name, field in EFFICIENCY_FIELDS.items()
                 if getattr(e, field) >= 0}
    prof = ENGINE_PROFILES[e.engine_profile]
    eff = Efficiency.for_hardware(
        hw, step_overhead_s=e.step_overhead_s if e.step_overhead_s >= 0 else prof.step_overhead_s,
        per_seq_overhead_s=e.per_seq_overhead_s if e.per_seq_overhead_s >= 0
        else prof.per_seq_overhead_s, **overrides)
    try:
        roof = roofline_for(model, hw, parallelism(cfg), eff)
    except ParallelismError as err:
        raise _cfg_error(cfg, "engine", err.field, str(err)) from None
    except ValueError as err:
        msg = str(err)
        names = dict(EFFICIENCY_FIELDS, step_overhead_s="step_overhead_s",
                     per_seq_overhead_s="per_seq_overhead_s")
        field = next((f for n, f in names.items() if f"efficiency {n}" in msg),
                     "tensor_parallel_size")
        raise _cfg_error(cfg, "engine", field, str(err)) from None
    cost: CostModel = roof
    if e.cost_model == "fitted":
        if not e.profile:
            raise _cfg_error(cfg, "engine", "profile", "cost_model 'fitted' needs a profile: a JSON "
                             "file from `twinserve calibrate` or builtin:NAME")
        profile = e.profile
        if (not profile.startswith("builtin:") and not Path(profile).is_absolute() and cfg.source
                and not Path(profile).exists()):
            profile = str(Path(cfg.source).parent / profile)
        try:
            fitted = FittedCostModel.load(profile)
            check_profile_model(fitted, model.name, e.allow_profile_mismatch,
                                source=f"profile {e.profile}")
        except ProfileError as err:
            raise _cfg_error(cfg, "engine", "profile", str(err)) from None
        fitted.overhead_scale = e.cpu_overhead_scale
        cost = fitted
    elif e.cost_model == "aic":
        from twinserve.backends.sim.aic import AicCostModel, AicError
        try:
            # aic's step estimate holds kernel time only: host overheads are added only when set.
            cost = AicCostModel(model, hw, e.tensor_parallel_size, e.aic_backend, e.aic_version,
                                parallel=parallelism(cfg), step_overhead_s=max(e.step_overhead_s, 0.0),
                                per_seq_overhead_s=max(e.per_seq_overhead_s, 0.0),
                                kernel_scale=e.aic_kernel_scale, mxfp4_moe_kernel=e.aic_mxfp4_moe_kernel,
                                fp8_moe_kernel=e.aic_fp8_moe_kernel, trtllm_wide_ep=e.aic_trtllm_wide_ep,
                                moe_a2a=e.aic_moe_a2a, nvfp4_moe_kernel=e.aic_nvfp4_moe_kernel)
        except AicError as err:
            raise _cfg_error(cfg, "engine", err.field, str(err)) from None
    return model, hw, roof, cost


@dataclass(slots=True)
class BuiltEngine:
    """One simulated engine replica: specs, cost models, KV capacity, core and executor."""

    model: ModelSpec
    hardware: HardwareSpec
    roofline: RooflineCostModel
    cost_model: CostModel
    capacity: KVCapacity
    core: EngineCore
    executor: SimExecutor
    host_blocks: int = 0  # the host KV tier's blocks (0: no tier)


def host_tier(cfg: StudyConfig, hw: HardwareSpec, cap: KVCapacity,
              cost: CostModel | None = None) -> tuple[int, HostLink | None, bool]:
    """The [kv_offload] tier's size in blocks, its link and whether copies are synchronous (0, None,
    False when off); errors name the field.

    The link: [kv_offload] bandwidth/latency_s if set, else a fitted profile's measured copies
    (`twinserve calibrate`), else the GPU's host link in the catalog. A profile timed on a CPU engine
    copies synchronously, before its forward.
    """
    off = cfg.kv_offload
    if not off.enabled:
        return 0, None, False

    def error(name: str, msg: str) -> ConfigError:
        return _cfg_error(cfg, "kv_offload", name, msg)

    if not cfg.scheduler.enable_prefix_caching:
        raise error("host_size_gib" if off.host_size_gib else "host_blocks", "a host tier keeps blocks by "
                    "their prefix hash: it needs scheduler.enable_prefix_caching = true")
    e = cfg.engine
    # A block's page lives on every TP rank of its pipeline stage; the tier keeps all of them.
    n = host_tier_blocks(off, cap.block_bytes, e.tensor_parallel_size * e.pipeline_parallel_size, error)
    load = store = (hw.host_link_bandwidth, hw.host_link_latency_s)
    synchronous = False
    meta = getattr(cost, "meta", None)
    if isinstance(meta, dict):
        try:
            measured = host_link_from_profile(meta, f"profile {e.profile}")
        except InvalidConfigError as err:
            raise _cfg_error(cfg, "engine", "profile", str(err)) from None
        if measured is not None:
            load = (measured["load_bandwidth"], measured["load_latency_s"])
            store = (measured["store_bandwidth"], measured["store_latency_s"])
            synchronous = bool(measured["synchronous"])
    if off.bandwidth > 0:
        load, store = (off.bandwidth, load[1]), (off.bandwidth, store[1])
    if off.latency_s >= 0:
        load, store = (load[0], off.latency_s), (store[0], off.latency_s)
    try:
        return n, HostLink(load[0], load[1], cap.block_bytes, store[0], store[1]), synchronous
    except InvalidConfigError as err:
        raise error(err.field, str(err)) from None


def kv_groups_for(cfg: StudyConfig, model: ModelSpec) -> tuple[int, ...]:
    """The KV groups the core runs (core.kv.model_kv's one rule, the engine's too).

    scheduler.sliding_window set by hand keeps one group; kv_groups = [0] keeps every block.
    """
    return core_kv_groups_for(cfg.scheduler, model_kv_groups(model))


def draft_spec(cfg: StudyConfig, model: ModelSpec) -> ModelSpec | None:
    """The [speculative] draft model of a draft_model study (None otherwise)."""
    spec = cfg.speculative
    if not spec.enabled or spec.method != "draft_model":
        return None
    return resolve_draft_model(cfg, model)


def draft_cost_model(cfg: StudyConfig, draft: ModelSpec, hw: HardwareSpec, roof: RooflineCostModel,
                     cost: CostModel) -> CostModel:
    """The draft's cost model: aiconfigurator-core's kernels at the target's layout, backend and kernel
    scale when the target is priced by them (no host terms: the draft's forwards run inside the
    target's step), else the roofline at the target's efficiencies."""
    if cfg.engine.cost_model == "aic":
        from twinserve.backends.sim.aic import AicCostModel, AicError
        try:
            return AicCostModel(draft, hw, cost.tp, cost.backend, cost.version, parallel=cost.par,
                                kernel_scale=cost.kernel_scale, moe_a2a=cost.moe_a2a)
        except AicError as err:
            raise _cfg_error(cfg, "speculative", "draft_model", f"the draft {draft.name}: {err}") from None
    return RooflineCostModel(draft, hw, cfg.engine.tensor_parallel_size, roof.eff)


def engine_capacity(cfg: StudyConfig, model: ModelSpec, hw: HardwareSpec) -> KVCapacity:
    """The engine's KV pool size from its memory (or engine.num_gpu_blocks)."""
    e, s = cfg.engine, cfg.scheduler
    if s.max_model_len > model.max_position_embeddings:
        raise _cfg_error(cfg, "scheduler", "max_model_len",
                         f"{s.max_model_len} is above {model.name}'s context of {model.max_position_embeddings} "
                         "tokens")
    reserve = None if e.activation_reserve_gib < 0 else e.activation_reserve_gib * 2**30
    try:
        cap = kv_capacity(model, hw, e.tensor_parallel_size, s.block_size,
                          e.gpu_memory_utilization, s.max_num_batched_tokens, s.max_num_seqs,
                          reserve, e.num_gpu_blocks or None, kv_groups=kv_groups_for(cfg, model),
                          parallel=parallelism(cfg), memory_basis=e.kv_memory_basis)
        draft = draft_spec(cfg, model)
        if draft is None:
            return cap
        # The draft's weights and its own KV (one slot per target slot) share the GPU, as in the engine: laid
        # out as the target's (dense over TP, experts over the TP x DP group), each attention-DP rank's pool
        # its own. The target's own MTP layer reads the target's embedding and LM head: not held twice.
        par = parallelism(cfg)
        draft_weights = par.weight_bytes_per_gpu(draft)
        if cfg.speculative.draft_model == MTP_DRAFT:
            draft_weights -= draft.embedding_params * draft.dtype_bytes / e.tensor_parallel_size
        usable = cap.usable_bytes - draft_weights
        block_bytes = cap.block_bytes + s.block_size * draft.kv_bytes_per_token_per_gpu(e.tensor_parallel_size)
        n = e.num_gpu_blocks or int(usable // block_bytes) * par.data_parallel_size
        if n < 1:
            raise DoesNotFitError("gpu_memory_utilization", e.gpu_memory_utilization,
                                  f"a value leaving room for KV blocks beside the target and the draft "
                                  f"{draft.name}; raise tensor_parallel_size or use a bigger GPU")
        return KVCapacity(n, usable, cap.weight_bytes + draft_weights,
                          cap.activation_bytes, block_bytes, cap.reserved_bytes)
    except DoesNotFitError as err:
        raise DoesNotFit(_cfg_error(cfg, "engine", err.field, str(err))) from None
    except InvalidConfigError as err:
        section = "scheduler" if err.field == "kv_groups" else "engine"
        raise _cfg_error(cfg, section, err.field, str(err)) from None


def build_engine(cfg: StudyConfig) -> BuiltEngine:
    """An EngineCore with its cost model and KV pool, from the [engine] and [scheduler] tables."""
    model, hw, roof, cost = build_cost_models(cfg)
    s = cfg.scheduler
    cap = engine_capacity(cfg, model, hw)
    try:
        sched_cfg = with_model_kv(s.to_core(cap.num_blocks), model_kv_groups(model))
        dp = cfg.engine.data_parallel_size
        if dp > 1:  # each attention-DP rank schedules its own batch, as vLLM's DP engine cores do
            sched_cfg = dataclasses.replace(sched_cfg, max_num_seqs=s.max_num_seqs * dp,
                                            max_num_batched_tokens=s.max_num_batched_tokens * dp,
                                            adp_ranks=dp)  # the ranks an attention-DP balance waits for
    except InvalidConfigError as err:
        raise _cfg_error(cfg, "scheduler", err.field, str(err)) from None
    executor = SimExecutor(cost, WorkTotals.window_of(model))  # a profile's steps read the window too
    spec = cfg.speculative
    core_spec = spec.to_core() if spec.enabled else None
    if spec.enabled:
        executor.spec = SpecAcceptance(spec.num_speculative_tokens, spec.rates(cfg.source), cfg.run.seed,
                                       spec.acceptance_spread)
        executor.spec_active = core_spec.active
    draft = draft_spec(cfg, model)
    if draft is not None and core_spec is not None:
        # The draft's steps are priced from its shape on the same GPU (a profile fits the target only):
        # by the measured kernels where the target is, else by the roofline.
        executor.draft = DraftModelSteps(draft_cost_model(cfg, draft, hw, roof, cost), spec.num_speculative_tokens)
    host_blocks, link, synchronous = host_tier(cfg, hw, cap, cost)
    if host_blocks:
        sched_cfg = dataclasses.replace(sched_cfg, kv_offloading_blocks=host_blocks,
                                        kv_offloading_policy=cfg.kv_offload.eviction)
    core = EngineCore(sched_cfg, executor, speculative_config=core_spec)
    # The cost model reads counts only (SimExecutor.execute, sim.disagg.DecodeExecutor,
    # HostTierExecutor's loads and stores come from the KV manager): no block id lists, no copy of
    # a new request's tokens per admission (~9% of a search's CPU: issue 50, docs/search-speed.md).
    core.scheduler.executor_reads_tables = False
    if link is not None:
        core.executor = HostTierExecutor(executor, link, synchronous)
    return BuiltEngine(model, hw, roof, cost, cap, core, executor, host_blocks)


@contextlib.contextmanager
def _blame_replica(cfg: StudyConfig, index: int) -> Iterator[None]:
    """Re-raise an error in one of replica `index`'s overrides as that cluster.replicas entry's."""
    try:
        yield
    except ConfigError as e:
        overrides = cfg.cluster.replicas[index] if index < len(cfg.cluster.replicas) else {}
        if e.field not in overrides:
            raise
        name = e.field.split(".", 1)[1]
        text = source_text(cfg)
        raise ConfigError(f"cluster.replicas[{index}].{name}", e.args[1], cfg.source,
                          replica_line(text, index, name) if text else None) from None


def build_replica_engine(cfg: StudyConfig, index: int) -> BuiltEngine:
    """Replica `index`'s engine; an error in one of its overrides names that cluster.replicas entry."""
    with _blame_replica(cfg, index):
        return build_engine(replica_config(cfg, index))


# Simulator memory per KV block, ~120 B measured (docs/cluster.md).
BLOCK_BYTES = 120
MAX_POOL_BYTES = 4 * 2**30


def check_pool_memory(cfg: StudyConfig) -> int:
    """The simulated KV pools' bytes over all replicas; ConfigError (before any is built) past MAX_POOL_BYTES."""
    c = cfg.cluster
    n = max(1, c.num_replicas)
    blocks = 0
    base: int | None = None
    for i in range(n):
        own = i < len(c.replicas) and bool(c.replicas[i])
        if own or base is None:
            rc = replica_config(cfg, i)
            with _blame_replica(cfg, i):
                model, hw, _, _ = build_cost_models(rc)
                num = engine_capacity(rc, model, hw).num_blocks
            if not own:
                base = num
        blocks += num if own else base
    total = blocks * BLOCK_BYTES
    if total > MAX_POOL_BYTES:
        raise _cfg_error(cfg, "cluster", "num_replicas",
                         f"{n} replica(s) would hold {blocks:,} KV blocks, about "
                         f"{total / 2**30:.1f} GiB of simulator memory ({BLOCK_BYTES} B a block); "
                         f"the limit is {MAX_POOL_BYTES / 2**30:g} GiB: use fewer replicas or "
                         "set engine.num_gpu_blocks to a smaller pool per replica")
    return total


def build_workload(cfg: StudyConfig) -> Workload:
    """The study's workload (lazy; token ids made on arrival)."""
    s = cfg.scheduler
    workload = Workload(cfg.workload, cfg.run.seed, s.max_model_len, resolve_trace(cfg))
    workload.distinct_tokens = s.enable_prefix_caching
    workload.require_all = not cfg.workload.allow_short_trace
    # A study that states its trace's unit runs any arrival rate it gives.
    workload.check_trace_rate = "workload.trace_time_unit" not in cfg.explicit
    return workload


def build(cfg: StudyConfig) -> BuiltStudy:
    """Every object of a one-replica study, ready to run (validated first: fields may be set in code).

    Its cluster.replicas entry is applied, as a cluster applies it to replica 0.
    """
    validate(cfg)
    check_pool_memory(cfg)
    eng = build_replica_engine(cfg, 0)
    cfg = replica_config(cfg, 0)
    workload = build_workload(cfg)
    sim = Simulation(eng.core, eng.executor, workload, cfg.run.fast_forward)
    return BuiltStudy(cfg, eng.model, eng.hardware, eng.roofline, eng.cost_model, eng.capacity,
                      workload, sim)


def simulate(cfg: StudyConfig) -> tuple[BuiltStudy, RunResult]:
    """Build and run one study."""
    built = build(cfg)
    return built, built.simulation.run()
