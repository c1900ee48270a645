"""The measured rows `simulate validate` judges against, and each row as a closed-loop study.

The rows are aiconfigurator-core's `systems/silicon_sample.csv` (Apache-2.0), read from the
installed package at run time, never copied here. A row the simulator cannot express gets a
reason, not a study.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd

from twinserve.backends.sim.catalog import UnknownSpecError, get_hardware, get_model
from twinserve.backends.sim.precision import KV_CACHE_DTYPES, QUANTIZATIONS
from twinserve.core.errors import TwinserveError

from twinserve.sim.config import EngineConfig, StudyConfig
from twinserve.sim.errors import SimError
from twinserve.sim.validate_layouts import (DEFAULT_DISAGG_ASSUMPTION, ENTRY, AssumedWorkers,  # noqa: F401
                                            NotExpressible, aggregated_layout, assume_workers, folded_layout,
                                            inferred_attention_dp, missing_worker_counts, vllm_tp_ep_layout)
from twinserve.sim.validate_engines import SGLANG_DECODE_JOIN_ROW, SGLANG_DECODE_JOINS, engine_defaults
from twinserve.sim.validate_inferencex import (MTP_SIMULATED_MAX_CLIENTS, agreed_mtp, assumed_entry, db_dump_record,
                                               decode_moe_a2a, inferencex_workers, prefill_moe_a2a,
                                               redundant_experts)
from twinserve.sim.validate_twins import add_plain_siblings, add_twins, twin_of
from twinserve.sim.validate_recipes import (apply_disagg_recipe, apply_kernels, apply_memory, apply_recipe,
                                            apply_speculative, disagg_fp8_moe_kernel, disagg_prefill_trtgen,
                                            disagg_recipe, disagg_wide_ep, dump_layout_launch, kv_cache_dtype,
                                            launch_expert_parallel, launch_tensor_parallel, rank_max_num_tokens,
                                            row_recipe, set_mtp)
from twinserve.sim.validate_protocol import DEFAULT_WINDOW, INFERENCEX, STEADY, RunDesign, harness, run_design
from twinserve.sim.workload import WorkloadConfig

AIC_PACKAGE = "aiconfigurator_core"
AIC_EXTRA = "aic"  # pip install 'twinserve[aic]' (pyproject.toml)
SILICON_CSV = "systems/silicon_sample.csv"

# The development models (every backend and system); every other model is held out.
DEV_MODELS = ("Llama-3.1-70B", "Qwen3-32B", "gpt-oss-120b", "DeepSeek-R1")

# aiconfigurator's system names -> this catalog's hardware names.
SYSTEMS = {"h100_sxm": "H100-SXM", "h200_sxm": "H200", "b200_sxm": "B200", "b300_sxm": "B300",
           "gb200": "GB200", "gb300": "GB300"}

# Host cost per step by serving engine (backends/sim/engine_profile.py; cuda_graph_python fitted on the
# vLLM/SGLang development rows, docs/capacity.md).
ENGINE_PROFILE = {"trtllm": "cuda_graph_cpp", "vllm": "cuda_graph_python", "sglang": "cuda_graph_python"}

# Study fields the parallel layouts need, by the names their helper gives them (wip/rows);
# a row that needs one this config lacks is "not expressible".
PP_FIELD = "pipeline_parallel_size"
EP_FIELD = "expert_parallel_size"
RE_FIELD = "engine.redundant_experts"
ADP_FIELD = "data_parallel_size"

# A checkpoint's suffix that names its quantization, not its shape.
_SUFFIXES = re.compile(r"(-Instruct|-FP8|-NVFP4|-MXFP4|-AWQ|-INT4)+$", re.IGNORECASE)
_WARMUP_WAVES = 1   # client waves left out at the start (cold start: every client prefills at once)
_MEASURED_MIN = 16  # requests in the measured window at the least (small concurrencies)
_MEASURED_MAX = 256  # and at the most: a wave of 2,048 clients is steady long before it ends


class SiliconDataError(SimError, RuntimeError):
    """aiconfigurator-core (the measured rows) is missing, or a filter matches nothing."""


def load_rows() -> pd.DataFrame:
    """The measured rows from the installed aiconfigurator-core, with `concurrency`, `model`, `split`."""
    import importlib.resources as resources
    try:
        path = resources.files(AIC_PACKAGE) / SILICON_CSV
        with resources.as_file(path) as p:
            df = pd.read_csv(p)
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise SiliconDataError(
            f"the measured rows come from aiconfigurator-core ({AIC_PACKAGE}/{SILICON_CSV}), "
            f"which is not installed or lacks the file ({e}); pip install 'twinserve[{AIC_EXTRA}]'"
        ) from None
    return prepare_rows(df)


def prepare_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Add the client concurrency, the catalog-style model name and the dev/held-out split."""
    df = df.copy()
    # Disaggregated rows leave batch_size empty; their client concurrency is the id's `_c<N>_`.
    from_id = pd.to_numeric(df["id"].astype(str).str.extract(r"_c(\d+)_")[0], errors="coerce")
    # Under attention DP batch_size is one DP rank's batch: the benchmark's clients are the id's
    # `_c<N>_` (batch_size x attention_dp_size in 168 of the 169 such aggregated rows), not batch_size.
    ones = pd.Series(1.0, index=df.index)
    dp = pd.to_numeric(df["attention_dp_size"], errors="coerce") if "attention_dp_size" in df else ones
    per_rank = df["batch_size"].notna() & (dp > 1)
    df["concurrency"] = df["batch_size"].where(df["batch_size"].notna(), from_id)
    df.loc[per_rank, "concurrency"] = from_id.where(from_id.notna(), df["batch_size"] * dp)[per_rank]
    df["model"] = df["model_path"].map(model_name)
    df["split"] = df["model"].map(lambda m: "dev" if m in DEV_MODELS else "heldout")
    # A disaggregated row without worker counts takes them from the file's other record of the same
    # measurement, where it has one; a row beside a twinned plain run of its client count is told apart from
    # it (sim/validate_twins.py add_plain_siblings).
    return add_plain_siblings(add_twins(df))


