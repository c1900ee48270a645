"""One step's operations for a ModelSpec, as aiconfigurator-core op objects, grouped by how they are queried.

The layer is aic's own (sdk/models/llama.py, moe.py and deepseek.py lay it out the same way): per
layer two add-norms, the attention projections (GQA's QKV and output GEMMs; MLA's down, q-up,
kv-up and output GEMMs), the dense MLP (gate/up, activation, down) or aic's MoE block (router,
shared experts, dispatch, experts, combine), two all-reduces under TP on dense layers (an MoE
layer's dispatch and combine stand for them, as in aic's MOEModel); the embedding (and its
all-reduce) once; the LM head over one row per sequence; the pipeline hand-offs. Attention is split
into full and sliding-window layers; a DeepSeek Sparse Attention model's (GLM-5, DeepSeek-V3.2) whole
attention block is aic's DSA module (its DeepSeekV32Model).

A decode-only step is priced from a second token list, aic's generation graph: for the MLA MoE
models (aic's DeepSeek family: DeepSeek-V3/R1, Kimi-K2.5, GLM-5; models/deepseek.py) the shared
experts run beside the routed ones on a second CUDA stream (aic's OverlapOp: the slower of the
two), as the engines do when they replay a decode step's CUDA graph; a step with prefill tokens
runs them one after the other. The same family routes tokens by a power law of exponent 1.01 (aic's
DeepSeekModel; MOEModel's other families 1.2), and on vLLM pays two TP all-reduces on every layer
beside its MoE dispatch and combine (aic's `*_tp_allreduce`, vLLM only). A MoE-TP layout whose expert
table has no rows is priced at the EP layout over the same GPUs (moe_compute_layout). A model whose q / k
RMSNorm spans the whole projection (MiniMax-M2) adds one small all-reduce a layer under attention TP on vLLM and
SGLang (qk_norm_allreduce), which aic's own MOEModel leaves out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from twinserve.backends.sim.catalog import ModelSpec, sixteen_bit_mtp_draft
from twinserve.backends.sim.parallel import Parallelism

from twinserve.backends.sim.aic.mapping import evaluator


@dataclass(slots=True)
class StepGraph:
    """aic op lists (as the engine's JSON) of one model on one GPU, by query shape."""

    tokens: str            # linear layers, norms, MoE, all-reduces: x = one rank's tokens (a step with prefill)
    decode_tokens: str     # the same for a decode-only step (aic's generation graph: shared experts overlap)
    logits: str            # the LM head: x = one rank's sequences
    p2p: str               # a pipeline stage's hand-off: x = a micro-batch's tokens ('' at PP 1)
    context_attn: str      # batch_size = chunks, s = new tokens, prefix = cached tokens
    generation_attn: str   # batch_size = rows, s = K/V length
    names: tuple[str, ...]  # every op's name, for reports
    qk_norm_ar: str = ""    # the q / k norm's all-reduce (qk_norm_allreduce), x = max(tokens, QK_NORM_AR_MIN_TOKENS)
    # A wide-EP block whose all-to-all another system's tables price (split_wide_ep_a2a): its Overlap taken out of
    # tokens / decode_tokens and kept in parts, each x = one rank's tokens: the routed side less the all-to-all
    # (router, expert compute), the shared expert, and the all-to-all (prepare, dispatch, combine). '' otherwise.
    wide_routed: str = ""
    wide_shared: str = ""
    wide_a2a: str = ""


# The engines whose MiniMax-M2 attention all-reduces the q / k norm's partial variances every layer under TP:
# vLLM (model_executor/models/minimax_m2.py: MiniMaxText01RMSNormTP.forward_qk, q's and k's fp32 variances
# concatenated into one tensor_model_parallel_all_reduce) and SGLang (models/minimax_m2.py: MiniMaxM2RMSNormTP over
# the attention TP group). TensorRT-LLM is not known to run this model here, so nothing is assumed for it.
QK_NORM_ALLREDUCE_BACKENDS = frozenset({"vllm", "sglang"})
# That all-reduce's message per token in the 16-bit elements aic's all-reduce tables are keyed by: two fp32
# variances (q's and k's), 8 bytes.
QK_NORM_AR_ELEMENTS = 4
# aic's custom all-reduce tables start at 128-element messages (message_size in every
# systems/data/*/comm/*/*/custom_allreduce_perf.parquet this package ships); below that its lookup extrapolates
# towards zero (4 elements priced at ~1/60 of the 128-element latency). A smaller message is priced at the
# smallest measured one, the latency floor: at least 128 / QK_NORM_AR_ELEMENTS tokens.
AR_TABLE_MIN_ELEMENTS = 128
QK_NORM_AR_MIN_TOKENS = AR_TABLE_MIN_ELEMENTS // QK_NORM_AR_ELEMENTS


def moe_power_law_alpha(model: ModelSpec) -> float:
    """The exponent of aic's power-law routing for this model: 1.01 for its DeepSeek family (the MLA
    MoE models: DeepSeekModel, DeepSeekV32Model for GLM-5, KIMIK25), 1.2 for MOEModel (models/moe.py)."""
    return 1.01 if model.is_mla else 1.2


def aic_moe_parallelism(model: ModelSpec, par: Parallelism) -> Parallelism:
    """The layout aic's MoE ops are queried at: `par`, but where redundant experts make the EP one that does
    not divide the model's experts (SGLang's EPLB: 256 experts + 32 over EP 48), the largest EP below it that
    does, with the attention DP scaled alike (dp x ep' / ep), so each rank routes the same tokens x top-k / ep.

    aic's MoE tables are keyed by the logical expert count and EPs that divide it (gb200 / gb300 SGLang 0.5.14:
    256 experts at EP 1, 2, ..., 256), so the query keeps the logical count and the per-rank token load; the
    EP' rank holds E / ep' experts, more than the (E + R) / ep physical ones, as a replica-holding GPU does
    (EP 48: 8 against 6; EP 24: 16 against 12), and its all-to-all runs over ep' ranks."""
    ep, e = par.expert_parallel_size, model.num_experts
    if not par.redundant_experts or not model.is_moe or e % ep == 0:
        return par
    tp, dp = par.tensor_parallel_size, par.data_parallel_size
    for ep2 in range(ep - 1, 0, -1):
        if e % ep2 == 0 and (dp * ep2) % ep == 0 and (tp * dp * ep2 // ep) % ep2 == 0:
            return replace(par, data_parallel_size=dp * ep2 // ep, expert_parallel_size=ep2, redundant_experts=0)
    return par  # no smaller layout keeps the load: aic's own error names the missing table


def moe_compute_layout(database: Any, model: ModelSpec, par: Parallelism, quant: Any, dist: str) -> tuple[int, int]:
    """(moe_tp, moe_ep) that aic's expert-compute op (its MoE table) is queried at: the layout's own, or, where
    the table holds no timings for a MoE-TP layout but holds the pure-EP layout over the same GPUs
    (moe_tp 1, moe_ep = moe_tp x moe_ep), that one. The dispatch and combine keep the layout's own sizes.

    Why: aic's TensorRT-LLM collector skips every MoE-TP shard whose intermediate size is not a multiple
    of 256 / weight bits (collector/trtllm/collect_moe.py, after a CUTLASS TLLM_CHECK), so gpt-oss's 2880
    (64-aligned at 4 bits) has MXFP4 rows at moe_tp 1 only (EP 1..128). TensorRT-LLM itself serves
    moe_tp = tp by default (tensorrt_llm/mapping.py: no ep_size gives moe_tp_size = tp, moe_ep_size = 1)
    and pads each MXFP4 shard up to its weight alignment before sharding (_torch/modules/fused_moe/
    quantization.py, _get_weight_alignment: 2880 at TP 4 is 768 a shard). vLLM's tables hold the TP
    layouts, so no vLLM query moves.

    The EP layout does the same expert work a GPU: at moe_tp n a GPU runs all E experts at 1/n of the
    intermediate size over the step's T x k routed rows; at moe_ep n, E / n experts at the full size over
    about T x k / n rows, the same FLOPs and the same expert weight bytes. It is not the same kernel
    work: aic times an EP layout on its most-loaded rank (the collector's power-law routing puts the
    heaviest EP group on rank 0, collector/helper.py), where a TP shard has no straggler, and TP's padding
    (720 -> 768 at TP 4) is not in the EP row. vLLM 0.24.0's tables, which hold both layouts of gpt-oss's
    experts, put EP n at 0.6-1.4x TP n's time on B200 and 1.0-2.1x on H200 (n = 2, 4, 8; 1-8192 tokens),
    so the stand-in may price such layouts' experts high, more so on Hopper; on the development rows it
    did not (docs/validate-rows.md, "gpt-oss's MXFP4 experts"). No correction is applied.
    """
    mtp, ep, dp = par.moe_tensor_parallel_size, par.expert_parallel_size, par.data_parallel_size
    if mtp == 1:
        return mtp, ep
    m = model
    if _moe_priced(database, m, mtp, ep, dp, quant, dist) or not _moe_priced(database, m, 1, mtp * ep, dp,
                                                                               quant, dist):
        return mtp, ep  # the table's own layout, or nothing better: aic's error names the missing key
    return 1, mtp * ep


def _moe_priced(database: Any, m: ModelSpec, mtp: int, ep: int, dp: int, quant: Any, dist: str) -> bool:
    """Whether aic's MoE table prices the expert compute at this layout (one query through its engine)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.engine import build_ops_json
    op = ops.MoE("probe_moe", 1, m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts,
                 mtp, ep, quant, dist, dp)
    try:
        evaluator(database)(build_ops_json([op]), is_context=True, batch_size=1, s=1, x=16)
    except Exception:  # aic's PerfDataNotAvailableError and kin: no timings at this key
        return False
    return True


def moe_stand_in_hidden(database: Any, m: ModelSpec, mtp: int, ep: int, dp: int, quant: Any, dist: str) -> int:
    """The hidden size whose MoE rows price this model's experts: its own where aic's MoE table holds them at
    this layout and quant mode, else the nearest hidden size the table holds at the same experts, top-k,
    intermediate size and layout (_moe_ops then scales the op's layers by hidden / that).

    Why: NVIDIA's NVFP4 DeepSeek checkpoints keep the MTP layer in bfloat16 (catalog.NVFP4_16BIT_MTP), and
    aic's bfloat16 MoE tables (aiconfigurator-core 0.12.0: TensorRT-LLM 1.3.0rc20 on B200 / B300 / GB200 /
    GB300, SGLang 0.5.14 on B200 / GB200) hold 256 experts at top-8 and intermediate 2048 for hidden 4096
    and 6144, not DeepSeek's 7168. At the same tokens, experts and top-k every expert runs the same rows;
    both its GEMMs (rows x hidden -> 2 x intermediate, rows x intermediate -> hidden) do FLOPs and read
    weights in proportion to hidden, so the time is taken as the nearest shape's times hidden / its hidden.
    What does not scale (launches, routing) makes that an upper bound; aic's own NVFP4 rows at hidden 7168
    and 6144 on B200 run 1.1-1.8x apart, not 1.17x, so it is an estimate of the shape, not a measurement.
    Nothing is fitted. Only such a draft (catalog.sixteen_bit_mtp_draft) takes a stand-in: any other model, and a
    draft where nothing is held, keeps its own hidden size, so aic's error names the missing key."""
    h = m.hidden_size
    if not sixteen_bit_mtp_draft(m) or _moe_priced(database, m, mtp, ep, dp, quant, dist):
        return h
    held = sorted(_moe_hiddens(database, quant, m.num_experts_per_tok, m.num_experts, m.moe_intermediate_size),
                  key=lambda x: (abs(x - h), -x))
    return next((x for x in held if _moe_priced(database, replace(m, hidden_size=x), mtp, ep, dp, quant, dist)),
                h)


def _moe_hiddens(database: Any, quant: Any, topk: int, experts: int, inter: int) -> list[int]:
    """The hidden sizes aic's MoE table holds at `quant` for this expert count, top-k and intermediate size,
    any routing distribution (its engine table view: quant -> distribution -> top-k -> experts -> hidden ->
    intermediate -> ...; a kernel_source lane's modes one level down). Cached on the database object."""
    memo = database.__dict__.setdefault("_twinserve_moe_hiddens", {})
    key = (quant.name, topk, experts, inter)
    if key not in memo:
        from aiconfigurator_core.sdk.engine_table_view import _probe_engine_handle
        raw = _probe_engine_handle(database)._engine.table_view_json("_moe_data")
        top = json.loads(raw) if raw else {}
        nodes = [top[quant.name]] if quant.name in top else [v[quant.name] for v in top.values()
                                                                if isinstance(v, dict) and quant.name in v]
        found: set[int] = set()
        for node in nodes:
            for per_dist in node.values():
                shapes = per_dist.get(str(topk), {}).get(str(experts), {}) if isinstance(per_dist, dict) else {}
                found.update(int(x) for x, inters in shapes.items() if str(inter) in inters)
        memo[key] = sorted(found)
    return memo[key]


# aic's large-EP all-to-all for TensorRT-LLM's WIDEEP MoE backend: the only TensorRT-LLM comm backend its Blackwell
# tables price for NVFP4 decode (its comm/trtllm 1.3.0rc10 trtllm_alltoall table: NVLinkTwoSided prepare, dispatch,
# combine and the low-precision combine; NVLinkOneSided has no low-precision combine rows, which aic's
# communication_dtype_for asks for an NVFP4 generation combine).
TRTLLM_WIDE_EP_A2A = "nvlink_two_sided"


def _wide_ep_generation_ops(model: ModelSpec, par: Parallelism, modes: dict[str, Any], database: Any) -> list:
    """aic's TensorRT-LLM large-EP (WIDEEP) MoE block of a decode step: router GEMM, the NVLink all-to-all's
    prepare / dispatch / combine, its wide-EP expert compute (aic's wideep_compute_cutlass table), the shared
    expert beside the routed one (aic's OverlapOp) and the reduce-add (aiconfigurator_core sdk/models/blocks/
    moe.py build_moe_block_ops, the emission aic's DeepSeekModel uses when its enumerator sets a generation
    moe_comm_backend; models/deepseek.py `_large_ep_moe_ops`).

    Experts the wide-EP table holds no rows for (it is NVFP4 only: FP8 block-scaled experts, which TensorRT-LLM
    runs on DEEPGEMM under ConfigurableMoE with TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED): aic's generation
    block (_moe_ops) with its fused dispatch pair replaced by the same NVLink all-to-all (nvlink_a2a_ops), the
    experts aic's MoE table's."""
    from aiconfigurator_core.sdk import common
    if modes["moe"] is not common.MoEQuantMode.nvfp4:
        return _moe_ops(model, par, modes, "trtllm", "generation", database, moe_a2a=TRTLLM_WIDE_EP_A2A)
    from aiconfigurator_core.sdk.config import ModelConfig
    from aiconfigurator_core.sdk.models.blocks.moe import MoEBlockShape, build_moe_block_ops
    from aiconfigurator_core.sdk.models.helpers import power_law_distribution
    m = model
    gpn = int(database.system_spec["node"]["num_gpus_per_node"])
    cfg = ModelConfig(tp_size=par.tensor_parallel_size, attention_dp_size=par.data_parallel_size,
                      moe_tp_size=par.moe_tensor_parallel_size, moe_ep_size=par.expert_parallel_size,
                      gemm_quant_mode=modes["gemm"], moe_quant_mode=modes["moe"],
                      moe_comm_backend={"generation": TRTLLM_WIDE_EP_A2A}, num_gpus_per_node=gpn)
    cfg.system = database.system
    shape = MoEBlockShape(hidden_size=m.hidden_size, moe_inter_size=m.moe_intermediate_size,
                          topk=m.num_experts_per_tok, num_experts=m.num_experts,
                          num_shared_experts=m.num_shared_experts, num_moe_layers=m.num_moe_layers)
    dist = power_law_distribution(cfg.workload_distribution, moe_power_law_alpha(m))
    return build_moe_block_ops("generation", shape, cfg, modes["moe"], dist, scale_factor=m.num_moe_layers,
                               backend_name="trtllm", inference_phase="generation", model_family="DEEPSEEK",
                               gpus_per_node=gpn)


# The system whose TensorRT-LLM NVLink all-to-all tables price a wide-EP decode block on a system aic holds none
# for: a cross-system proxy. aic 0.12's GB300 TensorRT-LLM comm tables hold only DeepEP (comm/trtllm/1.3.0rc11
# moe_a2a_perf: DeepEP high-throughput / low-latency at EP 4) and no NVLinkTwoSided table; GB200's hold it
# (comm/trtllm/1.3.0rc10 trtllm_alltoall_perf). aic's own system files give the two the same NVLink 5 figures
# (systems/gb200.yaml and gb300.yaml: intra_node_bw and inter_node_bw 900 GB/s a GPU each way, 4 GPUs a node,
# one NVL72 NVLink domain), and the all-to-all moves the same bytes (DeepSeek-R1's hidden size, top-k, NVFP4
# dispatch, low-precision combine) on both. The expert compute stays the system's own (GB300 holds its wide-EP
# NVFP4 table, moe/trtllm/1.3.0rc10 wideep_moe_perf).
WIDE_EP_A2A_PROXY = {"gb300": "gb200"}


def split_wide_ep_a2a(graph: StepGraph) -> StepGraph:
    """The graph with its wide-EP block's Overlap (both graphs hold the same one: a decode worker's) taken out of
    tokens / decode_tokens and kept in parts (StepGraph.wide_routed / wide_shared / wide_a2a), so the all-to-all
    can be priced on another database and the Overlap put back as aic prices it: max(routed side, shared side)."""
    def parts(js: str) -> tuple[list, dict]:
        rest, ovs = [], []
        for entry in json.loads(js):
            (ovs if next(iter(entry)) == "Overlap" else rest).append(entry)
        if len(ovs) != 1:
            raise ValueError(f"a wide-EP graph holds one MoE Overlap, not {len(ovs)}")
        return rest, ovs[0]["Overlap"]
    tok_rest, ov = parts(graph.tokens)
    dec_rest, dec_ov = parts(graph.decode_tokens)
    if dec_ov != ov:
        raise ValueError("the token and decode graphs of a wide-EP worker hold different MoE blocks")
    a2a = [p for p in ov["group_a"] if next(iter(p)) == "MoeAllToAll"]
    routed = [p for p in ov["group_a"] if next(iter(p)) != "MoeAllToAll"]
    return replace(graph, tokens=json.dumps(tok_rest), decode_tokens=json.dumps(dec_rest),
                   wide_routed=json.dumps(routed), wide_shared=json.dumps(ov["group_b"]), wide_a2a=json.dumps(a2a))


def nvlink_a2a_ops(model: ModelSpec, par: Parallelism, modes: dict[str, Any], database: Any) -> tuple[list, list]:
    """A decode step's TensorRT-LLM NVLink two-sided all-to-all as aic's large-EP block lays it out (sdk/models/
    blocks/moe.py `_large_ep_block_ops`: MoEAllToAll prepare and dispatch before the experts, combine after;
    the comm span nodes_for(moe_ep, num_gpus_per_node); each phase's wire dtype from aic's
    communication_dtype_for: FP8 block-scaled experts move FP8 in every phase)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.operations.moe_comm import communication_dtype_for, nodes_for
    ep, L = par.expert_parallel_size, model.num_moe_layers
    gpn = int(database.system_spec["node"]["num_gpus_per_node"])
    kw = dict(comm_backend=TRTLLM_WIDE_EP_A2A, hidden_size=model.hidden_size, topk=model.num_experts_per_tok,
              num_experts=model.num_experts, moe_ep_size=ep, node_num=nodes_for(ep, gpn), sms=0, attention_tp_size=1)

    def a2a(phase: str) -> Any:
        dtype = communication_dtype_for(system=database.system, comm_backend=TRTLLM_WIDE_EP_A2A,
                                        model_quantization=modes["moe"], communication_phase=phase,
                                        inference_phase="generation")
        return ops.MoEAllToAll(f"generation_moe_{phase}", L, phase=phase, comm_dtype=dtype, **kw)
    return [a2a("prepare"), a2a("dispatch")], [a2a("combine")]


# The MoE all-to-all of a worker's steps (EngineConfig.aic_moe_a2a): aic's MoEDispatch for the backend, DeepEP
# low-latency on a decode-only step ('deepep_ll'), or DeepEP normal mode on a step with prefill ('deepep_normal').
MOE_A2A = ("default", "deepep_ll", "deepep_normal")

# SGLang's DeepEP normal-mode SM budget where the launch names no DeepEP config of its own: aic's
# ModelConfig.sms default (aiconfigurator_core sdk/config.py `sms: int = 20`), the key aic's large-EP path
# passes to its deepep_ht table; DeepEP's own default is 20 too (deepseek-ai/DeepEP deep_ep/buffer.py
# `Buffer.num_sms = 20`). The srt-slurm prefill recipes pass `deepep-config: /configs/deepep_config.json`,
# whose content is not in the recipes (not read): the default stands.
DEEPEP_NORMAL_SMS = 20


def deepep_ll_ops(model: ModelSpec, par: Parallelism, database: Any) -> tuple[Any, Any]:
    """A decode step's DeepEP low-latency dispatch and combine, as aic's large-EP path prices them: its
    MoEAllToAll over the `deepep_ll` comm tables (aiconfigurator_core sdk/models/blocks/moe.py
    `_large_ep_block_ops`; sdk/operations/moe_comm.py MOE_A2A_BACKENDS: SGLang / vLLM, generation only),
    one rank's tokens, the comm span `nodes_for(moe_ep x moe_tp, num_gpus_per_node)` nodes, no dtype axis
    ('default'), no SM budget (low-latency mode).

    What it stands for: SGLang's `--moe-a2a-backend deepep --deepep-mode low_latency` decode workers (each
    token goes to the ranks holding its top-k experts; sglang srt/layers/moe/token_dispatcher/deepep.py),
    where aic's MoEDispatch for SGLang prices a collective over every attention rank's tokens, so it grows
    with the whole worker's batch (GB200 NVFP4, SGLang 0.5.14, 128 tokens a rank: 126 us a layer at attention
    DP 32, 92 us at DP 8; aic's deepep_ll dispatch: 27 us).
    aic's tables (gb200 / gb300 / b200 / h200, SGLang 0.5.12) are keyed by tokens a rank, hidden size, top-k
    and experts at one node; aic reads them at any node span (its own large-EP path queries EP 32 on GB200
    at 8 nodes of 4 and gets the same rows)."""
    return _deepep_a2a_ops(model, par, database, "deepep_ll", "generation", sms=0, attention_tp=1)


def deepep_normal_ops(model: ModelSpec, par: Parallelism, database: Any) -> tuple[Any, Any]:
    """A step with prefill's DeepEP normal-mode dispatch and combine, as aic's large-EP path prices a context
    step under SGLang's DeepEP (aiconfigurator_core sdk/models/blocks/moe.py `_large_ep_block_ops`, comm
    backend `deepep_ht`; sdk/operations/moe_comm.py MOE_A2A_BACKENDS: SGLang / vLLM, context only): its
    MoEAllToAll over the `deepep_ht` tables (gb200 / gb300 SGLang 0.5.12 wideep_deepep_normal_perf, keyed by
    one rank's tokens, hidden size, top-k, experts and the SM budget, one node), the comm span
    `nodes_for(moe_ep x moe_tp, num_gpus_per_node)`, `attention_tp_size` the attention TP (its context
    sites' token divisor), the SM budget DEEPEP_NORMAL_SMS.

    What it stands for: SGLang's `--moe-a2a-backend deepep --deepep-mode normal` prefill workers (sglang
    srt/layers/moe/token_dispatcher/deepep.py, the normal dispatcher's high-throughput kernels)."""
    return _deepep_a2a_ops(model, par, database, "deepep_ht", "context", sms=DEEPEP_NORMAL_SMS,
                           attention_tp=par.tensor_parallel_size)


def _deepep_a2a_ops(model: ModelSpec, par: Parallelism, database: Any, backend: str, phase: str, *, sms: int,
                    attention_tp: int) -> tuple[Any, Any]:
    """aic's MoEAllToAll dispatch and combine over one DeepEP comm table (`backend`: deepep_ll / deepep_ht) for
    one phase, the comm span nodes_for(moe_ep x moe_tp, num_gpus_per_node); refused (AicError) without experts
    split over EP > 1, with MoE TP, or with an EP that does not divide the experts (aic's feasibility)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.operations.moe_comm import nodes_for
    from twinserve.backends.sim.aic.mapping import AicError
    mode = "deepep_ll" if backend == "deepep_ll" else "deepep_normal"
    mtp, ep = par.moe_tensor_parallel_size, par.expert_parallel_size
    if not model.is_moe or mtp != 1 or ep < 2 or model.num_experts % ep:
        raise AicError("aic_moe_a2a", f"aic_moe_a2a '{mode}' needs experts split over EP > 1 with no MoE TP "
                       f"and EP dividing the experts (aic's {backend} feasibility); {model.name} here has "
                       f"moe_tp {mtp}, moe_ep {ep}, {model.num_experts} experts")
    nodes = nodes_for(ep * mtp, int(database.system_spec["node"]["num_gpus_per_node"]))
    L = model.num_moe_layers
    kw = dict(comm_backend=backend, hidden_size=model.hidden_size, topk=model.num_experts_per_tok,
              num_experts=model.num_experts, moe_ep_size=ep, node_num=nodes, sms=sms, attention_tp_size=attention_tp)
    return (ops.MoEAllToAll(f"{phase}_moe_dispatch", L, phase="dispatch", comm_dtype="default", **kw),
            ops.MoEAllToAll(f"{phase}_moe_combine", L, phase="combine", comm_dtype="default", **kw))


def deepep_expert_op(database: Any, model: ModelSpec, par: Parallelism, quant: Any, dist: str,
                     phase: str = "generation") -> Any | None:
    """The routed experts of a DeepEP low-latency decode step as aic's large-EP path prices them: MoEExpertCompute
    over SGLang's wide-EP generation MoE table (kernel_source 'deepepmoe': the expert kernel behind SGLang's DeepEP
    dispatcher, e.g. gb200 SGLang 0.5.10 wideep_generation_moe_perf, FP8 block-scaled, EP 2-256 but 8), at one
    rank's tokens times the attention ranks, as aic's MoE op; None where that table has no row for this quant /
    EP (NVFP4: none; those experts keep aic's MoE table). With phase 'context', the context table
    (wideep_context_moe_perf, FP8 block-scaled, EP 2, 4, 16-256: no EP 8; aic does not interpolate across EP,
    it raises PerfDataNotAvailableError, so an EP 8 worker keeps aic's MoE table).

    The same layout's MoE table prices a different kernel: GB200 SGLang 0.5.14, FP8 block-scaled, EP 32, 128
    tokens a rank: 917 us a layer against the DeepEP expert table's 159 us, 256 tokens: 1,655 against 168."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.engine import build_ops_json
    m, ep, dp = model, par.expert_parallel_size, par.data_parallel_size
    op = ops.MoEExpertCompute(f"{phase}_moe", m.num_moe_layers, hidden_size=m.hidden_size,
                              inter_size=m.moe_intermediate_size, topk=m.num_experts_per_tok,
                              num_experts=m.num_experts, moe_ep_size=ep, quant_mode=quant,
                              workload_distribution=dist, attention_dp_size=dp, inference_phase=phase,
                              num_slots=None, is_gated=True, enable_eplb=False)
    try:
        evaluator(database)(build_ops_json([op]), is_context=True, batch_size=1, s=1, x=16)
    except Exception:  # aic's PerfDataNotAvailableError and kin: no timings at this key
        return None
    return op


def _moe_ops(model: ModelSpec, par: Parallelism, modes: dict[str, Any], backend: str, phase: str,
             database: Any, wide_ep: bool = False, moe_a2a: str = "default") -> list:
    """aic's MoE block (router GEMM, shared experts, dispatch + experts + combine) for one phase; with
    `wide_ep` (TensorRT-LLM's WIDEEP backend), a decode step's is aic's large-EP block; a generation
    block's dispatch and combine are DeepEP low-latency ones where moe_a2a is 'deepep_ll' (a context block's
    DeepEP normal-mode ones where it is 'deepep_normal'), and its experts the DeepEP expert table's where it
    has this layout (deepep_expert_op); TensorRT-LLM's NVLink two-sided ones where it is 'nvlink_two_sided'
    (nvlink_a2a_ops, _wide_ep_generation_ops' FP8 block), the experts aic's MoE table's."""
    if wide_ep and phase == "generation":
        return _wide_ep_generation_ops(model, par, modes, database)
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.config import ModelConfig
    from aiconfigurator_core.sdk.models.blocks.moe import MoEBlockShape, build_moe_block_ops
    from aiconfigurator_core.sdk.models.helpers import power_law_distribution
    cfg = ModelConfig(tp_size=par.tensor_parallel_size, attention_dp_size=par.data_parallel_size,
                      moe_tp_size=par.moe_tensor_parallel_size, moe_ep_size=par.expert_parallel_size,
                      gemm_quant_mode=modes["gemm"], moe_quant_mode=modes["moe"])
    m, L = model, model.num_moe_layers
    dist = power_law_distribution(cfg.workload_distribution, moe_power_law_alpha(m))
    h, tp, inter, q = m.hidden_size, par.tensor_parallel_size, m.moe_intermediate_size, modes["moe"]
    mtp, ep, dp = par.moe_tensor_parallel_size, par.expert_parallel_size, par.data_parallel_size
    k, e = m.num_experts_per_tok, m.num_experts
    cmtp, cep = moe_compute_layout(database, m, par, q, dist)  # the experts' table layout
    # The experts' hidden size in aic's table and the layers' scale at it (moe_stand_in_hidden).
    sh = moe_stand_in_hidden(database, m, cmtp, cep, dp, q, dist)
    sL = L * h / sh
    a2a = (deepep_ll_ops(m, par, database) if moe_a2a == "deepep_ll" and phase == "generation" else
           deepep_normal_ops(m, par, database) if moe_a2a == "deepep_normal" and phase == "context" else
           nvlink_a2a_ops(m, par, modes, database) if moe_a2a == TRTLLM_WIDE_EP_A2A and phase == "generation"
           else None)
    experts = (deepep_expert_op(database, m, par, q, dist, phase) if a2a is not None and moe_a2a != TRTLLM_WIDE_EP_A2A
               else None)
    if moe_a2a == TRTLLM_WIDE_EP_A2A and not m.is_mla:
        raise ValueError("the NVLink all-to-all block is laid out for aic's DeepSeek (MLA) family only")
    if not (m.is_mla and phase == "generation"):
        shape = MoEBlockShape(hidden_size=m.hidden_size, moe_inter_size=m.moe_intermediate_size,
                              topk=m.num_experts_per_tok, num_experts=m.num_experts,
                              num_shared_experts=m.num_shared_experts, num_moe_layers=L)
        block = build_moe_block_ops(phase, shape, cfg, modes["moe"], dist, scale_factor=L,
                                    backend_name=backend, inference_phase=phase)
        if a2a is not None:  # the dispatch before the experts, the combine after them
            block = [(a2a[0] if "pre" in op._name else a2a[1]) if isinstance(op, ops.MoEDispatch) else op
                     for op in block]
        if experts is not None:
            return [experts if isinstance(op, ops.MoE) else op for op in block]
        if (cmtp, cep, sh) == (mtp, ep, h):
            return block
        return [ops.MoE(op._name, sL, sh, inter, k, e, cmtp, cep, q, dist, dp) if isinstance(op, ops.MoE) else op
                for op in block]
    # aic's DeepSeekModel generation span (models/deepseek.py): routed experts on the main stream,
    # shared experts on the auxiliary one, overlapped; its dispatches are generation-phase queries.
    # The router stays under DeepEP (the engine runs it; aic's own SGLang large-EP DeepSeek block drops it
    # for its legacy graphs' sake: blocks/moe.py `_deepseek_sglang_moe_block`).
    pre, post = a2a or (
        ops.MoEDispatch("generation_moe_pre_dispatch", L, h, k, e, mtp, ep, dp, True, quant_mode=q,
                        is_context=False, backend=backend),
        ops.MoEDispatch("generation_moe_post_dispatch", L, h, k, e, mtp, ep, dp, False, quant_mode=q,
                        is_context=False, backend=backend))
    pre, post = (pre if isinstance(pre, list) else [pre]), (post if isinstance(post, list) else [post])
    routed = [ops.GEMM("generation_router_gemm", L, e, h, common.GEMMQuantMode.bfloat16), *pre,
              experts or ops.MoE("generation_moe", sL, sh, inter, k, e, cmtp, cep, q, dist, dp), *post]
    if not m.num_shared_experts:
        return routed
    shared_inter = m.num_shared_experts * inter
    shared = [ops.GEMM("generation_shared_gate_up_gemm", L, 2 * shared_inter // tp, h, modes["gemm"]),
              ops.ElementWise("generation_shared_act_gate", L, 2 * shared_inter // tp, shared_inter // tp, 0.8),
              ops.GEMM("generation_shared_ffn2_gemm", L, h, shared_inter // tp, modes["gemm"])]
    return [ops.OverlapOp("generation_moe_overlap", group_a=routed, group_b=shared)]


def _mla_projections(m: ModelSpec, tp: int, gq: Any) -> list:
    """MLA's projections as aic's DeepSeek model lays them out (its granular path), at this model's sizes; at
    NVFP4 a projection the checkpoint keeps in 16 bits (ModelSpec.sixteen_bit_attention, from
    catalog.NVFP4_16BIT_ATTENTION: the declaration the weight bytes read too) is aic's bfloat16 GEMM, as aic's own
    DeepSeek model prices it (sdk/models/deepseek.py `_attn_mode`; the fused q_a + kv_a downscale only when both
    q and kv are kept)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    kept = m.sixteen_bit_attention if gq is common.GEMMQuantMode.nvfp4 else frozenset()
    bf16 = common.GEMMQuantMode.bfloat16
    h, n, L = m.hidden_size, m.num_heads // tp, m.num_layers
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    down = bf16 if {"q", "kv"} <= kept else gq
    out = [ops.GEMM("mla_downscale_gemm", L, m.q_lora_rank + latent if m.q_lora_rank else latent, h, down)]
    out.append(ops.GEMM("mla_q_proj_gemm", L, n * m.qk_head_dim, m.q_lora_rank or h, bf16 if "q" in kept else gq))
    out.append(ops.GEMM("proj_gemm", L, h, n * m.v_head_dim, bf16 if "o" in kept else gq, low_precision_input=True))
    return out


def dsa_architecture(m: ModelSpec) -> str:
    """aic's architecture name for a DeepSeek Sparse Attention model (its DSA tables are keyed by it),
    matched on the shapes aic's DSA_MODEL_DIMS lists; AicError naming them when none matches."""
    from aiconfigurator_core.sdk.operations.dsa import DSA_MODEL_DIMS
    from twinserve.backends.sim.aic.mapping import AicError
    ours = {"hidden_size": m.hidden_size, "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
            "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
            "v_head_dim": m.v_head_dim, "index_topk": m.index_topk, "index_head_dim": m.index_head_dim,
            "index_n_heads": m.index_n_heads}
    for arch, dims in DSA_MODEL_DIMS.items():
        if all(ours.get(k) == v for k, v in dims.items()):
            return arch
    have = "; ".join(f"{a} (hidden {d['hidden_size']}, index_n_heads {d['index_n_heads']})"
                     for a, d in DSA_MODEL_DIMS.items())
    raise AicError("model", f"{m.name} has DeepSeek Sparse Attention (index_topk {m.index_topk}) of a shape "
                   f"aiconfigurator-core has no DSA timings for; it has: {have}")


def dsa_gemm_mode(gemm: Any) -> Any:
    """The projection GEMMs' mode inside aic's DSA module tables (gemm_type: bfloat16 or fp8_block).

    The published FP8 DSA checkpoints are block-scaled (zai-org/GLM-5-FP8's and DeepSeek-V3.2's
    quantization_config: weight_block_size [128, 128]): fp8_block. NVIDIA's NVFP4 checkpoints keep the
    attention projections in 16 bits (nvidia/GLM-5-NVFP4's hf_quant_config excludes every
    self_attn q_a/q_b/kv_a/kv_b/o and indexer module): bfloat16."""
    from aiconfigurator_core.sdk import common
    g = common.GEMMQuantMode
    return g.fp8_block if gemm in (g.fp8, g.fp8_static) else gemm if gemm is g.fp8_block else g.bfloat16


def _attention(m: ModelSpec, tp: int, modes: dict[str, Any], backend: str, database: Any) -> tuple[list, list]:
    """Context and generation attention ops, one per attention kind (full, sliding window)."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.operations.attention import resolved_lane_order_for_op
    kvq, fmha = modes["generation_attention"], modes["fmha"]
    heads, layers = m.num_heads // tp, m.num_layers
    if m.is_mla and m.index_topk:
        # DeepSeek Sparse Attention (GLM-5, DeepSeek-V3.2): aic's DSA module tables price the whole
        # attention block per layer (its projections, the indexer and its top-k, the sparse MLA over
        # index_topk tokens, the absorbed BMMs), as aic's DeepSeekV32Model lays it out
        # (sdk/models/deepseek_v32.py). Every layer computes its own top-k (no index_topk_freq).
        arch, gq = dsa_architecture(m), dsa_gemm_mode(modes["gemm"])
        return ([ops.ContextDSAModule("context_attention", layers, heads, kvq, fmha, gq, architecture=arch,
                                      dsa_full_layer_fraction=1.0)],
                [ops.GenerationDSAModule("generation_attention", layers, heads, kvq, gq, architecture=arch,
                                         dsa_full_layer_fraction=1.0)])
    kv_b = []
    if m.is_mla:
        # Prefill attends over decompressed K/V (kv_b_proj over the chunk's tokens); decode absorbs
        # kv_b_proj into the query and reads the latent (aic's deepseek.py, both phases).
        kv_b = [ops.GEMM("mla_kv_b_proj_gemm", layers, heads * (m.qk_nope_head_dim + m.v_head_dim),
                         m.kv_lora_rank, modes["gemm"])]
    if m.is_mla and backend != "vllm":
        # SGLang and TensorRT-LLM run MLA kernels: aic's MLA tables, keyed by the native 128 heads' shard.
        return (kv_b + [ops.ContextMLA("context_attention", layers, 128 // tp, kvq, fmha)],
                [ops.MLABmm("generation_bmm_pre", layers, heads, modes["gemm"], if_pre=True),
                 ops.GenerationMLA("generation_attention", layers, 128 // tp, kvq),
                 ops.MLABmm("generation_bmm_post", layers, heads, modes["gemm"], if_pre=False)])
    # vLLM's MLA runs its standard attention with v_head_dim-wide heads (aic's deepseek.py, vLLM branch).
    d = m.v_head_dim if m.is_mla else m.head_dim
    kv_heads = m.num_kv_heads // tp if m.is_mla else m.kv_heads_per_gpu(tp)
    ctx_lanes = resolved_lane_order_for_op(database, "_context_attention_data", None)
    gen_lanes = resolved_lane_order_for_op(database, "_generation_attention_data", None)
    sliding = m.num_sliding_layers if m.sliding_window else 0
    ctx, gen = list(kv_b), []
    for n, window in ((layers - sliding, 0), (sliding, m.sliding_window)):
        if not n:
            continue
        c = ops.ContextAttention("context_attention", n, heads, kv_heads, kvq, fmha, window_size=window,
                                 head_size=d, use_qk_norm=m.qk_norm)
        c._lane_order = ctx_lanes  # the kernels this backend version runs, as aic's compile_engine resolves
        g = ops.GenerationAttention("generation_attention", n, heads, kv_heads, kvq, window_size=window,
                                    head_size=d, use_qk_norm=m.qk_norm)
        g._lane_order = gen_lanes
        ctx.append(c)
        gen.append(g)
    return ctx, gen


def build_graph(model: ModelSpec, par: Parallelism, modes: dict[str, Any], backend: str,
                database: Any, wide_ep: bool = False, moe_a2a: str = "default") -> StepGraph:
    """The op lists of one step of one pipeline stage (`model`: the stage's layers) on one GPU; `wide_ep`:
    the MoE block is TensorRT-LLM's WIDEEP one (_wide_ep_generation_ops) in both graphs (a decode worker's);
    moe_a2a: the MoE all-to-all (MOE_A2A): 'deepep_ll' the decode-only graph's, 'deepep_normal' the graph of a
    step with prefill's; the other graph keeps aic's MoEDispatch."""
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    m, tp = model, par.tensor_parallel_size
    h, d, layers = m.hidden_size, m.head_dim, m.num_layers
    gq = modes["gemm"]
    token_ops = [ops.Embedding("embedding", 1, m.vocab_size // tp, h, 0.3),
                 ops.ElementWise("add_norm_1", layers, 2 * h, 2 * h, 0.8)]
    if m.is_mla and m.index_topk:
        pass  # DSA: the attention block's projections are inside aic's DSA module (_attention)
    elif m.is_mla:
        token_ops += _mla_projections(m, tp, gq)
    else:
        heads, kv_heads = m.num_heads // tp, m.kv_heads_per_gpu(tp)
        token_ops += [ops.GEMM("qkv_gemm", layers, heads * d + 2 * kv_heads * d, h, gq),
                      ops.GEMM("proj_gemm", layers, h, heads * d, gq, low_precision_input=True)]
    token_ops.append(ops.ElementWise("add_norm_2", layers, 2 * h, 2 * h, 0.8))
    dense = layers - m.num_moe_layers
    if dense:
        inter = m.intermediate_size // tp
        token_ops += [ops.GEMM("gate_ffn1_gemm", dense, 2 * inter, h, gq),
                      ops.ElementWise("act_gate", dense, 2 * inter, inter, 0.8),
                      ops.GEMM("ffn2_gemm", dense, h, inter, gq, low_precision_input=True)]
    decode_ops = list(token_ops)
    if m.num_moe_layers:
        moe_par = aic_moe_parallelism(m, par)
        # A WIDEEP worker is a disaggregated decode worker: every step it runs is a generation step, an MTP
        # verify step (priced on the token graph) included, so both graphs carry the large-EP block.
        token_ops += _moe_ops(m, moe_par, modes, backend, "generation" if wide_ep else "context", database, wide_ep,
                              moe_a2a)
        decode_ops += _moe_ops(m, moe_par, modes, backend, "generation", database, wide_ep, moe_a2a)
    ars = [ops.CustomAllReduce("embedding_ar", 1, h, tp), ops.CustomAllReduce("ar_1", dense, h, tp),
           ops.CustomAllReduce("ar_2", dense, h, tp)]
    if m.is_mla and not m.index_topk and m.num_moe_layers and backend == "vllm":
        # aic's DeepSeekModel on vLLM: one all-reduce after the attention projection and one after the
        # MoE on every layer (its context_/generation_tp_allreduce, 2 x layers), beside the dispatches.
        ars.append(ops.CustomAllReduce("moe_layer_tp_allreduce", 2 * m.num_moe_layers, h, tp))
    token_ops += ars
    decode_ops += ars
    logits = ops.GEMM("logits_gemm", 1, m.vocab_size // tp, h, common.GEMMQuantMode.bfloat16)
    pp = par.pipeline_parallel_size
    p2p = build_ops_json([ops.P2P("p2p", 1, h, pp)]) if pp > 1 else ""
    ctx, gen = _attention(m, tp, modes, backend, database)
    names = tuple(dict.fromkeys(op._name for op in token_ops + decode_ops)) + ("logits_gemm",)
    qk_ar = ""
    if m.qk_norm_across_heads and tp > 1 and backend in QK_NORM_ALLREDUCE_BACKENDS:
        qk_ar = build_ops_json([ops.CustomAllReduce("qk_norm_allreduce", layers, QK_NORM_AR_ELEMENTS, tp)])
        names += ("qk_norm_allreduce",)
    return StepGraph(build_ops_json(token_ops), build_ops_json(decode_ops), build_ops_json([logits]), p2p,
                     build_ops_json(ctx), build_ops_json(gen), names, qk_ar)
