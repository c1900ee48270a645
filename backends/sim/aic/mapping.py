"""twinserve's names to aiconfigurator-core's: hardware to systems, precision to quant modes, versions.

aiconfigurator-core (Apache-2.0, pip `aiconfigurator-core`) ships per-operation kernel timings under
systems/data/<system>/<op family>/<backend>/<version>/; its SDK answers queries over them. Nothing here
reads those files: every look-up goes through the SDK.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from twinserve.core.errors import TwinserveError

from twinserve.backends.sim.catalog import AIC_SYSTEMS
from twinserve.backends.sim.precision import Precision

BACKENDS = ("vllm", "sglang", "trtllm")
INSTALL_HINT = "pip install 'twinserve[aic]' (the aiconfigurator-core==0.12.0 extra; Python >= 3.11)"

# twinserve hardware names (catalog.HARDWARES), lower-cased -> aic system names: catalog.AIC_SYSTEMS reversed.
SYSTEMS: dict[str, str] = {hw.lower(): system for system, hw in AIC_SYSTEMS.items()}


class AicError(TwinserveError, ValueError):
    """The measured backend cannot price this study: names the [engine] field, what is missing and what exists."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self._keep_args(message, field, message)


def sdk() -> Any:
    """aiconfigurator_core.sdk's perf_database module, or AicError saying how to install it."""
    try:
        from aiconfigurator_core.sdk import perf_database
    except ImportError as err:
        raise AicError("cost_model", f"cost_model 'aic' needs aiconfigurator-core, which is not installed "
                       f"({err}): {INSTALL_HINT}") from None
    return perf_database


# One aic engine handle per database, kept for the process: id(database) -> (database, evaluate_ops_json).
_EVALUATORS: dict[int, tuple[Any, Any]] = {}


def evaluator(database: Any) -> Any:
    """aic's op-list evaluation (EngineHandle.evaluate_ops_json) over `database`, one handle a process.

    aic's compiled engine reads a database's kernel tables from disk when an op first needs them and
    frees them with the last handle that holds them (aiconfigurator_core/sdk/engine.py, EngineHandle
    and its probe-handle LRU of 8). A handle per cost model freed the tables with each study, so a
    study on a database the previous ones had let go loaded its tables again (1.5-4.6 s each): a
    quarter of the CPU of a `simulate validate` run, whose rows interleave a dozen databases
    (docs/validate-speed.md).
    """
    got = _EVALUATORS.get(id(database))
    if got is None or got[0] is not database:
        from aiconfigurator_core.sdk.engine import EngineHandle
        got = _EVALUATORS[id(database)] = (database, EngineHandle.for_database(database).evaluate_ops_json)
    return got[1]


@cache
def supported() -> dict[str, dict[str, list[str]]]:
    """aic's system -> backend -> versions, read once a process (it parses ~160 YAML files)."""
    return {s: dict(b) for s, b in sdk().get_supported_databases().items()}


@cache
def version_slots(system: str, backend: str) -> dict[str, str]:
    """aic's queryable versions of a backend on a system: {'current': v, 'next': v, ...}."""
    return dict(sdk().get_version_slots(system, backend) or {})


def system_for(hardware_name: str) -> str:
    """The aic system of a twinserve hardware name (an aic system name is taken as is)."""
    known = supported()
    key = hardware_name.lower()
    system = SYSTEMS.get(key, key if key in known else "")
    if not system or system not in known:
        mapped = ", ".join(f"{k} -> {v}" for k, v in SYSTEMS.items() if v in known)
        raise AicError("hardware", f"aiconfigurator-core has no kernel database for hardware "
                       f"{hardware_name!r}; it has: {mapped} (or an aic system name: "
                       f"{', '.join(sorted(known))})")
    return system


