"""AicCostModel: each step priced from aiconfigurator-core's measured per-operation kernel timings.

A step's time is the sum of aic's own answers (EngineHandle.evaluate_ops_json) for its ops at the
step's shape, in aic's three-pass composition of a mixed step (sdk/rust_engine_step.py): the linear
layers, norms, MoE and all-reduces over all the step's tokens (aic's context graph for a step with
prefill tokens, its generation graph for a decode-only step); context attention over the prefill
chunks; generation attention over the decode rows at their context. Plus, when set, the engine's
host cost per step and per sequence (aic's own step estimate has none), and a scale on the kernel
time (serving against aic's isolated kernel measurements): SERVING_TERMS, fitted per engine on
development rows for `simulate validate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec
from twinserve.backends.sim.parallel import Parallelism, ParallelismError, _loop_step_time

from twinserve.backends.sim.aic.graph import (MOE_A2A, QK_NORM_AR_MIN_TOKENS, WIDE_EP_A2A_PROXY, StepGraph,
                                          aic_moe_parallelism, build_graph, split_wide_ep_a2a)
from twinserve.backends.sim.aic.marlin import MARLIN_KERNELS, MarlinMoe, marlin_extra_ms, marlin_moe
from twinserve.backends.sim.aic.trtgen import (FP8_MOE_KERNELS, NVFP4_CUTLASS_SOURCE, NVFP4_CUTLASS_TABLE_SYSTEM,
                                               NVFP4_MOE_KERNELS, TRTGEN_DATABASE, Nvfp4Trtgen, TrtgenMoe,
                                               nvfp4_trtgen_points, trtgen_delta_ms, trtgen_moe)
from twinserve.backends.sim.aic.nvfp4_gemm import NVFP4_GEMM_DATABASE, nvfp4_gemm_ops, tuned_delta_ms
from twinserve.backends.sim.aic.mapping import (AicError, check_precision, evaluator, fp8_gemm_mode, held_mxfp4_mode,
                                                quant_modes, resolve_version, sdk, static_fp8_checkpoint, system_for)
from twinserve.backends.sim.aic.vllm_triton import TRITON_DATABASES

_MS = 1e-3
EXPERT_OPS = ("context_moe", "generation_moe")  # the routed experts' op in a token graph (fused; large-EP)
KV_GRID = 16  # decode attention is priced at its context rounded up to a KV block of 16 tokens


@dataclass(slots=True, frozen=True)
class ServingTerms:
    """A served step beyond aic's kernel sum: kernel_scale x kernels + step_s + per_seq_s x sequences."""

    kernel_scale: float = 1.0
    step_s: float = 0.0
    per_seq_s: float = 0.0


# Each engine's serving terms for `simulate validate --cost-model aic` (sim/validate_rows.py sets them on
# every aic row; a study sets them itself: aic_kernel_scale, step_overhead_s, per_seq_overhead_s).
# Fitted 2026-12-05 on development rows only (Llama-3.1-70B, Qwen3-32B, gpt-oss-120b, DeepSeek-R1): the
# 141 aggregated rows aic priced of `simulate validate --silicon --rows dev --cost-model aic --limit 300
# --max-clients 128` (45 vLLM, 27 SGLang, 69 TensorRT-LLM), each form fitted by least absolute relative
# TPOT error and kept only where it also wins leaving each development model out of the fit
# (experiments/aic_serving_fit.py; docs/validate-accuracy.md, "Serving terms for the measured backend"):
# - vLLM: 7% over the kernel sum and no separate host time (V1 schedules the next step while the GPU
#   runs this one); per model left out the scale comes out 1.03-1.09. Median |TPOT error| 8.3% -> 4.7%.
#   Before: the cuda_graph_python profile's 0.8 ms a step + 10 us a sequence (same rows, rerun).
#   Held out (run once, after): vLLM 23.7% -> 23.0%, all 27 aic rows 15.9% -> 15.9%.
# - SGLang: the cuda_graph_python profile's host time (0.8 ms a step, 10 us a sequence) kept: no fitted
#   form beat it (6.8%); a pure-decode probe of its 66 decode-heavy rows gives 0.56 ms + 17 us.
# - TensorRT-LLM: kernels only. Its InferenceX rows want a scale of 0.76 (DeepSeek-R1 and Llama-3.1-70B
#   run 25-40% under aic's kernel sum), but gpt-oss-120b and Qwen3-32B do not (7% and 9% as they are;
#   21% and 25% with the scale fitted on the other models): it does not carry to a model left out.
SERVING_TERMS: dict[str, ServingTerms] = {
    "vllm": ServingTerms(kernel_scale=1.07),
    "sglang": ServingTerms(step_s=0.8e-3, per_seq_s=10e-6),
    "trtllm": ServingTerms(),
}


def serving_terms(backend: str) -> ServingTerms:
    """The fitted serving terms of an engine ('vllm', 'sglang', 'trtllm'); kernels only for any other."""
    return SERVING_TERMS.get(backend, ServingTerms())


def _total(rows: list[tuple[str, float, float, str]]) -> float:
    """Sum of an evaluate_ops_json answer's latencies (ms)."""
    t = 0.0
    for row in rows:
        t += row[1]
    return t