def model_name(model_path: str) -> str:
    """'meta-llama/Llama-3.1-8B-Instruct' -> 'Llama-3.1-8B' (the org and quantization suffixes dropped)."""
    base = str(model_path).rsplit("/", 1)[-1]
    return _SUFFIXES.sub("", base) or base


def _int(row: pd.Series, col: str, default: int = 1) -> int:
    v = row.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return default
    return int(v) if int(v) >= 1 else default  # 0 in the file means "not used"


@dataclass(slots=True)
class Worker:
    """One worker shape of a row: its parallel sizes and its GPU count."""

    tp: int
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    count: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of one worker: TP x PP x attention-DP (MoE TP x EP splits the same GPUs)."""
        return self.tp * self.pp * self.attention_dp

    def label(self) -> str:
        """e.g. 'tp8', 'tp4 pp2', 'tp1 adp8 ep8'."""
        parts = [f"tp{self.tp}"]
        for name, v in (("pp", self.pp), ("adp", self.attention_dp), ("ep", self.moe_ep)):
            if v > 1:
                parts.append(f"{name}{v}")
        return " ".join(parts)


def workers(row: pd.Series, counts: tuple[int, int] | None = None,
            disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> list[Worker]:
    """[the one aggregated worker] or [prefill, decode] with their counts (`counts` where assumed); `disagg`
    the assumption for a row without worker counts (its InferenceX entry under `entry`: _matrix_workers).

    An aggregated row without attention_dp_size takes it from moe_tp x moe_ep / tp (vLLM's rule).
    """
    if row["mode"] != "disagg":
        tp, adp, moe_tp, moe_ep = aggregated_layout(row)
        return [Worker(tp, _int(row, "pp_size"), adp, moe_tp, moe_ep)]
    ws = [Worker(_int(row, f"{k}_tp_size"), _int(row, f"{k}_pp_size"),
                 _int(row, f"{k}_attention_dp_size"), _int(row, f"{k}_moe_tp_size"),
                 _int(row, f"{k}_moe_ep_size"), _int(row, f"{k}_num_workers"))
          for k in ("prefill", "decode")]
    ix = _matrix_workers(row, disagg)  # sim/validate_inferencex.py
    if ix is not None:
        ws = [Worker(tp, 1, adp, moe_tp, moe_ep, shape.count)
              for shape in (ix.prefill, ix.decode) for tp, adp, moe_tp, moe_ep in (shape.fields(),)]
    elif missing_worker_counts(row) and twin_of(row):  # the same run's record with its workers
        ws = [Worker(_int(row, f"twin_{k}_tp_size"), _int(row, f"twin_{k}_pp_size"),
                     _int(row, f"twin_{k}_attention_dp_size"), _int(row, f"twin_{k}_moe_tp_size"),
                     _int(row, f"twin_{k}_moe_ep_size"), _int(row, f"twin_{k}_num_workers"))
              for k in ("prefill", "decode")]
    if ix is None and (launch := dump_layout_launch(row)) is not None:
        # The EP its launch script ran (sim/validate_recipes.py DUMP_LAYOUT_LAUNCHES), over the same GPUs.
        for w, ep in zip(ws, (launch.prefill_ep, launch.decode_ep)):
            w.moe_tp, w.moe_ep = w.tp * w.attention_dp // ep, ep
    if counts is not None:
        ws[0].count, ws[1].count = counts
    return ws


def _matrix_workers(row: pd.Series, disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> Any:
    """The row's workers from InferenceX's matrix (sim/validate_inferencex.py): for a row without worker counts,
    and for a db-dump record whose own layout columns are an entry's (its recipe caps, MTP and flags); under the
    `entry` assumption, for a row without worker counts, no single entry of its own and no twin record, the entry
    assumed_entry picks; else None."""
    missing = missing_worker_counts(row)
    ix = inferencex_workers(row) if missing or db_dump_record(row) else None
    if ix is None and missing and disagg == ENTRY and not twin_of(row):
        ix = assumed_entry(row)
    return ix


def parallelism(row: pd.Series, counts: tuple[int, int] | None = None,
                disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> str:
    """A short label of the row's layout, e.g. 'tp8' or 'P 2x tp4 | D 1x tp8 ep8'."""
    ws = workers(row, counts, disagg)
    if len(ws) == 1:
        return ws[0].label()
    return f"P {ws[0].count}x {ws[0].label()} | D {ws[1].count}x {ws[1].label()}"


def num_gpus(row: pd.Series, counts: tuple[int, int] | None = None,
             disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> int:
    """GPUs the row ran on: one worker, or every prefill and decode worker."""
    return sum(w.gpus * w.count for w in workers(row, counts, disagg))


def precision_fields(row: pd.Series) -> dict[str, str]:
    """The row's precision as [engine] fields, as the backends serve it.

    fp8: W8A8 GEMMs and an fp8 KV cache; fp4: NVFP4/MXFP4 weights (fp8 KV); int4: weight-only;
    bf16, or no precision given with no quantized GEMMs (the unquantized checkpoint): 16-bit.
    """
    p = row.get("precision")
    if not isinstance(p, str):
        p = "bf16" if not isinstance(row.get("gemm_quant_mode"), str) else str(row["gemm_quant_mode"])
    kv_fp8 = "fp8" if "fp8" in KV_CACHE_DTYPES else "auto"
    if p == "bf16":
        return {"dtype": "bfloat16", "quantization": "none", "kv_cache_dtype": "auto"}
    if p == "fp8":
        return {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": kv_fp8}
    if p == "int4":
        if "int4" not in QUANTIZATIONS:
            raise NotExpressible(f"precision int4: quantization choices are {', '.join(QUANTIZATIONS)}")
        return {"dtype": "bfloat16", "quantization": "int4", "kv_cache_dtype": "auto"}
    if p == "fp4":
        mode = str(row.get("gemm_quant_mode") or "")
        # gpt-oss ships MXFP4 experts (its own checkpoint); the others are NVFP4 checkpoints.
        mx = mode == "mxfp4" or "gpt-oss" in str(row.get("model_path", ""))
        for q in (("mxfp4",) if mx else ()) + ("nvfp4", "fp4", "mxfp4"):
            if q in QUANTIZATIONS:
                return {"dtype": "bfloat16", "quantization": q, "kv_cache_dtype": kv_fp8}
        raise NotExpressible(f"precision fp4 ({mode or 'nvfp4'}): no FP4 quantization in the "
                             f"roofline (choices: {', '.join(QUANTIZATIONS)})")
    raise NotExpressible(f"precision {p!r} is not one of bf16, fp8, fp4, int4")


def _engine_has(name: str) -> bool:
    return name in {f.name for f in fields(EngineConfig)}


def _layout(w: Worker, model: Any) -> dict[str, Any]:
    """A worker's [engine] parallel fields; NotExpressible when the config has no field for one."""
    heads = getattr(model, "num_heads", 0)
    if heads and heads % w.tp:
        raise NotExpressible(_gpu_count_reason(w, model))
    if model.is_moe and w.moe_tp * w.moe_ep not in (1, w.tp * w.attention_dp):
        raise NotExpressible(f"inconsistent layout: tp {w.tp} x attention_dp {w.attention_dp} GPUs, "
                             f"but moe_tp {w.moe_tp} x moe_ep {w.moe_ep}")
    out: dict[str, Any] = {"engine.tensor_parallel_size": w.tp}
    for size, name, what in ((w.pp, PP_FIELD, "pipeline parallelism"),
                             (w.attention_dp, ADP_FIELD, "attention data parallelism"),
                             (w.moe_ep, EP_FIELD, "MoE expert parallelism")):
        if size > 1:
            if not _engine_has(name):
                raise NotExpressible(f"{what} ({w.label()}): no engine.{name} yet")
            out[f"engine.{name}"] = size
    if w.moe_ep > 1 and not getattr(model, "is_moe", False):
        raise NotExpressible(f"expert parallelism {w.moe_ep} on a dense model")
    return out


def _gpu_count_reason(w: Worker, model: Any) -> str:
    """Why a tp_size that divides no head count cannot be laid out from the row's columns."""
    msg = f"tp {w.tp} does not divide {model.name}'s {model.num_heads} attention heads"
    if model.is_moe and model.num_experts % w.tp:
        msg += f", nor its {model.num_experts} experts (no attention-DP x EP {w.tp} reading either)"
    elif model.is_moe:
        msg += (f"; attention DP x EP over {w.tp} GPUs would split its {model.num_experts} experts, but the "
                f"row gives moe_tp {w.moe_tp} x ep {w.moe_ep} and no attention_dp")
    return msg + ": the file's tp_size looks like a GPU count whose split the columns do not give"


def _resolve_model(name: str, path: str) -> Any:
    """The row's model spec: aiconfigurator's shipped config of model_path, else our catalog."""
    try:
        from twinserve.backends.sim.aic_models import resolve_row_model
    except ImportError:  # before the row models helper: the catalog only
        resolve_row_model = None
    if resolve_row_model is not None:
        try:
            return resolve_row_model(str(path))
        except UnknownSpecError:
            pass
        except TwinserveError as e:  # a config this simulator cannot read (e.g. linear attention)
            # The installed package's folder says nothing about the row: keep the path from the package on.
            raise NotExpressible(f"model {path}: " + re.sub(r"\S*site-packages/", "", str(e))) from None
    for candidate in (name, str(path).rsplit("/", 1)[-1]):
        try:
            return get_model(candidate)
        except UnknownSpecError:
            continue
    raise NotExpressible(f"model {path}: neither aiconfigurator's model configs nor the catalog has it")


def _resolve_hardware(system: str) -> str:
    try:
        from twinserve.backends.sim.catalog import hardware_for_aic_system
        return hardware_for_aic_system(system).name
    except ImportError:
        pass
    except UnknownSpecError as e:
        raise NotExpressible(f"system {system}: {e}") from None
    hw = SYSTEMS.get(system)
    if hw is None:
        raise NotExpressible(f"system {system!r}: no catalog GPU mapped (known: {', '.join(SYSTEMS)})")
    try:
        return get_hardware(hw).name
    except UnknownSpecError:
        raise NotExpressible(f"system {system}: no {hw} in the hardware catalog") from None


def _aic_fields(row: pd.Series) -> dict[str, str]:
    """[engine] aic_backend and aic_version: the row's backend at its version where installed."""
    out = {"aic_backend": str(row["backend"]), "aic_version": ""}
    try:
        from twinserve.backends.sim.aic.mapping import resolve_version
        out["aic_version"] = resolve_version(str(row["system"]), out["aic_backend"], str(row["backend_version"]))
    except (ImportError, TwinserveError):
        pass  # not installed for this row: the database's current version prices it
    return out


def aic_version_used(row: Any) -> str:
    """The aic database version that prices the row, saying so when it is not the row's own (never silent)."""
    from twinserve.backends.sim.aic.mapping import resolve_version
    system, backend, own = str(row["system"]), str(row["backend"]), str(row["backend_version"])
    used = _aic_fields(pd.Series(row))["aic_version"]
    if used:
        return used
    try:
        current = resolve_version(system, backend, "")
    except TwinserveError:
        return ""
    v = row["backend_version"]
    if v is None or (isinstance(v, float) and math.isnan(v)) or not own.strip():
        return f"{current} (the row gives no {backend} version; aic's current)"
    return f"{current} (the row's {own} is not installed; aic's current)"


def request_counts(concurrency: int) -> tuple[int, int, int]:
    """(warm-up, measured, total) requests of a closed loop of `concurrency` clients.

    The first wave is the cold start (every client prefills at once), so it is left out; the
    measured window is the next wave (at least _MEASURED_MIN requests); a last wave keeps every
    client busy until the measured requests finish, and is left out as well. A steady closed
    loop with fixed lengths repeats itself every wave, so one wave (capped) measures it.
    """
    warm = _WARMUP_WAVES * concurrency
    measured = max(min(concurrency, _MEASURED_MAX), _MEASURED_MIN)
    return warm, measured, warm + measured + concurrency


def design_counts(concurrency: int, design: RunDesign = STEADY) -> tuple[int, int, int]:
    """(warm-up, measured, total) requests of a closed loop run under `design`.

    The steady window is request_counts'; a benchmark's design sends requests_per_client x N
    requests and counts warmup_waves x N fewer (InferenceX: 10 N, every one counted).
    """
    if design.requests_per_client <= 0:
        return request_counts(concurrency)
    total = design.requests_per_client * concurrency
    warm = min(design.warmup_waves * concurrency, total - 1)
    return warm, total - warm, total


@dataclass(slots=True)
class RowPlan:
    """A row's study and how its layout was read: '' as given, else what was assumed or inferred."""

    cfg: StudyConfig
    layout: str = ""
    counts: tuple[int, int] | None = None  # the assumed (prefill, decode) worker counts


def aic_serving_terms(backend: str) -> Any:
    """The engine's serving terms over aic's kernel sum (backends/sim/aic/cost_model.SERVING_TERMS)."""
    from twinserve.backends.sim.aic.cost_model import serving_terms
    return serving_terms(backend)


def row_study(row: pd.Series, cost_model: str = "roofline", *,
              disagg: str | None = DEFAULT_DISAGG_ASSUMPTION, window: str = DEFAULT_WINDOW) -> StudyConfig:
    """The row as a closed-loop study; NotExpressible (with the reason) when it cannot be one."""
    return row_plan(row, cost_model, disagg=disagg, window=window).cfg


def row_plan(row: pd.Series, cost_model: str = "roofline", *,
             disagg: str | None = DEFAULT_DISAGG_ASSUMPTION, window: str = DEFAULT_WINDOW) -> RowPlan:
    """The row's study and layout note; `disagg` fills in missing worker counts (None: a reason)."""
    conc = row.get("concurrency")
    if conc is None or (isinstance(conc, float) and math.isnan(conc)) or int(conc) < 1:
        raise NotExpressible("no client concurrency in the row (batch_size empty, no _c<N>_ in its id)")
    conc = int(conc)
    model = _resolve_model(row["model"], row["model_path"])
    hw = _resolve_hardware(row["system"])
    prec = precision_fields(row)
    kv = kv_cache_dtype(row)  # the launch's K/V dtype where it is not precision_fields' (validate_recipes.py)
    if kv is not None:
        prec["kv_cache_dtype"] = kv
    try:
        model = model.with_precision(type(model.precision)(**prec))
    except ValueError as e:
        raise NotExpressible(str(e)) from None
    isl, osl = int(row["isl"]), int(row["osl"])
    cfg = StudyConfig()
    e = cfg.engine
    cfg.custom_model = model  # found by its name, like a [model] table's spec
    e.model, e.hardware, e.cost_model = model.name, hw, cost_model
    if cost_model == "aic":
        if model.num_linear_layers:
            from twinserve.backends.sim.aic.cost_model import linear_attention_refusal
            raise NotExpressible("aic: " + linear_attention_refusal(model, str(row["system"]), str(row["backend"])))
        for k, v in _aic_fields(row).items():
            setattr(e, k, v)
    for k, v in prec.items():
        setattr(e, k, v)
    e.engine_profile = ENGINE_PROFILE.get(str(row["backend"]), e.engine_profile)
    # TensorRT-LLM sizes its KV pool as a share (0.9) of the memory left once the model is loaded,
    # vLLM and SGLang as a share of the GPU's total (backends/sim/capacity.py MEMORY_BASES).
    e.kv_memory_basis = "free" if row["backend"] == "trtllm" else "total"
    if cost_model == "aic":
        # aic's kernel timings hold no serving overheads: the engine's fitted terms (backends/sim/aic).
        terms = aic_serving_terms(str(row["backend"]))
        e.step_overhead_s, e.per_seq_overhead_s = terms.step_s, terms.per_seq_s
        e.aic_kernel_scale = terms.kernel_scale
    s = cfg.scheduler
    s.max_model_len = max(s.max_model_len, isl + osl)
    # Benchmarks size the engine's batch for the clients: no request waits for a sequence slot.
    s.max_num_seqs = max(s.max_num_seqs, conc)
    s.enable_prefix_caching = False  # random prompts: nothing to share
    # The engine's own step budget on this GPU (sim/validate_engines.py; 8,192 tokens but SGLang's
    # 16,384 on B200-class), TensorRT-LLM's C++ runtime, vLLM V1's and SGLang's Python + CUDA graphs.
    s.max_num_batched_tokens = _engine_budget(str(row["backend"]), hw, s.max_num_batched_tokens)
    # SGLang's lock step: prefill batches alone, first (sim/validate_engines.py).
    s.batch_policy, s.max_prefill_tokens = _engine_batching(str(row["backend"]), hw)
    s.capacity_policy = _engine_capacity_policy(str(row["backend"]), hw)  # TensorRT-LLM: guaranteed_no_evict
    s.overlap_scheduler = _engine_overlap(str(row["backend"]), hw)  # TensorRT-LLM: on (validate_engines.py)
    # The flags an InferenceX row's server ran with, where its recipe is known (sim/validate_recipes.py).
    recipe = row_recipe(row)
    apply_recipe(recipe, s)
    if recipe.max_num_tokens and recipe.max_num_tokens < s.max_model_len:
        # A launch budget below max_seq_len (the MTP scripts': validate_recipes.mtp_script_max_num_tokens) holds the
        # benchmark's prompts, at most ISL tokens, whole: chunked prefill stays off.
        s.max_prompt_len = isl
    apply_memory(recipe, e)  # the script's memory share, on the basis set above
    apply_kernels(recipe, e, cost_model)  # a kernel the script forces (gpt-oss on Hopper vLLM: Marlin)
    apply_speculative(recipe, cfg.speculative)
    _set_workload(cfg.workload, conc, isl, osl, run_design(row, window))
    cfg.run.name = str(row["id"])
    ws = workers(row, disagg=disagg)
    if len(ws) == 1:
        # vLLM's --enable-expert-parallel / SGLang's --enable-ep-moe where the script passed it whatever the row's EP
        # (validate_recipes.py).
        launch_ep = model.is_moe and launch_expert_parallel(recipe, ws[0])
        # A vLLM launch that passed --tensor-parallel-size only, whatever the row's EP / attention DP (the Kimi-K2.5
        # FP4 scripts, validate_recipes.py): one TP group, experts tensor-parallel.
        launch_tp = launch_tensor_parallel(recipe, ws[0])
        _apply(cfg, _layout(ws[0], model))
        rank_budget = rank_max_num_tokens(recipe, conc, isl, cfg.engine.data_parallel_size)
        if rank_budget:
            # The MTP scripts' --max_num_tokens under attention DP: a rank's, each rank scheduling its own batch
            # from the requests placed on it (validate_recipes.rank_max_num_tokens; SchedulerConfig.adp_per_rank,
            # as for the disaggregated prefill workers' caps below). The study's budget is a rank's (sim/build.py
            # multiplies it by the ranks); prompts whole, chunked prefill off, as without attention DP.
            s.max_num_batched_tokens, s.enable_chunked_prefill, s.adp_per_rank = rank_budget, False, True
            if rank_budget < s.max_model_len:
                s.max_prompt_len = isl
        adp = inferred_attention_dp(row)
        note = f"inferred attention_dp {adp} = moe_tp x moe_ep / tp (vLLM's layout rule)" if adp else ""
        if launch_ep:
            flag = "--enable-ep-moe" if str(row["backend"]) == "sglang" else "--enable-expert-parallel"
            note = f"experts ep{ws[0].moe_ep}: the launch passed {flag} whatever the config's EP ({recipe.source})"
        if folded_layout(row):
            note = (f"inferred {ws[0].label()}: the file's {ws[0].gpus * ws[0].moe_ep} GPUs are moe_tp x moe_ep "
                    f"of one node's server (InferenceX's dump)")
        elif vllm_tp_ep_layout(row):
            t = ws[0].tp
            note = (f"inferred {ws[0].label()}: the file's tp{t} x attention DP {t}, ep{t * t} is the entry's tp {t}, "
                    f"ep {t} written twice; vLLM ran {t} GPUs (InferenceX's dump)")
        if launch_tp:
            note = (f"{ws[0].label()}, experts tp{ws[0].moe_tp}: the launch passed only --tensor-parallel-size, not "
                    f"the config's EP / attention DP ({recipe.source})")
        return RowPlan(cfg, note)
    pre, dec = ws
    pre_layout, dec_layout = _layout(pre, model), _layout(dec, model)
    # A replica's overrides go over the base engine (the decode worker's layout): a field one worker leaves
    # at 1 that the other sets is written as 1, not inherited (a prefill worker at EP 1 ran at decode's EP 8).
    for mine, other in ((pre_layout, dec_layout), (dec_layout, pre_layout)):
        for name in other:
            mine.setdefault(name, 1)
    ix = _matrix_workers(row, disagg)
    # SGLang's redundant experts at EP 24 / 48 (sim/validate_inferencex.py): the InferenceX workers' and
    # their twin records' (sim/validate_twins.py), the same runs.
    if model.is_moe:
        extra = [redundant_experts(str(row["backend"]), model.num_experts, w.moe_ep) for w in (pre, dec)]
        if any(extra):
            pre_layout[RE_FIELD], dec_layout[RE_FIELD] = extra
    _apply(cfg, dec_layout)
    plan = RowPlan(cfg)
    if ix is not None:  # the counts and layouts InferenceX's run matrix gives the row
        plan.layout, plan.counts = ix.note(conc), (pre.count, dec.count)
        if ix.simulates_mtp(conc):  # its entry ran MTP at a given depth
            set_mtp(cfg.speculative, ix.mtp)
        if ix.decode_slots():
            # Each decode worker runs at most its recipe's max_batch_size (per attention rank) requests; the
            # rest wait for a slot, and the wait is TTFT: the client's first token comes from the decode
            # worker (sim/validate_inferencex.py _DECODE_BATCH). Under attention DP the field is a rank's:
            # sim/build.py multiplies it by the worker's ranks.
            dec_layout = {**dec_layout, "scheduler.max_num_seqs": ix.decode_seqs_field()}
        seqs, tokens = ix.prefill_caps
        if seqs and tokens:
            # The prefill worker's recipe max_batch_size and max_num_tokens (sim/validate_inferencex.py
            # _PREFILL_CAPS), a rank's under attention DP, where each rank schedules its own batch from the
            # requests placed on it (TensorRT-LLM's per-rank executor: SchedulerConfig.adp_per_rank).
            pre_layout = {**pre_layout, "scheduler.max_num_seqs": seqs, "scheduler.max_num_batched_tokens": tokens}
            if ix.prefill.dp_attn:
                pre_layout["scheduler.adp_per_rank"] = True
        if cost_model == "aic":
            # The workers' MoE backend where their recipes set TRTLLM on FP8 block-scaled experts
            # (sim/validate_recipes.py DISAGG_TRTGEN_WORKERS; backends/sim/aic/trtgen.py).
            kernels = [disagg_fp8_moe_kernel(row, w.moe_ep, w.attention_dp > 1) for w in (pre, dec)]
            if disagg_prefill_trtgen(row, pre.moe_ep):  # NVFP4 GB200 ctx workers' TRTLLM experts (the same knob)
                kernels[0] = "trtllm"
            if "trtllm" in kernels:
                pre_layout = {**pre_layout, "engine.aic_fp8_moe_kernel": kernels[0]}
                dec_layout = {**dec_layout, "engine.aic_fp8_moe_kernel": kernels[1]}
            # The decode workers' WIDEEP MoE backend (sim/validate_recipes.py WIDE_EP_WORKERS): aic's large-EP
            # decode block. A prefill worker's steps carry prompts (aic's fused block; its large-EP context
            # graph is not built here).
            if disagg_wide_ep(row, dec.moe_ep):
                dec_layout = {**dec_layout, "engine.aic_trtllm_wide_ep": True}
    elif missing_worker_counts(row) and twin_of(row):
        plan.layout = (f"twin record {twin_of(row)}: {pre.count} prefill, {dec.count} decode workers "
                       f"(the same measured TTFT and TPOT; sim/validate_twins.py)")
        plan.counts = (pre.count, dec.count)
    elif missing_worker_counts(row):
        if disagg is None:
            raise NotExpressible("disaggregated row without prefill/decode worker counts")
        assumed: AssumedWorkers = assume_workers(cfg, pre_layout, dec_layout, conc, isl, osl, disagg)
        pre.count, dec.count = assumed.prefill, assumed.decode
        plan.layout, plan.counts = assumed.note(), (assumed.prefill, assumed.decode)
    # The prefill and decode workers' flags of the srt-slurm recipe the row's InferenceX entry launched, where
    # known (SGLang DeepSeek-R1: sim/validate_recipes.py DISAGG_RECIPES), on each worker kind's replicas.
    if s.overlap_scheduler:
        # TensorRT-LLM's disaggregated launches run the context (prefill) workers with
        # `disable_overlap_scheduler: true` and the generation workers with it false (ishandhanani/srt-slurm
        # recipes/trtllm/b200-fp8/1k1k/mtp/ctx1_gen8_tp8_batch4_eplb0_mtp3_32.yaml @fe2cd90, MTP too; the h200
        # recipes @4893f83, docs/validate-accuracy.md): the prefill replicas read new requests at once.
        pre_layout = {**pre_layout, "scheduler.overlap_scheduler": False}
    launch = disagg_recipe(row)
    if launch is not None:
        pre_layout, dec_layout = apply_disagg_recipe(launch, cfg, pre_layout, dec_layout)
    if cost_model == "aic" and harness(row) == INFERENCEX:
        # The decode worker's DeepEP low-latency all-to-all (sim/validate_inferencex.py SGLANG_DEEPEP_LL_SYSTEMS).
        a2a = decode_moe_a2a(str(row["backend"]), str(row.get("system")), dec.attention_dp, dec.moe_ep)
        if a2a != "default":
            dec_layout = {**dec_layout, "engine.aic_moe_a2a": a2a}
        # ... and the prefill worker's DeepEP normal mode (sim/validate_inferencex.py prefill_moe_a2a).
        a2a = prefill_moe_a2a(str(row["backend"]), str(row.get("system")), str(row.get("precision")),
                              pre.attention_dp, pre.moe_ep)
        if a2a != "default":
            pre_layout = {**pre_layout, "engine.aic_moe_a2a": a2a}
    if ix is None and missing_worker_counts(row):
        # The entries that fit disagree on the workers but all ran MTP at one depth (agreed_mtp): it drafts.
        mtp = agreed_mtp(row)
        if mtp and mtp > 0 and conc <= MTP_SIMULATED_MAX_CLIENTS:
            set_mtp(cfg.speculative, mtp)
            plan.layout += (f"; every InferenceX entry at {conc} clients ran MTP {mtp} (simulated: MTP_ACCEPTANCE, "
                            f"validate_recipes.py; sim/validate_inferencex.py agreed_mtp)")
    c = cfg.cluster
    # The benchmark's client reads its tokens from the decode worker's stream (trtllm-serve's
    # disaggregated server, Dynamo, vLLM's P/D proxy, SGLang's router): the KV transfer and the decode
    # worker's first step for the request count into TTFT (sim/disagg.py).
    c.disagg_first_token = "decode"
    if harness(row) == INFERENCEX:
        # InferenceX's disaggregated runs are Dynamo deployments (srt-slurm's default frontend): the frontend
        # picks each request's worker in turn (its default `--router-mode` round-robin), whatever its load.
        c.disagg_decode_router = "round_robin"
    if str(row["backend"]) == "sglang":
        # SGLang's decode server pre-allocates a request's KV before its prefill server runs it, and keeps
        # num_reserved_decode_tokens (512) free per request it holds (sim/disagg.py).
        c.disagg_admission = "prealloc"
        # ... and streams the transferred first token at the loop iteration that takes the request, before any
        # decode step runs it (sim/config.py disagg_first_token "decode_admit").
        c.disagg_first_token = "decode_admit"
        # Its decode server runs no forward for the requests it takes: they join the running batch, whose
        # decode steps go on, and their first forward is a decode row there (SGLANG_DECODE_JOINS,
        # sim/validate_engines.py).
        dec_layout = {**dec_layout, "scheduler.batch_policy": SGLANG_DECODE_JOINS}
        c.disagg_join_row = SGLANG_DECODE_JOIN_ROW
    c.num_replicas = pre.count + dec.count
    c.num_prefill_replicas = pre.count
    c.router = "least_outstanding" if "least_outstanding" in _routers() else c.router
    c.replicas = [pre_layout] * pre.count + [dec_layout] * dec.count
    return plan


def _engine_budget(backend: str, hw: str, fallback: int) -> int:
    """The row's engine's default step budget on hw (8,192 for an engine not in the table)."""
    try:
        return engine_defaults(backend, get_hardware(hw).mem_bytes).max_num_batched_tokens
    except ValueError:
        return max(fallback, 8192)


def _engine_batching(backend: str, hw: str) -> tuple[str, int]:
    """The row's engine's batch policy and prefill cap (mixed, no cap for an engine not in the table)."""
    try:
        d = engine_defaults(backend, get_hardware(hw).mem_bytes)
    except ValueError:
        return "mixed", 0
    return d.batch_policy, d.max_prefill_tokens


def _engine_capacity_policy(backend: str, hw: str) -> str:
    """The row's engine's KV admission policy (on_demand for an engine not in the table)."""
    try:
        return engine_defaults(backend, get_hardware(hw).mem_bytes).capacity_policy
    except ValueError:
        return "on_demand"


def _engine_overlap(backend: str, hw: str) -> bool:
    """Whether the row's engine runs an overlap scheduler (TensorRT-LLM's; False for an engine not in the table)."""
    try:
        return engine_defaults(backend, get_hardware(hw).mem_bytes).overlap_scheduler
    except ValueError:
        return False


def _routers() -> tuple[str, ...]:
    from twinserve.sim.config import ROUTERS
    return tuple(ROUTERS)


def _apply(cfg: StudyConfig, values: dict[str, Any]) -> None:
    for dotted, v in values.items():
        section, name = dotted.split(".", 1)
        setattr(getattr(cfg, section), name, v)


def closed_loop_available() -> bool:
    """True once [workload] concurrency (closed-loop clients) exists (wip/closedloop)."""
    return "concurrency" in {f.name for f in fields(WorkloadConfig)}


def _set_workload(w: WorkloadConfig, conc: int, isl: int, osl: int, design: RunDesign = STEADY) -> None:
    """The design's lengths and N closed-loop clients (or, before closed loops exist, N at once)."""
    (p_lo, p_hi), (o_lo, o_hi) = design.lengths(isl), design.lengths(osl)
    # uniform: integers on [lo, hi] as the benchmark's np.random.randint(lo, hi + 1); fixed: exactly L.
    w.prompt_dist = "fixed" if p_lo == p_hi else "uniform"
    w.output_dist = "fixed" if o_lo == o_hi else "uniform"
    w.prompt_mean, w.output_mean = (p_lo + p_hi) / 2, (o_lo + o_hi) / 2
    w.prompt_min, w.prompt_max = p_lo, p_hi
    w.output_min, w.output_max = o_lo, o_hi
    w.on_overlong = "fail"
    warm, measured, total = design_counts(conc, design)
    w.num_requests = total
    if closed_loop_available():
        setattr(w, "concurrency", conc)
        setattr(w, "warmup_requests", warm)
        w.num_requests = total - warm  # the warm-up requests come on top of num_requests
    else:
        w.arrival = "all_at_once"


def with_rate(cfg: StudyConfig, rate: float) -> StudyConfig:
    """A copy of an open-loop stand-in study at a fixed arrival rate (Little's law iteration)."""
    out = copy.deepcopy(cfg)
    out.workload.arrival = "fixed"
    out.workload.rate = max(rate, 1e-4)
    return out