def resolve_version(system: str, backend: str, version: str) -> str:
    """The literal database version: '' is aic's maintained default ('current'); aliases resolve."""
    if backend not in BACKENDS:
        raise AicError("aic_backend", f"aic_backend {backend!r} is not one of {', '.join(BACKENDS)}")
    slots = version_slots(system, backend)
    have = sorted(set(slots.values()))
    if not slots:
        raise AicError("aic_backend", f"aiconfigurator-core has no {backend} database for {system}; "
                       f"it has: {', '.join(sorted(supported().get(system, {}))) or 'none'}")
    want = version or "current"
    if want in slots:
        return slots[want]
    if want in have:
        return want
    raise AicError("aic_version", f"aiconfigurator-core has no {backend} version {version!r} for {system}; "
                   f"installed: {', '.join(have)} (or current / next; '' = current = {slots['current']})")


def quant_modes(precision: Precision, moe: bool, system: str = "", backend: str = "",
                experts_only: str = "") -> dict[str, Any]:
    """aic quant modes for twinserve's precision fields (vLLM's names).

    quantization fp8 is per-tensor W8A8 (aic 'fp8'; static activation scales where fp8_gemm_mode
    says), block-scaled on MoE experts; int4
    is weight-only (AWQ/GPTQ, aic 'int4_wo'); nvfp4 is W4A4 (aic 'nvfp4'); mxfp4 (gpt-oss) quantizes
    the experts only, with the activations each engine feeds them by default (mxfp4_moe_mode).
    Activations, attention math and the LM head stay 16-bit; kv_cache_dtype fp8 stores K/V in FP8.
    experts_only: the quantization for which the checkpoint quantizes the routed experts only
    (ModelSpec.experts_only_quantization, Kimi-K2.5's INT4): at that quantization the GEMMs are 16-bit.
    """
    from aiconfigurator_core.sdk import common
    q = precision.quantization
    gemm = {"none": "bfloat16", "fp8": "fp8", "int4": "int4_wo", "nvfp4": "nvfp4", "mxfp4": "bfloat16"}[q]
    if experts_only and q == experts_only:
        gemm = "bfloat16"
    # Published FP8 MoE checkpoints (Qwen3, DeepSeek) are block-scaled 128x128: aic fp8_block.
    moe_q = {"none": "bfloat16", "fp8": "fp8_block", "int4": "int4_wo", "nvfp4": "nvfp4",
             "mxfp4": mxfp4_moe_mode(system, backend)}[q]
    kv = "fp8" if precision.kv_cache_dtype == "fp8" else "bfloat16"
    fmha = "float16" if precision.dtype == "float16" else "bfloat16"
    modes = {"gemm": common.GEMMQuantMode[gemm], "generation_attention": common.KVCacheQuantMode[kv],
             "fmha": common.FMHAQuantMode[fmha]}
    if moe:
        modes["moe"] = common.MoEQuantMode[moe_q]
    return modes


MXFP4_MOE_MODES = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")


def mxfp4_moe_mode(system: str, backend: str) -> str:
    """aic's MoE quant mode for MXFP4 experts (gpt-oss): the activations each engine feeds them by default.

    - vLLM runs them with BF16 activations on every GPU by default: its get_mxfp4_backend
      (vllm/model_executor/layers/quantization/mxfp4.py) picks SM100_FI_MXFP4_BF16 on Blackwell unless
      VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8 is set, Triton or Marlin W4A16 kernels elsewhere. aic's vLLM
      0.24.0 tables agree: every gpt-oss row is w4a16_mxfp4, and on B200 / GB200 its kernel_source is
      'vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_...'.
    - TensorRT-LLM quantizes the activations to MXFP8 on SM >= 100 and keeps BF16 below
      (ModelConfig.get_mxfp4_quant_algo, tensorrt_llm/_torch/model_config.py: W4A8_MXFP4_MXFP8 for its
      CUTLASS / TRTLLM MoE backends, W4A16_MXFP4 on Hopper).
    - SGLang's FlashInfer MXFP4 MoE quantizes them to MXFP8 on Blackwell unless
      --flashinfer-mxfp4-moe-precision bf16 is given (its default is 'default'; aic's own
      resolve_kimi_k3_moe_arch_mode, sdk/models/helpers.py, documents the same default).
    Blackwell is aic's is_blackwell_system (the system's sm_version >= 100, so RTX PRO 6000's SM 120 too),
    TensorRT-LLM's own test. aic's checkpoint reader maps quant_algo mxfp4 to w4a16_mxfp4 whatever the
    engine (sdk/models/helpers._infer_quant_modes_from_raw_config); where the database holds only the
    other mode, held_mxfp4_mode takes it.
    """
    if backend == "vllm" or not system:
        return "w4a16_mxfp4"
    from aiconfigurator_core.sdk.perf_database import is_blackwell_system
    return "w4a8_mxfp4_mxfp8" if is_blackwell_system(system) else "w4a16_mxfp4"