class AicCostModel:
    """Step time from aic's database for one model on one GPU of a TP group; prices memoized by shape.

    Prefill chunks are priced as num_prefill_seqs equal chunks of their mean size and mean cached
    context (exact for one chunk); decode rows at their mean context plus the token they write.
    Attention DP: each rank runs 1/dp of the step's sequences (aic's MoE ops gather every rank's
    tokens), whole sequences: a step with prefill is priced on its busiest rank (step_time). PP: the
    heaviest stage, the batch cut into pp micro-batches as PipelineCostModel does.
    """

    __slots__ = ("name", "model", "hardware", "tp", "par", "system", "backend", "version", "database",
                 "graph", "step_overhead_s", "per_seq_overhead_s", "kernel_scale", "_eval", "_tok", "_dtok", "_seq",
                 "_exp", "_ctx", "_gen", "_p2p", "mxfp4_moe_kernel", "_marlin", "_mx", "fp8_moe_kernel", "_trtgen",
                 "_trtgen_eval", "_tg", "nvfp4_moe_kernel", "trtllm_wide_ep", "moe_a2a", "_qk", "_fp4", "_fp4_eval",
                 "_fg",
                 "a2a_system", "_a2a_eval", "_wide")

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1, backend: str = "vllm",
                 version: str = "", parallel: Parallelism | None = None, step_overhead_s: float = 0.0,
                 per_seq_overhead_s: float = 0.0, kernel_scale: float = 1.0,
                 mxfp4_moe_kernel: str = "default", fp8_moe_kernel: str = "default",
                 trtllm_wide_ep: bool = False, moe_a2a: str = "default",
                 nvfp4_moe_kernel: str = "default") -> None:
        if not kernel_scale > 0:
            raise AicError("aic_kernel_scale", f"aic_kernel_scale {kernel_scale!r}: must be > 0")
        if moe_a2a not in MOE_A2A:
            raise AicError("aic_moe_a2a", f"aic_moe_a2a {moe_a2a!r} is not one of {', '.join(MOE_A2A)}")
        if moe_a2a != "default" and backend != "sglang":
            raise AicError("aic_moe_a2a", f"aic_moe_a2a {moe_a2a!r} is SGLang's DeepEP all-to-all; "
                           f"this is {backend}")
        self.moe_a2a = moe_a2a
        par = parallel or Parallelism(tensor_parallel_size=tp)
        try:
            par.check(model)
        except ParallelismError as err:
            raise AicError(err.field, str(err)) from None
        if model.num_linear_layers:
            raise AicError("cost_model", linear_attention_refusal(model, system_for(hardware.name), backend))
        pdb = sdk()
        self.name = "aic"
        self.model, self.hardware, self.tp, self.par = model, hardware, par.tensor_parallel_size, par
        self.system = system_for(hardware.name)
        self.backend = backend
        self.version = resolve_version(self.system, backend, version)
        self.database = _load(pdb, self.system, backend, self.version)
        modes = fp8_gemm_mode(self.database, quant_modes(model.precision, model.is_moe, self.system, backend,
                                                    model.experts_only_quantization),
                              static_fp8_checkpoint(model.name, model.is_moe))
        modes = held_mxfp4_mode(self.database, modes)
        check_precision(self.database, modes, model.precision)
        self._eval = evaluator(self.database)
        self.trtllm_wide_ep = bool(trtllm_wide_ep)
        # The system whose tables price a wide-EP block's all-to-all: this one's, or WIDE_EP_A2A_PROXY's (a
        # cross-system proxy where this system's tables hold none).
        self.a2a_system = self.system
        self._a2a_eval: Any = None
        self._wide: dict[int, float] = {}
        if self.trtllm_wide_ep:
            self._check_wide_ep(model, par, fp8_moe_kernel)
            proxy = WIDE_EP_A2A_PROXY.get(self.system)
            if proxy is not None:
                self.a2a_system = proxy
                self._a2a_eval = evaluator(_load(pdb, proxy, backend, resolve_version(proxy, backend, self.version)))
        self.graph: StepGraph = self._build(par.stage_model(model), par, modes)
        self.mxfp4_moe_kernel = mxfp4_moe_kernel
        self._marlin = self._marlin_transfer(mxfp4_moe_kernel)
        self._mx: dict[int, float] = {}
        self.fp8_moe_kernel = fp8_moe_kernel
        self._trtgen_eval: Any = None
        self._trtgen = self._trtgen_transfer(fp8_moe_kernel, pdb)
        self.nvfp4_moe_kernel = nvfp4_moe_kernel
        if nvfp4_moe_kernel != "default":
            self._trtgen = self._cutlass_transfer(nvfp4_moe_kernel)
        self._tg: dict[int, float] = {}
        self._fp4, self._fp4_eval = self._nvfp4_gemm_transfer(pdb)
        self._fg: dict[tuple[bool, int], float] = {}
        self._probe()
        self.step_overhead_s = step_overhead_s
        self.per_seq_overhead_s = per_seq_overhead_s
        self.kernel_scale = kernel_scale
        self._tok: dict[int, float] = {}
        self._exp: dict[int, float] = {}  # the routed experts' compute op alone, x = one rank's tokens
        self._dtok: dict[int, float] = {}
        self._seq: dict[int, float] = {}
        self._ctx: dict[tuple[int, int, int], float] = {}
        self._gen: dict[tuple[int, int], float] = {}
        self._p2p: dict[int, float] = {}
        self._qk: dict[int, float] = {}

    def _build(self, model: ModelSpec, par: Parallelism, modes: dict[str, Any]) -> StepGraph:
        """The step graph; prefill attention on FP8 K/V in the FP8-FMHA lane where the database measured
        this shape only there.

        aic files a prefill attention kernel under its FMHA (query/softmax) and K/V dtypes. With FP8 K/V,
        SGLang's Hopper tables (0.5.14) hold head_dim 64-192 only in the FP8-FMHA lane (the 16-bit-FMHA
        lane has head_dim 256 and 512): the kernel the collector saw SGLang run on FP8 K/V at those
        shapes. Without this, a GQA model at FP8 K/V there (Llama-3.1-8B, Qwen3-235B-A22B on H200) had
        no price at all. A shape the 16-bit lane holds keeps it; MLA models use aic's MLA tables.
        """
        from aiconfigurator_core.sdk import common
        graph = build_graph(model, par, modes, self.backend, self.database, self.trtllm_wide_ep, self.moe_a2a)
        if self._a2a_eval is not None:  # the wide-EP block's all-to-all priced on the proxy system's tables
            graph = split_wide_ep_a2a(graph)
        if (model.is_mla or modes["generation_attention"] is not common.KVCacheQuantMode.fp8
                or modes["fmha"] is common.FMHAQuantMode.fp8):
            return graph
        try:
            self._eval(graph.context_attn, is_context=True, batch_size=1, s=128, prefix=0, x=None)
            return graph
        except Exception:  # aic's PerfDataNotAvailableError and kin
            pass
        fp8 = build_graph(model, par, {**modes, "fmha": common.FMHAQuantMode.fp8}, self.backend, self.database,
                          self.trtllm_wide_ep, self.moe_a2a)
        try:
            self._eval(fp8.context_attn, is_context=True, batch_size=1, s=128, prefix=0, x=None)
        except Exception:
            return graph  # neither lane: _probe names what is missing
        return fp8

    def _nvfp4_gemm_transfer(self, pdb: Any) -> tuple[tuple[str, str], Any]:
        """(token graph's, decode graph's) NVFP4 GEMM ops and the evaluator of the database that prices them as
        TensorRT-LLM's autotuner runs them (aic/nvfp4_gemm.py); ('', ''), None where that does not apply: not
        TensorRT-LLM, no NVFP4 GEMM, or no stand-in NVFP4 GEMM rows for this system."""
        ops = (nvfp4_gemm_ops(self.graph.tokens), nvfp4_gemm_ops(self.graph.decode_tokens))
        if self.backend != "trtllm" or not any(ops):
            return ("", ""), None
        try:
            ev = evaluator(_load(pdb, self.system, *NVFP4_GEMM_DATABASE))
            for g in ops:
                if g:
                    ev(g, is_context=True, batch_size=1, s=1, x=16)
        except Exception:  # no such database or rows (aic's PerfDataNotAvailableError and kin): aic's answer stands
            return ("", ""), None
        return ops, ev

    def _marlin_transfer(self, kernel: str) -> MarlinMoe | None:
        """The Marlin price of the MXFP4 experts where asked for (aic/marlin.py); AicError where it does not apply."""
        if kernel not in MARLIN_KERNELS:
            raise AicError("aic_mxfp4_moe_kernel", f"aic_mxfp4_moe_kernel {kernel!r} is not one of "
                           f"{', '.join(MARLIN_KERNELS)}")
        if kernel == "default":
            return None
        marlin = marlin_moe(self.graph.tokens) if self.backend == "vllm" else None
        if marlin is None:
            raise AicError("aic_mxfp4_moe_kernel", f"aic_mxfp4_moe_kernel 'marlin' is vLLM's "
                           f"VLLM_MXFP4_USE_MARLIN for MXFP4 experts with 16-bit activations; "
                           f"{self.model.name} on aic_backend {self.backend!r} has none")
        try:
            self._eval(marlin.reference, is_context=True, batch_size=1, s=1, x=16)
        except Exception as err:  # aic's PerfDataNotAvailableError and kin
            raise AicError("aic_mxfp4_moe_kernel", f"aiconfigurator-core's {self.describe()} database has no "
                           f"Marlin MXFP4 MoE timings at this layout: {str(err).split(': tried')[0]}") from None
        return marlin

    def _check_wide_ep(self, model: ModelSpec, par: Parallelism, fp8_moe_kernel: str) -> None:
        """TensorRT-LLM's WIDEEP MoE backend applies to an MLA MoE model (aic's DeepSeek family) on aic's
        TensorRT-LLM tables, its experts split whole over EP > 1 ranks (aic's MoECommBackendSpec.feasible:
        MoE TP 1, the EP dividing the experts); AicError otherwise."""
        moe = aic_moe_parallelism(model, par)
        why = ("aic_backend is not 'trtllm'" if self.backend != "trtllm" else
               f"{model.name} is not an MLA MoE model" if not (model.is_mla and model.num_moe_layers) else
               f"MoE TP {moe.moe_tensor_parallel_size} x EP {moe.expert_parallel_size}: WIDEEP splits whole "
               f"experts over EP > 1 ranks" if moe.moe_tensor_parallel_size != 1 or moe.expert_parallel_size < 2
               or model.num_experts % moe.expert_parallel_size else
               "aic_fp8_moe_kernel 'trtllm' is another MoE backend" if fp8_moe_kernel != "default" else "")
        if why:
            raise AicError("aic_trtllm_wide_ep", f"aic_trtllm_wide_ep is TensorRT-LLM's WIDEEP MoE backend: {why}")

    def _trtgen_transfer(self, kernel: str, pdb: Any) -> TrtgenMoe | None:
        """TensorRT-LLM's trtllm-gen experts (the TRTLLM MoE backend) where asked for (aic/trtgen.py): FP8
        block-scaled experts from aic's SGLang trtllm-gen rows, NVFP4 experts from aic's own TensorRT-LLM
        trtllm-gen rows; for 'triton', vLLM's Triton fused-MoE (_triton_transfer); AicError where it does not
        apply."""
        if kernel not in FP8_MOE_KERNELS:
            raise AicError("aic_fp8_moe_kernel", f"aic_fp8_moe_kernel {kernel!r} is not one of "
                           f"{', '.join(FP8_MOE_KERNELS)}")
        if kernel == "default":
            return None
        if kernel == "triton":
            return self._triton_transfer(pdb)
        fp4 = trtgen_moe(self.graph.tokens, "nvfp4") if self.backend == "trtllm" else None
        if fp4 is not None:
            try:
                self._trtgen_eval = Nvfp4Trtgen(self._eval, nvfp4_trtgen_points(self.database, fp4))
            except (OSError, ValueError, KeyError) as err:
                raise AicError("aic_fp8_moe_kernel", f"aiconfigurator-core's {self.describe()} database has no "
                               f"trtllm-gen NVFP4 MoE timings at this layout: {err}") from None
            return fp4
        moe = trtgen_moe(self.graph.tokens) if self.backend == "trtllm" else None
        if moe is None:
            raise AicError("aic_fp8_moe_kernel", f"aic_fp8_moe_kernel 'trtllm' is TensorRT-LLM's TRTLLM MoE "
                           f"backend for FP8 block-scaled or NVFP4 experts; {self.model.name} on aic_backend "
                           f"{self.backend!r} has none")
        self._trtgen_eval = self._second_table(pdb, moe, *TRTGEN_DATABASE, "trtllm-gen FP8 block-scale MoE")
        return moe

    def _cutlass_transfer(self, kernel: str) -> TrtgenMoe:
        """TensorRT-LLM's CUTLASS MoE backend on NVFP4 experts (aic/trtgen.py, "CUTLASS NVFP4"): the expert op
        priced on aic's CUTLASS rows (NVFP4_CUTLASS_SOURCE) at every gathered token count, from this system's
        TensorRT-LLM table or NVFP4_CUTLASS_TABLE_SYSTEM's; AicError where it does not apply."""
        if kernel not in NVFP4_MOE_KERNELS:
            raise AicError("aic_nvfp4_moe_kernel", f"aic_nvfp4_moe_kernel {kernel!r} is not one of "
                           f"{', '.join(NVFP4_MOE_KERNELS)}")
        if self._trtgen is not None:
            raise AicError("aic_nvfp4_moe_kernel", f"aic_nvfp4_moe_kernel {kernel!r} and aic_fp8_moe_kernel "
                           f"{self.fp8_moe_kernel!r} each set the experts' MoE backend: set one")
        fp4 = trtgen_moe(self.graph.tokens, "nvfp4") if self.backend == "trtllm" else None
        if fp4 is None:
            raise AicError("aic_nvfp4_moe_kernel", f"aic_nvfp4_moe_kernel {kernel!r} is TensorRT-LLM's CUTLASS MoE "
                           f"backend for NVFP4 experts; {self.model.name} on aic_backend {self.backend!r} has none")
        table = NVFP4_CUTLASS_TABLE_SYSTEM.get(self.system, self.system)
        try:
            self._trtgen_eval = Nvfp4Trtgen(self._eval, nvfp4_trtgen_points(self.database, fp4, NVFP4_CUTLASS_SOURCE,
                                                                            table), own_max_tokens=0)
        except (OSError, ValueError, KeyError) as err:
            raise AicError("aic_nvfp4_moe_kernel", f"aiconfigurator-core's trtllm {self.version} {table} database "
                           f"has no CUTLASS NVFP4 MoE timings at this layout: {err}") from None
        return fp4

    def _triton_transfer(self, pdb: Any) -> TrtgenMoe:
        """vLLM's Triton fused-MoE on the FP8 block-scaled experts (aic/vllm_triton.py): the expert op priced on
        the aic vLLM table that timed that kernel for this system; AicError where it does not apply."""
        moe = trtgen_moe(self.graph.tokens) if self.backend == "vllm" else None
        if moe is None:
            raise AicError("aic_fp8_moe_kernel", f"aic_fp8_moe_kernel 'triton' is vLLM's Triton fused-MoE for FP8 "
                           f"block-scaled experts; {self.model.name} on aic_backend {self.backend!r} has none")
        if self.system not in TRITON_DATABASES:
            raise AicError("aic_fp8_moe_kernel", f"aic_fp8_moe_kernel 'triton': aiconfigurator-core holds vLLM "
                           f"Triton fused-MoE FP8 block-scale timings for {', '.join(sorted(TRITON_DATABASES))} "
                           f"only, not {self.system}")
        self._trtgen_eval = self._second_table(pdb, moe, *TRITON_DATABASES[self.system],
                                               "Triton fused-MoE FP8 block-scale", pinned=True)
        return moe

    def _second_table(self, pdb: Any, moe: TrtgenMoe, backend: str, version: str, what: str,
                      pinned: bool = False) -> Any:
        """The evaluator of another aic database of this system that prices the expert op `moe` (trtgen.py,
        vllm_triton.py), probed once; AicError naming the database where it cannot."""
        try:
            ev = evaluator(_load(pdb, self.system, backend, version, pinned=pinned))
            ev(moe.op, is_context=True, batch_size=1, s=1, x=16)
        except Exception as err:  # no such database, or aic's PerfDataNotAvailableError and kin
            raise AicError("aic_fp8_moe_kernel", f"aiconfigurator-core's {backend} {version} {self.system} "
                           f"database has no {what} timings at this layout: {str(err).split(': tried')[0]}"
                           ) from None
        return ev

    def trtgen_time(self, tokens: int) -> float:
        """Seconds the other FP8 / NVFP4 expert kernel adds over the model's own expert table at `tokens` rows
        (negative where faster): trtllm-gen's for aic_fp8_moe_kernel 'trtllm', vLLM's Triton fused-MoE's for
        'triton'; 0 for 'default'."""
        if self._trtgen is None:
            return 0.0
        t = self._tg.get(tokens)
        if t is None:
            t = self._tg[tokens] = trtgen_delta_ms(self._eval, self._trtgen_eval, self._trtgen, tokens) * _MS
        return t

    def marlin_time(self, tokens: int) -> float:
        """Seconds the Marlin MXFP4 experts add over the model's own expert table at `tokens` rows (0 unless
        aic_mxfp4_moe_kernel is 'marlin')."""
        if self._marlin is None:
            return 0.0
        t = self._mx.get(tokens)
        if t is None:
            t = self._mx[tokens] = marlin_extra_ms(self._eval, self._marlin, tokens) * _MS
        return t

    def _probe(self) -> None:
        """Query every op once, so a shape the database has no timings for fails now, by name."""
        g = self.graph
        # The token ops are the linear layers, norms, MoE block and all-reduces together: the label names
        # them all (a missing expert table read "no linear layers timings" before).
        calls = [("linear / MoE / all-reduce", g.tokens, True, 1, 1, 0, 16),
                 ("decode linear / MoE / all-reduce", g.decode_tokens, True, 1, 1, 0, 16),
                 ("LM head", g.logits, True, 1, 1, 0, 1),
                 ("context attention", g.context_attn, True, 1, 128, 0, None),
                 ("generation attention", g.generation_attn, False, 1, 128, 0, None)]
        if g.p2p:
            calls.append(("pipeline hand-off", g.p2p, True, 1, 1, 0, 16))
        if g.qk_norm_ar:
            calls.append(("q/k norm all-reduce", g.qk_norm_ar, True, 1, 1, 0, QK_NORM_AR_MIN_TOKENS))
        if g.wide_a2a:
            calls += [("wide-EP routed experts", g.wide_routed, True, 1, 1, 0, 16),
                      ("wide-EP shared expert", g.wide_shared, True, 1, 1, 0, 16)]
            try:
                self._a2a_eval(g.wide_a2a, is_context=True, batch_size=1, s=1, x=16)
            except Exception as err:  # aic's PerfDataNotAvailableError and kin
                raise AicError("aic_trtllm_wide_ep", f"aiconfigurator-core's {self.a2a_system} {self.backend} "
                               f"database (the all-to-all proxy for {self.system}) has no NVLink all-to-all "
                               f"timings here: {str(err).split(': tried')[0]}") from None
        for what, js, is_context, b, s, prefix, x in calls:
            try:
                self._eval(js, is_context=is_context, batch_size=b, s=s, prefix=prefix, x=x)
            except Exception as err:  # aic's PerfDataNotAvailableError and kin: no timings for this shape
                m = self.model
                have = attention_shapes(self.database) if "attention" in what else ""
                raise AicError("model", f"aiconfigurator-core's {self.describe()} database has no {what} "
                               f"timings for {m.name} at TP {self.tp} ({m.num_heads // self.tp} heads, "
                               f"{m.kv_heads_per_gpu(self.tp)} KV heads per GPU, head_dim {m.head_dim}, "
                               f"{m.precision.label()}): {str(err).split(': tried')[0]}"
                               + (f"; it has (KV heads per GPU, head_dim, window): {have}" if have else "")
                               ) from None

    # A speculative step's verify rows (a sequence's last token and its k drafts) are priced as k + 1
    # decode rows at the sequence's context, with nothing added: aic's own speculative decode scales
    # the generation step's batch by the tokens each sequence verifies (sdk/models/deepseek.py, its
    # MTP `nextn`), where a prefill chunk's price would run the context-phase kernels instead.
    prices_verify = True

    def verify_time(self, num_spec_reqs: int, num_draft_tokens: int) -> float:
        """Seconds verify rows add beyond their price as decode rows: none (prices_verify)."""
        return 0.0

    def describe(self) -> str:
        """What prices the steps, e.g. 'aic vllm 0.24.0 on h200_sxm'."""
        marlin = " (Marlin MXFP4 experts)" if getattr(self, "_marlin", None) is not None else ""
        if getattr(self, "_trtgen", None) is not None and self.fp8_moe_kernel == "triton":
            marlin += f" (vLLM Triton FP8 experts from aic {' '.join(TRITON_DATABASES[self.system])})"
        elif getattr(self, "_trtgen", None) is not None and getattr(self, "nvfp4_moe_kernel", "") == "cutlass":
            table = NVFP4_CUTLASS_TABLE_SYSTEM.get(self.system, self.system)
            marlin += (" (CUTLASS NVFP4 experts from aic's " + ("own" if table == self.system else table)
                       + " CUTLASS rows)")
        elif getattr(self, "_trtgen", None) is not None:
            fp4 = json.loads(self._trtgen.op)[0]["Moe"]["quant_mode"] == "nvfp4"
            marlin += (" (trtllm-gen NVFP4 experts from aic's own trtllm-gen rows)" if fp4 else
                       f" (trtllm-gen FP8 experts from aic {' '.join(TRTGEN_DATABASE)})")
        if getattr(self, "_fp4_eval", None) is not None:
            marlin += f" (NVFP4 GEMMs tuned: at most aic {' '.join(NVFP4_GEMM_DATABASE)}'s)"
        if getattr(self, "a2a_system", self.system) != self.system:
            marlin += f" (wide-EP NVLink all-to-all from aic's {self.a2a_system} tables)"
        return f"aic {self.backend} {self.version} on {self.system}{marlin}"

    # Each part in seconds, memoized: the same shape always returns the same float, the table's own
    # answer. The tables are measurements and not monotone: Llama-3.1-8B on H200 (vLLM 0.24.0) has 33
    # token counts below 4,096 whose linear layers price up to 5.7% under a smaller count's.
    def tokens_time(self, tokens: int) -> float:
        """Linear layers, norms, MoE and all-reduces over `tokens` rows."""
        t = self._tok.get(tokens)
        if t is None:
            t = self._tok[tokens] = _total(self._eval(self.graph.tokens, is_context=True, batch_size=1, s=1,
                                                      x=tokens)) * _MS + self.marlin_time(tokens)
            t = self._tok[tokens] = (t + self.trtgen_time(tokens) + self.qk_norm_time(tokens)
                                     + self.nvfp4_gemm_time(tokens, decode=False) + self.wide_block_time(tokens))
        return t

    def decode_tokens_time(self, rows: int) -> float:
        """The same over a decode-only step's `rows` (aic's generation graph: shared experts overlapped)."""
        t = self._dtok.get(rows)
        if t is None:
            t = self._dtok[rows] = _total(self._eval(self.graph.decode_tokens, is_context=True, batch_size=1,
                                                     s=1, x=rows)) * _MS + self.marlin_time(rows)
            t = self._dtok[rows] = (t + self.trtgen_time(rows) + self.qk_norm_time(rows)
                                    + self.nvfp4_gemm_time(rows, decode=True) + self.wide_block_time(rows))
        return t

    def nvfp4_gemm_time(self, tokens: int, decode: bool) -> float:
        """Seconds the NVFP4 GEMMs add over aic's TensorRT-LLM table at `tokens` rows when priced as its autotuner
        runs them (aic/nvfp4_gemm.py), 0 or negative; the decode graph's ops where `decode`."""
        ops = self._fp4[1] if decode else self._fp4[0]
        if not ops:
            return 0.0
        key = (decode, tokens)
        t = self._fg.get(key)
        if t is None:
            t = self._fg[key] = tuned_delta_ms(self._eval, self._fp4_eval, ops, tokens) * _MS
        return t

    def wide_block_time(self, tokens: int) -> float:
        """A wide-EP block's Overlap whose all-to-all the proxy system's tables price (graph.py split_wide_ep_a2a;
        0 without one), as aic prices its OverlapOp: the slower of the routed side (router, prepare, dispatch,
        expert compute, combine; the all-to-all from the proxy's tables, the rest from this system's) and the
        shared expert beside it."""
        if not self.graph.wide_a2a:
            return 0.0
        t = self._wide.get(tokens)
        if t is None:
            g, kw = self.graph, dict(is_context=True, batch_size=1, s=1, x=tokens)
            routed = _total(self._eval(g.wide_routed, **kw)) + _total(self._a2a_eval(g.wide_a2a, **kw))
            t = self._wide[tokens] = max(routed, _total(self._eval(g.wide_shared, **kw))) * _MS
        return t

    def qk_norm_time(self, tokens: int) -> float:
        """The q / k norm's all-reduce over `tokens` rows (graph.py qk_norm_allreduce; 0 without one), priced at no
        fewer than QK_NORM_AR_MIN_TOKENS rows: below aic's smallest measured message its table has no latency
        floor."""
        if not self.graph.qk_norm_ar:
            return 0.0
        t = self._qk.get(tokens)
        if t is None:
            t = self._qk[tokens] = _total(self._eval(self.graph.qk_norm_ar, is_context=True, batch_size=1, s=1,
                                                     x=max(tokens, QK_NORM_AR_MIN_TOKENS))) * _MS
        return t

    def logits_time(self, seqs: int) -> float:
        """The LM head over one row per sequence."""
        t = self._seq.get(seqs)
        if t is None:
            t = self._seq[seqs] = _total(self._eval(self.graph.logits, is_context=True, batch_size=1, s=1,
                                                    x=seqs)) * _MS
        return t

    def context_attention_time(self, seqs: int, q: int, cached: int) -> float:
        """Prefill attention of `seqs` chunks of q new tokens after `cached` tokens each."""
        key = (seqs, q, cached)
        t = self._ctx.get(key)
        if t is None:
            t = self._ctx[key] = _total(self._eval(self.graph.context_attn, is_context=True, batch_size=seqs,
                                                   s=q, prefix=cached)) * _MS
        return t

    def generation_attention_time(self, seqs: int, kv_len: int) -> float:
        """Decode attention of `seqs` rows each reading kv_len tokens of K/V (its new one included),
        priced at kv_len rounded up to KV_GRID tokens so decode steps share cached prices."""
        kv = -(-kv_len // KV_GRID) * KV_GRID
        key = (seqs, kv)
        t = self._gen.get(key)
        if t is None:
            t = self._gen[key] = _total(self._eval(self.graph.generation_attn, is_context=False,
                                                   batch_size=seqs, s=kv)) * _MS
        return t

    def p2p_time(self, tokens: int) -> float:
        """One pipeline hand-off of `tokens` rows of hidden state."""
        t = self._p2p.get(tokens)
        if t is None:
            t = self._p2p[tokens] = _total(self._eval(self.graph.p2p, is_context=True, batch_size=1, s=1,
                                                      x=tokens)) * _MS
        return t

    def stage_time(self, pt: int, ps: int, pc: int, ds: int, dc: int) -> float:
        """GPU seconds of one rank of one stage over these (per-rank, per-micro-batch) features."""
        tokens = pt + ds
        if not tokens:
            return 0.0
        t = (self.tokens_time(tokens) if pt else self.decode_tokens_time(tokens)) + self.logits_time(ps + ds)
        if ps:
            t += self.context_attention_time(ps, max(1, round(pt / ps)), round(pc / ps))
        if ds:
            t += self.generation_attention_time(ds, round(dc / ds) + 1)
        return t

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: aic's price of each op at this shape, summed and scaled, plus host overheads."""
        par = self.par
        dp = par.data_parallel_size
        # Host time is one scheduler's: under attention DP each rank schedules, prepares and samples its
        # own requests in its own process, the ranks at once (SGLang: one Scheduler process a DP rank,
        # sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py; TensorRT-LLM and vLLM
        # likewise a loop a rank), so the per-sequence part counts the busiest rank's sequences, as the
        # roofline's does (cost_model.py seqs_r). Until 2026-12-06 it counted every rank's: 41 ms of host
        # time on a 4,096-sequence decode step over 32 ranks, where each rank schedules 128.
        seqs = num_prefill_seqs + num_decode_seqs
        if dp > 1:
            seqs = -(-num_prefill_seqs // dp) - (-num_decode_seqs // dp)
        host = self.step_overhead_s + self.per_seq_overhead_s * seqs
        split = dp * par.pipeline_parallel_size
        if split == 1:
            return self.stage_time(num_prefill_tokens, num_prefill_seqs, prefill_context, num_decode_seqs,
                                   decode_context) * self.kernel_scale + host
        # One rank's share of one micro-batch, rounded up so a lone sequence still runs somewhere.
        def share(v: int) -> int:
            return -(-v // split)
        pt, ds = share(num_prefill_tokens), share(num_decode_seqs)
        if par.data_parallel_size > 1 and num_prefill_seqs:
            t = self._busiest_rank_time(num_prefill_tokens, num_prefill_seqs, prefill_context, num_decode_seqs,
                                        decode_context, split)
            pt, ds = t[1], t[2]
            t = t[0]
        else:
            t = self.stage_time(pt, share(num_prefill_seqs), share(prefill_context), ds, share(decode_context))
        pp = par.pipeline_parallel_size
        if pp > 1 and pt + ds:
            t = pp * (t + self.p2p_time(pt + ds))
        return t * self.kernel_scale + host

    def _busiest_rank_time(self, pt: int, ps: int, pc: int, ds: int, dc: int, split: int) -> tuple[float, int, int]:
        """(GPU seconds, rank tokens, rank decode rows) of an attention-DP step with prefill: its busiest rank.

        Each request lives whole on one attention-DP rank, and the ranks run each layer in lock step, so the
        step lasts as long as its busiest rank: ceil(ps / split) of the prefill chunks (each of the chunks' mean
        size and context) and ceil(ds / split) decode rows. SGLang: the DataParallelController sends each request
        to one DP rank's scheduler (sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py
        @fdd9ede: round_robin_scheduler, or follow_bootstrap_room_scheduler's `bootstrap_room % dp` for a
        disaggregated server), and under DP attention the ranks gather their batches before every forward
        (scheduler.py prepare_mlp_sync_batch), a rank with nothing running an idle batch. TensorRT-LLM places each new request on one rank
        (executor_request_queue.py `_fetch_new_requests_attention_dp`, SchedulerConfig.adp_per_rank). Until
        2026-12-05 a step was priced as 1/split of every feature, a chunk spread over every rank, which no
        engine runs: one 8,192-token prompt on 4 attention-DP ranks was priced as a 2,048-token chunk a rank
        (its attention 1/16 of the quadratic work). The routed experts' compute (aic's `context_moe`, queried
        at one rank's tokens with every rank holding as many) stays at the even share: the experts receive
        every rank's tokens, so their work is the step's total, not the busiest rank's times the ranks.
        """
        kp = -(-ps // split)
        pt_r = -(-pt * kp // ps)
        pc_r = -(-pc * kp // ps)
        kd = -(-ds // split) if ds else 0
        dc_r = -(-dc * kd // ds) if ds else 0
        even = -(-(pt + ds) // split)
        t = self.stage_time(pt_r, kp, pc_r, kd, dc_r) - self.expert_time(pt_r + kd) + self.expert_time(even)
        return t, pt_r, kd

    def expert_time(self, tokens: int) -> float:
        """The routed experts' compute within tokens_time at `tokens` rows (0 without): aic's `context_moe` op
        (`generation_moe`, its large-EP expert compute, on a wide-EP worker's token graph),
        and what another expert kernel adds to it there (marlin_time, trtgen_time)."""
        t = self._exp.get(tokens)
        if t is None:
            if self.trtllm_wide_ep:  # the large-EP expert compute sits inside the block's Overlap: alone
                rows = self._eval(_nested_op(self.graph.wide_routed or self.graph.tokens, "generation_moe"),
                                  is_context=True, batch_size=1, s=1, x=tokens)
            else:
                rows = self._eval(self.graph.tokens, is_context=True, batch_size=1, s=1, x=tokens)
            t = self._exp[tokens] = (sum(r[1] for r in rows if r[0] in EXPERT_OPS) * _MS
                                     + self.marlin_time(tokens) + self.trtgen_time(tokens))
        return t

    def decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                          deadline: float) -> tuple[list[float], list[float]]:
        """step_time of consecutive decode-only steps (context grows by num_seqs a step), the same floats."""
        par = self.par
        if par.data_parallel_size * par.pipeline_parallel_size > 1 or not num_seqs:
            return _loop_step_time(self.step_time, num_seqs, context, max_steps, start, deadline)
        n = num_seqs
        # The same sum, in step_time's order, so each float is the one stepping would give.
        base = self.decode_tokens_time(n) + self.logits_time(n)
        host = self.step_overhead_s + self.per_seq_overhead_s * n
        scale = self.kernel_scale
        gen, gen_time = self._gen, self.generation_attention_time
        durations: list[float] = []
        ends: list[float] = []
        t = start
        for _ in range(max_steps):
            if t >= deadline:
                break
            kv = -(-(round(context / n) + 1) // KV_GRID) * KV_GRID
            a = gen.get((n, kv))
            if a is None:
                a = gen_time(n, kv)
            d = (base + a) * scale + host
            t = t + d
            durations.append(d)
            ends.append(t)
            context += n
        return durations, ends

    def cache_size(self) -> int:
        """Distinct shapes priced so far (all parts)."""
        return (len(self._tok) + len(self._dtok) + len(self._seq) + len(self._ctx) + len(self._gen) + len(self._p2p)
                + len(self._mx) + len(self._exp) + len(self._tg) + len(self._qk) + len(self._fg) + len(self._wide))


def attention_shapes(db: Any) -> str:
    """The (KV heads per GPU, head_dim, window) the database's decode-attention table measured."""
    import aiconfigurator_core.sdk.operations as ops
    try:
        ops.GenerationAttention.load_data(db)
        table = db._generation_attention_data
        shapes = {(kv, d, w) for by_kv in table.values() for kv, by_d in by_kv.items()
                  for d, by_w in by_d.items() for w in by_w}
    except Exception:  # the listing is a courtesy; the error stands without it
        return ""
    return ", ".join(f"({kv or 'MHA'}, {d}, {w})" for kv, d, w in sorted(shapes))


_DATABASES: dict[tuple[str, str, str, bool], Any] = {}


def _nested_op(graph: str, name: str) -> str:
    """The op called `name` of an aic op list (JSON), looked for inside Overlap groups too, as a one-op list."""
    def walk(entries: list) -> Any:
        for entry in entries:
            (kind, fields), = entry.items()
            if fields.get("name") == name:
                return entry
            if kind == "Overlap":
                hit = walk(fields["group_a"] + fields["group_b"])
                if hit is not None:
                    return hit
        return None
    hit = walk(json.loads(graph))
    if hit is None:
        raise AicError("model", f"no op {name!r} in the step graph")
    return json.dumps([hit])


def _load(pdb: Any, system: str, backend: str, version: str, pinned: bool = False) -> Any:
    """aic's PerfDatabase for (system, backend, version), loaded once per process. pinned: a version outside aic's
    queryable slots (its 'current' / 'next'), read as collected: aic's allow_unlisted_version, and its shared layer
    (rows filled in from sibling versions) off, so every answer is that version's own measurement."""
    key = (system, backend, version, pinned)
    db = _DATABASES.get(key)
    if db is None:
        import logging
        # aic logs every low-fidelity fallback table it loads at WARNING; a study's log is not the place.
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        db = (pdb.get_database(system, backend, version, allow_unlisted_version=True, shared_layer=False) if pinned
              else pdb.get_database(system, backend, version))
        if db is None:
            raise AicError("aic_version", f"aiconfigurator-core could not load its {backend} {version} "
                           f"database for {system}")
        _DATABASES[key] = db
    return db


def linear_attention_refusal(model: ModelSpec, system: str, backend: str) -> str:
    """Why a Gated DeltaNet hybrid is not priced here, naming the database's own tables for it."""
    from twinserve.backends.sim.aic_models import aic_model_configs_dir
    root = aic_model_configs_dir()
    folder = root.parent / "systems" / "data" / system / "linear_attention" / backend if root else None
    have = sorted(p.parent.name for p in folder.glob("*/gdn_perf.parquet")) if folder and folder.is_dir() else []
    where = (f"aiconfigurator-core has gdn_perf timings for {system} {backend} {', '.join(have)}"
             if have else f"aiconfigurator-core has no gdn_perf timings for {system} {backend}")
    return (f"{model.name} has {model.num_linear_layers} Gated DeltaNet (linear-attention) layers, which "
            f"twinserve's aic step graph does not price yet ({where}); use cost_model = \"roofline\"")