# The tables whose quant modes a study checks, and the enum their engine table views key on at the top.
_MODE_TABLES = {"gemm": ("_gemm_data", "GEMMQuantMode"), "moe": ("_moe_data", "MoEQuantMode"),
                "generation_attention": ("_generation_attention_data", "KVCacheQuantMode")}


def supported_modes(db: Any, table: str) -> list[str]:
    """The quant modes aic's database `db` has timings for in `table` ('gemm', 'moe' or 'generation_attention'):
    the names aic's own `db.supported_quant_mode[table]` lists, read from the top-level keys of the engine's
    table view alone.

    aic answers `supported_quant_mode` by building the whole table in Python (sdk/perf_database.py
    _LazySupportMatrix: `load_data`, then `_finalize_loaded_value` over every measured point): 2-9 s a
    database for its GEMM and MoE tables, most of `simulate validate`'s serial preload and of a study's start
    (docs/validate-speed.md), for a listing of the outermost keys. The step prices come from aic's compiled
    engine and never read those Python tables. The rules kept from aic's `_enum_key_names` and
    `_gemm_key_names` (aiconfigurator-core 0.12.0): a lane-keyed table (kernel_source strings outermost) lists the
    union of its lanes' modes; 'fp8_static' is listed for GEMMs where the 'fp8' GEMM, compute-scale and
    scale-matrix tables all hold 'fp8'. tests/sim/test_aic_supported_modes.py checks the listing against
    aic's own. Cached on the database object.
    """
    memo = db.__dict__.setdefault("_twinserve_modes", {})
    if table not in memo:
        from aiconfigurator_core.sdk import common
        attr, enum_name = _MODE_TABLES[table]
        enum = getattr(common, enum_name)
        names = _view_modes(db, attr, enum)
        if table == "gemm":
            fp8, static = common.GEMMQuantMode.fp8.name, common.GEMMQuantMode.fp8_static.name
            names.discard(static)
            if fp8 in names and all(fp8 in _view_modes(db, a, enum)
                                    for a in ("_compute_scale_data", "_scale_matrix_data")):
                names.add(static)
        memo[table] = sorted(names)
    return memo[table]


def _view_modes(db: Any, attr: str, enum: Any) -> set[str]:
    """The enum names keying the outermost level of aic's engine table view `attr` (a lane's keys
    for a lane-keyed one); empty where the database has no such table."""
    import json
    from aiconfigurator_core.sdk.engine_table_view import _probe_engine_handle
    raw = _probe_engine_handle(db)._engine.table_view_json(attr)
    if raw is None:
        return set()
    top = json.loads(raw)
    names: set[str] = set()
    for key, value in top.items():
        if key in enum.__members__:
            names.add(key)
        elif isinstance(value, dict):  # a kernel_source lane
            names.update(k for k in value if k in enum.__members__)
    return names


def held_mxfp4_mode(db: Any, modes: dict[str, Any]) -> dict[str, Any]:
    """modes with the other MXFP4 expert mode where the database holds no table for the chosen one.

    aic's collectors time the kernel the engine version runs on that GPU, filed under the mode of its
    activations; a database that holds only one MXFP4 mode (RTX PRO 6000: TensorRT-LLM's is
    w4a8_mxfp4_mxfp8, SGLang's w4a16_mxfp4 on its Marlin kernel) holds that engine's kernel there.
    Both modes read the same 4-bit weights, so the price keeps the bytes and the expert shapes.
    """
    from aiconfigurator_core.sdk import common
    mode = modes.get("moe")
    if mode is None or mode.name not in MXFP4_MOE_MODES:
        return modes
    have = set(supported_modes(db, "moe"))
    if mode.name in have:
        return modes
    other = next((m for m in MXFP4_MOE_MODES if m != mode.name and m in have), None)
    return {**modes, "moe": common.MoEQuantMode[other]} if other else modes


# Model families whose published FP8 checkpoints are per-tensor with static activation scales: NVIDIA's
# ModelOpt Llama-3.1 / 3.3 FP8 (aic ships nvidia/Llama-3.1-70B-Instruct-FP8 with its hf_quant_config,
# quant_algo FP8, which its reader maps to fp8_static). Qwen3's and DeepSeek's FP8 checkpoints are
# block-scaled (weight_block_size 128 x 128) and keep aic's 'fp8' GEMMs (fp8_gemm_mode says why).
STATIC_FP8_FAMILIES = ("llama",)


def static_fp8_checkpoint(model_name: str, moe: bool) -> bool:
    """Whether an fp8 study of this model serves a per-tensor, static-scale FP8 checkpoint."""
    return not moe and any(f in model_name.lower() for f in STATIC_FP8_FAMILIES)


def fp8_gemm_mode(db: Any, modes: dict[str, Any], static_checkpoint: bool) -> dict[str, Any]:
    """modes with static per-tensor FP8 GEMMs ('fp8_static') in place of aic's dynamic 'fp8' for a
    static-scale checkpoint (static_fp8_checkpoint), where the database prices them.

    A per-tensor FP8 checkpoint with activation scales (ModelOpt's) lets the engines quantize each
    GEMM's input with the stored scale: no amax reduction before every GEMM. aiconfigurator-core
    prices that as 'fp8_static' (the GEMM plus its measured scale kernels; sdk/perf_database.
    _gemm_key_names lists it where those tables exist), and its own checkpoint reader picks it for
    per-tensor FP8 without dynamic activations (sdk/models/helpers._infer_quant_modes_from_raw_config).
    'fp8' is dynamic per-tensor FP8: in the TensorRT-LLM tables a decode-sized GEMM costs up to 2.3x
    the static one (an activation amax kernel per GEMM); vLLM's ~5% more, SGLang's the same. Block-
    scaled checkpoints keep 'fp8': aic's fp8_block table for vLLM is 3-10x slower than either (not the
    kernel the engine runs), aic prices the MLA family's attention from module tables our 'fp8' GEMM
    sum was checked against (static puts DeepSeek-R1's decode step 6-8% under aic's compiled engine),
    and Qwen3-32B's development rows fit 'fp8' (TensorRT-LLM 8.9% against 18.9% with static).
    """
    from aiconfigurator_core.sdk import common
    static = common.GEMMQuantMode.fp8_static
    if (not static_checkpoint or modes.get("gemm") is not common.GEMMQuantMode.fp8
            or static.name not in supported_modes(db, "gemm")):
        return modes
    return {**modes, "gemm": static}


def check_precision(db: Any, modes: dict[str, Any], precision: Precision) -> None:
    """AicError when the database has no measured table for a quant mode the study asks for."""
    field = {"gemm": "quantization", "moe": "quantization", "generation_attention": "kv_cache_dtype"}
    for table, mode in modes.items():
        if table not in field:
            continue
        have = supported_modes(db, table)
        if mode.name not in have:
            raise AicError(field[table], f"aiconfigurator-core's {db.backend} {db.version} database for "
                           f"{db.system} has no {table} timings in {mode.name} (from {precision.label()}); "
                           f"it has: {', '.join(have)}")
