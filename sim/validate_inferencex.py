"""Prefill/decode worker counts and layouts of InferenceX's disaggregated runs, as a small declared table.

aiconfigurator-core's InferenceMAX dumps (`source_file=2026-03-25.csv` / `2026-04-06.csv`) give a
disaggregated row's prefill and decode TP but not how many workers of each ran, nor (reliably) their
attention-DP and expert layout: the decode worker's MoE EP is written as the prefill worker's, attention DP
as 1. InferenceX's own run matrix says both, per configuration and client count:
SemiAnalysisAI/InferenceX `.github/configs/nvidia-master.yaml` @0004cf5f2577a1c1007a9bed7cc7d55656519507
(https://github.com/SemiAnalysisAI/InferenceX/blob/0004cf5f2577a1c1007a9bed7cc7d55656519507/.github/configs/nvidia-master.yaml),
read through the library's code index. Each entry there names a client-count list, one prefill and one
decode worker shape (`num-worker`, `tp`, `ep`, `dp-attn`), and whether it ran multi-token prediction
(`spec-decoding: "mtp"`; the depth is the `mtpN` of the recipe file it launches, or for the SGLang entries its
decode worker's `speculative-num-steps`: SGLANG_MTP_STEPS).

What is stored here: only those fields, for the configurations below, in this module's own form. The
client-count lists of these configurations at that commit are exactly the concurrencies the dumps hold
for them (both dumps, or the one named in _ONLY_DUMP; tests/sim/test_validate_inferencex.py checks it),
which is what dates that commit's matrix to the rows. A row is matched
only when everything agrees: backend, system, precision, ISL/OSL, the client count in an entry's list, and
the row's own prefill TP, prefill EP and decode TP equal to the entry's (runs of an earlier matrix, e.g.
B200 FP8's prefill at EP 1 measured 2026-03-23, fail that check and keep the assumption). Where two or
more entries fit and disagree on the workers, none is used; where they agree on the workers but not on
MTP, the workers are used and MTP is unknown.

H200 and GB200 FP4 1k/8k TensorRT-LLM's entries are read from the srt-slurm recipes that file launches
(RECIPE_SOURCES): their own benchmark client counts are the dumps'. gpt-oss-120b's (GPTOSS_TABLE), Kimi-K2.5's and GLM-5's GB200 entries
(KIMI_TABLE, GLM5_TABLE: no matrix version the library holds has them) are read from recipes alone. Where the
entries that fit a row disagree on the workers but not on MTP, the depth still holds (agreed_mtp).

An entry's MTP depth runs as `draft_model = "mtp"` (sim/validate_recipes.set_mtp) up to
MTP_SIMULATED_MAX_CLIENTS clients; past them, an entry whose depth the file does not give, or entries that
disagree on MTP, it is recorded and not simulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from twinserve.sim.validate_twins import PLAIN_SIBLING

_SOURCE = "SemiAnalysisAI/InferenceX .github/configs/nvidia-master.yaml @0004cf5"
MTP_DEPTH_NOT_GIVEN = -1  # an MTP entry whose recipe gives no depth (the SGLang ones' is SGLANG_MTP_STEPS)
# A drafting batch used to step one step at a time: a disaggregated MTP row of 8,609 clients took 172 CPU s
# against 12.5 without drafts (B300 FP4 1k/1k, 2026-12-05). Its decodes now advance in windows and in the
# cluster's join steps (sim/spec_window.py), holding their accepted tokens as counts between the steps that read
# them (sim/spec_lazy.py LazyDrafts, 2026-12-06). Measured on the development studies of 1,025-2,560 clients whose
# entries ran MTP (docs/validate-speed.md, "MTP past 1,024 clients" and the LazyDrafts section): the 19 at OSL 1,024
# cost 61.6 CPU s capped and 134.2 s drafting (TPOT median |err| 56.3% -> 25.4%, TTFT 52.9% -> 59.0%), the 3 at
# OSL 8,192 (2,048-2,152 clients) ~6-9 s capped and 20-26 s drafting each (TPOT 69.0% -> 28.1%, TTFT 37.6% ->
# 35.5%). Past 2,560 clients drafting took TPOT the other way on the 3 studies of 3,226-4,968 clients
# (32.3% -> 40.6%) and the 1k/8k study of 8,192 clients had not finished in 15 minutes, so there the entry's MTP
# is recorded, not simulated. Every development row up to the evaluation's 128 clients drafts.
MTP_SIMULATED_MAX_CLIENTS = 2560
# SGLang's `--ep-num-redundant-experts` (EPLB replicas; SGLang's default 0) of the InferenceX DeepSeek-R1
# Dynamo-SGLang wide-EP decode workers whose EP does not divide the 256 experts: 32, which makes 288 physical
# experts, 6 a GPU at EP 48 and 12 at EP 24. The srt-slurm recipes nvidia-master.yaml's `config_file` names
# (NVIDIA/srt-slurm `recipes/gb200-fp8/1k1k/mid-curve.yaml`: decode tp/dp/ep 48; `recipes/gb200-fp8/8k1k/
# max_tpt.yaml`: 24; `recipes/gb200-fp4/1k1k/max-tpt.yaml` and `8k1k/mid-curve.yaml`: 48) all set
# `ep-num-redundant-experts: 32` on those decode workers (and on the EP 8 / EP 32 workers beside them, which
# divide 256 and are left at 0 here). The GB300 recipes were not in the library's index: the GB300 EP 24 / 48
# rows take the GB200 recipes' 32 (their worker shapes are the same), an assumption.
SGLANG_WIDE_EP_REDUNDANT_EXPERTS = 32


def redundant_experts(backend: str, num_experts: int, ep: int) -> int:
    """The redundant experts an InferenceX worker at this EP ran with: SGLANG_WIDE_EP_REDUNDANT_EXPERTS for an
    SGLang worker whose EP does not divide the model's experts, else 0 (a split that needs none)."""
    if backend == "sglang" and num_experts and ep > 1 and num_experts % ep:
        return SGLANG_WIDE_EP_REDUNDANT_EXPERTS
    return 0


# The MoE all-to-all of the InferenceX DeepSeek-R1 Dynamo-SGLang decode workers under attention DP on GB200 / GB300
# (NVL72): every such recipe read sets `moe-a2a-backend: deepep` and `deepep-mode: low_latency` on the decode
# worker (its prefill workers at attention DP run DeepEP's normal mode, not modelled here): NVIDIA/srt-slurm
# recipes/gb200-fp8/1k1k/mid-curve.yaml @eb889c0 (DEP 48), 1k1k/max-tpt.yaml @07fbab1 (DEP 32), 1k1k/ultra-tpt.yaml
# @07fbab1 (DEP 8), 8k1k/max_tpt.yaml @eb889c0 (DEP 24), 8k1k/mid-curve.yaml @eb889c0 (DEP 32);
# recipes/gb200-fp4/1k1k/mid-curve.yaml @07fbab1 (DEP 32), 1k1k/max-tpt.yaml @96f3442 (DEP 48),
# 8k1k/max-tpt.yaml @975f228 (DEP 32), 8k1k/mid-curve.yaml @eb889c0 (DEP 48); ishandhanani/srt-slurm
# recipes/gb300-fp4/1k1k/max_tpt.yaml @ab58651 (DEP 48), 8k1k/max_tpt.yaml @ab58651 (DEP 32),
# recipes/gb300-fp8/1k1k/stp/mid.yaml @ab58651 (DEP 32), 1k1k/stp/max.yaml @ab58651 (DEP 8), 8k1k/stp/max.yaml
# @f64d2b9 (DEP 24). The H200 and B200
# FP8 DEP 8 decode recipes read set no a2a backend (SGLang's default; qiching/srt-slurm @5063eb4
# recipes/h200/1k1k/bs256-1p6d-dep.yaml, recipes/b200-fp8/8k1k/stp/max-tpt-dep8-1p1d.yaml): they keep aic's
# MoEDispatch. GB200 / GB300 decode recipes not read (gb300-fp4 1k1k mid_curve, 8k1k mid_curve, gb300-fp8 8k1k
# stp/mid) take the same setting, as every one read has it. None of these decode workers sets `--enable-eplb` or
# `--init-expert-location`: their redundant experts sit where SGLang's trivial placement puts them, so aic's
# power-law routing (1.01 for DeepSeek) stands for their imbalance.
SGLANG_DEEPEP_LL_SYSTEMS = ("gb200", "gb300")


# Their FP8 prefill workers at attention DP x EP (DEP 8) run DeepEP's normal mode: `moe-a2a-backend: deepep`,
# `deepep-mode: normal` (prefill side of NVIDIA/srt-slurm recipes/gb200-fp8/1k1k/max-tpt.yaml @07fbab1,
# 8k1k/max_tpt.yaml @eb889c0; ishandhanani/srt-slurm recipes/gb300-fp8/1k1k/stp/mid.yaml @ab58651: tp 8, dp 8,
# ep 8, enable-dp-attention, disable-cuda-graph, chunked-prefill-size 131072, ep-num-redundant-experts 32,
# deepep-config /configs/deepep_config.json, no enable-eplb, no two-batch overlap). Priced as aic's context
# step under DeepEP: its deepep_ht dispatch / combine (backends/sim/aic/graph.py deepep_normal_ops) and its
# DeepEP context expert table where it has the EP (none at EP 8: those experts keep aic's MoE table). The FP4
# prefill workers at DEP 4 set no a2a backend (SGLang's default), `moe-runner-backend: flashinfer_cutlass` and
# `enable-single-batch-overlap` (NVIDIA/srt-slurm recipes/gb200-fp4/1k1k/mid-curve.yaml @07fbab1,
# ishandhanani/srt-slurm recipes/gb300-fp4/1k1k/max_tpt.yaml @ab58651): they keep aic's MoEDispatch.
# aic's DeepEP dispatch / combine timings (aiconfigurator-core's GB200 SGLang 0.5.14 database) start at EP 8: at
# EP 4 its queries fail ("moe_a2a data missing for deepep_ht/dispatch ... ep=4", and for deepep_ll/dispatch). The
# DEP 4 workers that ran DeepEP (normal on prefill, low latency on decode: ai-dynamo/dynamo
# gb200-fp8/disagg/1p_4d.sh @341b5df, sim/validate_recipes.py DUMP_LAYOUT_LAUNCHES) keep aic's MoEDispatch: their
# all-to-all is not priced as DeepEP's. Every DeepEP worker read before them is at EP 8 or more.
DEEPEP_MIN_EP = 8


def prefill_moe_a2a(backend: str, system: str, precision: str, attention_dp: int, moe_ep: int) -> str:
    """The aic_moe_a2a of an InferenceX disaggregated prefill worker: 'deepep_normal' for an SGLang FP8 one
    under attention DP with experts split at least DEEPEP_MIN_EP ways on GB200 / GB300
    (SGLANG_DEEPEP_LL_SYSTEMS), else 'default'."""
    if (backend == "sglang" and system in SGLANG_DEEPEP_LL_SYSTEMS and precision == "fp8" and attention_dp > 1
            and moe_ep >= DEEPEP_MIN_EP):
        return "deepep_normal"
    return "default"


def decode_moe_a2a(backend: str, system: str, attention_dp: int, moe_ep: int) -> str:
    """The aic_moe_a2a of an InferenceX disaggregated decode worker: 'deepep_ll' for an SGLang one under attention
    DP with experts split at least DEEPEP_MIN_EP ways on GB200 / GB300 (SGLANG_DEEPEP_LL_SYSTEMS), else
    'default'."""
    if backend == "sglang" and system in SGLANG_DEEPEP_LL_SYSTEMS and attention_dp > 1 and moe_ep >= DEEPEP_MIN_EP:
        return "deepep_ll"
    return "default"


# The InferenceMAX dumps whose rows this table is checked against (validate_protocol's InferenceX rows).
_DUMPS = ("source_file=2026-03-25.csv", "source_file=2026-04-06.csv")


@dataclass(slots=True, frozen=True)
class Shape:
    """One worker kind of an entry: how many, and each one's GPUs (tp), expert split (ep) and attention DP."""

    count: int
    tp: int
    ep: int
    dp_attn: bool

    def fields(self) -> tuple[int, int, int, int]:
        """(tp, attention_dp, moe_tp, moe_ep) over the worker's tp GPUs: DP attention puts one attention
        rank on each GPU; the experts are split ep ways and each sharded tp / ep ways."""
        if self.tp % self.ep:
            raise ValueError(f"InferenceX worker tp {self.tp} is not a whole multiple of ep {self.ep}")
        return (1, self.tp, self.tp // self.ep, self.ep) if self.dp_attn else \
            (self.tp, 1, self.tp // self.ep, self.ep)


@dataclass(slots=True, frozen=True)
class Entry:
    """One search-space entry: the client counts it ran, its workers, and its MTP depth (0: none)."""

    concs: tuple[int, ...]
    prefill: Shape
    decode: Shape
    mtp: int
    # The decode worker's TensorRT-LLM max_batch_size at each client count (per attention-DP rank under DP
    # attention), from the recipe file the entry launches (_DECODE_BATCH); () where not transcribed.
    batch: tuple[int, ...] = ()

    # The prefill ("ctx") worker's TensorRT-LLM (max_batch_size, max_num_tokens), per attention-DP rank under DP
    # attention, from the recipe the entry launches (_PREFILL_CAPS); (0, 0) where not transcribed.
    prefill_caps: tuple[int, int] = (0, 0)

    def batch_at(self, clients: int) -> int:
        """The decode max_batch_size the entry ran at `clients` clients (0: not transcribed)."""
        return self.batch[self.concs.index(clients)] if self.batch and clients in self.concs else 0


@dataclass(slots=True, frozen=True)
class Match:
    """The workers a row ran with, from the file; mtp None where the fitting entries disagree on it."""

    prefill: Shape
    decode: Shape
    mtp: int | None
    decode_batch: int = 0  # the decode worker's max_batch_size per attention rank (0: not known)
    prefill_caps: tuple[int, int] = (0, 0)  # the prefill worker's (max_batch_size, max_num_tokens) a rank (0: not known)
    source: str = _SOURCE  # where the entries were read (RECIPE_SOURCES for the configurations read there)
    assumed: str = ""  # how an entry was picked where none is the row's alone (assumed_entry); '' where one is

    def decode_slots(self) -> int:
        """Requests one decode worker runs at once: max_batch_size per attention rank, times its DP-attention
        ranks (TensorRT-LLM's max_batch_size is per rank under attention DP); 0 where not known."""
        return self.decode_batch * (self.decode.tp if self.decode.dp_attn else 1)

    def decode_seqs_field(self) -> int:
        """The decode worker's `scheduler.max_num_seqs`: a rank's max_batch_size under attention DP (sim/build.py
        multiplies the field by data_parallel_size, each rank's batch), else the worker's; 0 where not known."""
        return self.decode_batch

    def simulates_mtp(self, clients: int) -> bool:
        """Whether the row's study drafts: a known depth, and few enough clients (MTP_SIMULATED_MAX_CLIENTS)."""
        return self.mtp is not None and self.mtp > 0 and clients <= MTP_SIMULATED_MAX_CLIENTS

    def note(self, clients: int = 0) -> str:
        """The `layout` column's text for a row of `clients` clients."""
        mtp = ("" if self.mtp == 0 else "; MTP or not: the file has both at this client count" if self.mtp is None
               else "; ran MTP, depth not given (not simulated)" if self.mtp == MTP_DEPTH_NOT_GIVEN
               else f"; ran MTP {SGLANG_MTP_STEPS} (not simulated: SGLang on Hopper, SGLANG_HOPPER_MTP_NOT_SIMULATED)"
               if self.mtp == SGLANG_HOPPER_MTP_NOT_SIMULATED
               else f"; ran MTP {self.mtp} (simulated: MTP_ACCEPTANCE, validate_recipes.py)"
               if self.simulates_mtp(clients) else
               f"; ran MTP {self.mtp} (not simulated past {MTP_SIMULATED_MAX_CLIENTS} clients)")
        head = f"assumed entry ({self.assumed}): " if self.assumed else ""
        return (f"{head}InferenceX config: {self.prefill.count} prefill, {self.decode.count} decode workers"
                f"{mtp} ({self.source})")


def _e(concs: tuple[int, ...], p: tuple[int, int, int, bool], d: tuple[int, int, int, bool], mtp: int) -> Entry:
    return Entry(concs, Shape(*p), Shape(*d), mtp)


# Worker shapes, (count, tp, ep, dp-attn): P = prefill, D = decode.
_B200_FP4_P = (1, 4, 4, True)
_B200_FP8_P = (1, 8, 8, True)
_B300_FP4_P = (1, 2, 2, True)
_B300_FP8_P = (1, 4, 1, True)
_H100_P = (1, 16, 16, True)
_H100_SGL_P = (1, 16, 1, False)
_GB200_FP4_P = (1, 4, 4, True)
_GB200_FP8_P = (1, 8, 8, True)
_GB300_FP4_P = (1, 2, 2, True)
_GB300_FP8_P = (1, 4, 4, True)
_B200_SGL_TEP8 = (1, 8, 8, False)
_B200_SGL_EP1_P = (1, 8, 1, True)
_H200_SGL_P = (1, 8, 1, False)
_H200_TRT_ADP_P = (1, 8, 8, True)
_H200_TRT_TEP_P = (1, 8, 8, False)

# The MTP depth of InferenceX's DeepSeek-R1 Dynamo-SGLang MTP entries: the decode worker's
# `speculative-num-steps` in the srt-slurm recipe each entry launches, with `speculative-algorithm: EAGLE`,
# `speculative-eagle-topk: 1` and `speculative-num-draft-tokens` = steps + 1 (a chain of that many drafts from the
# model's NextN layer, verified together with the target's own token: TensorRT-LLM's MTP at that depth). Read
# through the library's code index (the decode section of each file; its `benchmark: concurrencies` are the
# entry's client counts below, which is what ties the file to the entry):
# - qiching/srt-slurm @5063eb4 recipes/b200-fp8/1k1k/mtp/low-latency-tep8-1p1d.yaml ("4x64"), -1p3d
#   ("4x8x16x32x128"), max-tpt-dep8-1p5d ("512x4096"), -2p5d ("1024x2048x4096"): 2 steps, 3 draft tokens;
#   max-tpt-dep8-1p2d ("512x1024x2048"): 1 step, 2 draft tokens (SGLANG_MTP_B200_FP8_1K_DEP8_1P2D).
# - the same @5063eb4 recipes/b200-fp8/8k1k/mtp/low-latency-tep8-1p1d ("16x32x64"), -1p4d ("8x256"), -1p6d
#   ("4x8x16x256"), max-tpt-dep8-1p1d ("256"), -2p1d ("128x512"); recipes/b200-fp4/1k1k/mtp/low-latency-dep4-1p-
#   tep8-5d ("16x512"), -6d ("32x64x256x512"), max-tpt-dep4-1p-dep8-1d ("512x1024"), -2d ("512");
#   recipes/b200-fp4/8k1k/mtp/low-latency-dep4-1p-tep8-1d ("64x128"), -5d ("8"), low-latency-dep4-2p-tep8-5d
#   ("4x128"), low-latency-tp4-1p-tp8-1d ("4x8x16x64"); recipes/h200/1k1k/low-latency-1p9d-mtp, bs256-1p6d-tp-mtp,
#   bs256-1p6d-dep-mtp; recipes/h200/8k1k/bs4-1p7d-mtp, bs8-1p6d-mtp, bs16-1p3d-mtp, bs64-2p3d-mtp,
#   bs128-1p1d-dep-mtp; recipes/h100/{1k1k,1k8k,8k1k}/mtp/h100-fp8-1p{2,2,1}d-max-tp-mtp and
#   h100-fp8-1p1d-max-dep-mtp (whose prefill workers set the same flags): 2 steps, 3 draft tokens.
# - ishandhanani/srt-slurm recipes/b200-fp8/8k1k.yaml @50f459c (the prefill-EP-1 run below): its
#   zip_override_mtp_lowlat and zip_override_mtp_maxtpt set 2 steps, 3 draft tokens on every decode worker.
# No other depth appears in those trees. Their drafts are accepted at MTP_ACCEPTANCE a position
# (sim/validate_recipes.py): SemiAnalysisAI/InferenceX PR #649's acceptance length, measured on an SGLang
# disaggregated DeepSeek-R1 MTP deployment (MI355X) with the chat template that srt-slurm's sa-bench applies by
# default (qiching/srt-slurm src/srtctl/benchmarks/scripts/sa-bench/bench.sh @7460e9b: USE_CHAT_TEMPLATE defaults
# to true; the version those runs used is not pinned); at 2 drafts that rate gives 2.17 tokens a verify step
# (1 + 0.691 + 0.691^2). No public source read gives SGLang's DeepSeek-R1 acceptance at 2 steps on these prompts.
SGLANG_MTP_STEPS = 2
SGLANG_MTP_B200_FP8_1K_DEP8_1P2D = 1
# The H100 / H200 SGLang MTP entries (their recipes above: 2 steps too) are recorded, not simulated: on Hopper the
# measured plain and MTP runs of one layout gain far less from drafting than the simulator's drafts at
# MTP_ACCEPTANCE give (H200 8k/1k at 4 clients: 9.8 against 7.5 ms measured, 1.3x, where the simulator gives
# 1.77x; B200 FP8 1k/1k at 4 clients: 9.79 against 4.66 ms, 2.0x, the simulator 1.98x). Simulated at depth 2 the
# development Hopper rows went from 27% to 43.5% median TPOT error (docs/validate-accuracy.md, sglmtp). Those
# recipes run the flashinfer attention backend where B200's run trtllm_mla; no source read says what costs a
# Hopper verify step more, so no factor is fitted: the marker keeps the depth and the study plain.
SGLANG_HOPPER_MTP_NOT_SIMULATED = -2

# (backend, system, precision, isl, osl) -> entries, from every `dsr1-*-dynamo-trt` (TensorRT-LLM under Dynamo:
# the dumps' `trtllm`) and `dsr1-*-dynamo-sglang(-mtp)` entry of the file, but those whose client counts
# differ from the dumps': H200 (the dumps' 11 and 13 at 1k/1k) and GB200 FP4 1k/8k (the file's 4-48 and 5 where
# its recipes ran 28 and 7), whose entries below come from their recipes instead (RECIPE_SOURCES). TensorRT-LLM
# B300 FP8 8k/1k is in: every count of its entries is one the dumps hold, and the dumps' 5 and 10 are counts no
# entry lists (_UNLISTED_COUNTS). The other backends' disaggregated rows keep the assumption (gpt-oss's GB200
# entries give several decode shapes at each client count: GPTOSS_TABLE reads its recipes instead, where the row's
# decode TP picks one). SGLang B200 FP8 8k/1k's dumps hold two runs (_TWIN_DATED): its entries are matched by
# db-dump layouts.
TABLE: dict[tuple[str, str, str, int, int], tuple[Entry, ...]] = {
    ("trtllm", "b200_sxm", "fp4", 1024, 1024): (
        _e((1214,), _B200_FP4_P, (2, 8, 8, True), 2),
        _e((875,), _B200_FP4_P, (5, 8, 8, True), 3),
        _e((6,), _B200_FP4_P, (5, 8, 8, False), 3),
        _e((10, 15, 25, 45, 90, 180), _B200_FP4_P, (5, 8, 8, False), 3),
        _e((4968,), (3, 4, 4, True), (4, 8, 8, True), 1),
        _e((10860,), (3, 4, 4, True), (5, 4, 4, True), 1),
        _e((4096,), _B200_FP4_P, (1, 8, 8, True), 0),
        _e((2192,), _B200_FP4_P, (2, 8, 8, True), 0),
        _e((1365,), _B200_FP4_P, (5, 8, 8, True), 0),
        _e((6,), _B200_FP4_P, (5, 8, 8, False), 0),
        _e((10, 15, 25, 45, 90, 180), _B200_FP4_P, (5, 8, 8, False), 0),
        _e((450,), _B200_FP4_P, (6, 8, 8, False), 0),
    ),
    ("trtllm", "b200_sxm", "fp4", 8192, 1024): (
        _e((90,), _B200_FP4_P, (1, 8, 8, True), 3),
        _e((66,), _B200_FP4_P, (3, 8, 8, False), 3),
        _e((6,), _B200_FP4_P, (5, 8, 8, False), 3),
        _e((10, 15, 30, 60), _B200_FP4_P, (5, 8, 8, False), 3),
        _e((548,), (3, 4, 4, True), (1, 8, 8, True), 3),
        _e((1096, 1691), (5, 4, 4, True), (1, 8, 8, True), 1),
        _e((658,), (5, 4, 4, True), (2, 8, 8, True), 3),
        _e((6,), _B200_FP4_P, (5, 8, 8, False), 0),
        _e((10, 15, 25, 50, 100), _B200_FP4_P, (5, 8, 8, False), 0),
        _e((370,), (2, 4, 4, True), (5, 8, 8, False), 0),
        _e((1606,), (4, 4, 4, True), (1, 8, 8, True), 0),
        _e((837,), (4, 4, 4, True), (3, 8, 8, True), 0),
        _e((2222,), (7, 4, 4, True), (2, 8, 8, True), 0),
    ),
    ("trtllm", "b200_sxm", "fp8", 1024, 1024): (
        _e((8,), _B200_FP8_P, (8, 8, 1, False), 3),
        _e((32,), _B200_FP8_P, (8, 8, 1, False), 3),
        _e((64,), _B200_FP8_P, (8, 8, 1, False), 3),
        _e((256,), _B200_FP8_P, (8, 8, 1, False), 3),
        _e((896,), _B200_FP8_P, (7, 8, 8, True), 3),
        _e((1024,), _B200_FP8_P, (4, 8, 8, True), 3),
        _e((1184,), _B200_FP8_P, (3, 8, 8, True), 3),
        _e((1600,), _B200_FP8_P, (2, 8, 8, True), 2),
        _e((4,), _B200_FP8_P, (3, 8, 1, False), 0),
        _e((32,), _B200_FP8_P, (3, 8, 1, False), 0),
        _e((128,), _B200_FP8_P, (3, 8, 1, False), 0),
        _e((1920,), _B200_FP8_P, (5, 8, 8, True), 0),
        _e((4096,), _B200_FP8_P, (1, 8, 8, True), 0),
        _e((5152,), (2, 8, 8, True), (5, 8, 8, True), 0),
    ),
    ("trtllm", "b200_sxm", "fp8", 8192, 1024): (
        _e((8,), _B200_FP8_P, (6, 8, 1, False), 3),
        _e((8,), _B200_FP8_P, (2, 8, 1, False), 3),
        _e((48,), _B200_FP8_P, (6, 8, 1, False), 3),
        _e((64,), _B200_FP8_P, (4, 8, 1, False), 3),
        _e((224,), (2, 8, 8, True), (3, 8, 8, True), 3),
        _e((288,), (2, 8, 8, True), (1, 8, 8, True), 3),
        _e((1088,), (4, 8, 8, True), (1, 8, 8, True), 2),
        _e((1,), _B200_FP8_P, (1, 8, 1, False), 0),
        _e((32,), _B200_FP8_P, (4, 8, 1, False), 0),
        _e((128,), _B200_FP8_P, (4, 8, 1, False), 0),
        _e((96,), _B200_FP8_P, (6, 8, 1, False), 0),
        _e((128,), _B200_FP8_P, (1, 8, 8, True), 0),
        _e((128,), _B200_FP8_P, (2, 8, 8, True), 0),
        _e((256,), _B200_FP8_P, (1, 8, 8, True), 0),
        _e((640,), (2, 8, 8, True), (1, 8, 8, True), 0),
    ),
    ("trtllm", "b300_sxm", "fp4", 1024, 1024): (
        _e((654,), _B300_FP4_P, (1, 8, 8, True), 3),
        _e((271,), _B300_FP4_P, (2, 8, 8, True), 3),
        _e((11,), _B300_FP4_P, (5, 8, 8, False), 3),
        _e((10, 20, 25, 60, 120, 200), _B300_FP4_P, (5, 8, 8, False), 3),
        _e((2342,), (2, 2, 2, True), (1, 8, 8, True), 1),
        _e((8609,), (5, 2, 2, True), (2, 8, 8, True), 1),
        _e((12926,), (5, 2, 2, True), (2, 8, 8, True), 1),
        _e((1176,), _B300_FP4_P, (2, 8, 8, True), 0),
        _e((6,), _B300_FP4_P, (4, 8, 8, False), 0),
        _e((5, 10, 15, 25), _B300_FP4_P, (5, 4, 4, False), 0),
        _e((60, 110, 195, 395), _B300_FP4_P, (5, 8, 8, False), 0),
        _e((4405,), (2, 2, 2, True), (1, 8, 8, True), 0),
        _e((8192,), (3, 2, 2, True), (1, 8, 8, True), 0),
        _e((4611,), (3, 2, 2, True), (2, 8, 8, True), 0),
    ),
    ("trtllm", "b300_sxm", "fp8", 1024, 1024): (
        _e((10,), _B300_FP8_P, (8, 8, 1, False), 3),
        _e((160,), _B300_FP8_P, (8, 8, 1, False), 3),
        _e((3072,), _B300_FP8_P, (1, 8, 1, True), 1),
        _e((2560,), _B300_FP8_P, (2, 8, 8, True), 1),
        _e((720,), _B300_FP8_P, (5, 8, 8, True), 2),
        _e((11264,), (3, 4, 1, True), (2, 8, 1, True), 1),
        _e((2112,), _B300_FP8_P, (1, 8, 8, True), 0),
        _e((3072,), _B300_FP8_P, (2, 8, 1, True), 0),
        _e((1280,), _B300_FP8_P, (3, 8, 1, True), 0),
        _e((12,), _B300_FP8_P, (8, 8, 1, False), 0),
        _e((128,), _B300_FP8_P, (8, 8, 1, False), 0),
        _e((384,), _B300_FP8_P, (8, 8, 1, False), 0),
        _e((16384,), (2, 4, 1, True), (1, 8, 1, True), 0),
    ),
    ("trtllm", "b300_sxm", "fp4", 8192, 1024): (
        _e((2198,), (10, 2, 2, True), (1, 8, 8, True), 1),
        _e((52,), _B300_FP4_P, (4, 4, 4, False), 3),
        _e((8,), _B300_FP4_P, (4, 8, 8, False), 3),
        _e((32,), _B300_FP4_P, (4, 8, 8, False), 3),
        _e((181,), (3, 2, 2, True), (1, 8, 8, True), 3),
        _e((1197,), (9, 2, 2, True), (1, 8, 8, True), 1),
        _e((105,), _B300_FP4_P, (3, 4, 4, False), 0),
        _e((63,), _B300_FP4_P, (3, 8, 8, False), 0),
        _e((4,), _B300_FP4_P, (3, 8, 8, False), 0),
        _e((12,), _B300_FP4_P, (4, 4, 4, False), 0),
        _e((589,), (5, 2, 2, True), (2, 8, 8, True), 0),
        _e((1093,), (6, 2, 2, True), (1, 8, 8, True), 0),
        _e((2048,), (8, 2, 2, True), (1, 8, 8, True), 0),
    ),
    # dsr1-fp8-b300-dynamo-trt 8k/1k (image tensorrtllm-runtime:0.8.1.post1, the rows' own), @0004cf5 in the file's
    # order: "8k1k MTP configs" then "8k1k STP configs", each launching recipes/trtllm/b300-fp8/8k1k/{mtp,stp}/
    # ctx<P>_gen<D>_<tp8|dp8|dep8>_batch<B>_eplb0_mtp<K>_<N>.yaml of ishandhanani/srt-slurm sa-submission-q1-2026.
    # Every prefill worker TP 4, EP 1, attention DP; `tp8`: decode TP 8, EP 1, TP attention; `dp8`: TP 8, EP 1,
    # attention DP; `dep8`: TP 8, EP 8, attention DP. 256 (ctx2_gen1_dp8 / ctx3_gen5_tp8) and 512 (ctx4_gen1_dp8
    # MTP 2 / ctx3_gen1_dp8 plain) are each run by two entries with other workers.
    ("trtllm", "b300_sxm", "fp8", 8192, 1024): (
        _e((40,), _B300_FP8_P, (2, 8, 1, False), 3),  # mtp/ctx1_gen2_tp8_batch16_eplb0_mtp3_40
        _e((8,), _B300_FP8_P, (4, 8, 1, False), 3),  # mtp/ctx1_gen4_tp8_batch1_eplb0_mtp3_8
        _e((20,), _B300_FP8_P, (4, 8, 1, False), 3),  # mtp/ctx1_gen4_tp8_batch4_eplb0_mtp3_20
        _e((72,), _B300_FP8_P, (1, 8, 1, True), 3),  # mtp/ctx1_gen1_dp8_batch8_eplb0_mtp3_72
        _e((144,), (2, 4, 1, True), (1, 8, 1, True), 3),  # mtp/ctx2_gen1_dp8_batch16_eplb0_mtp3_144
        _e((512,), (4, 4, 1, True), (1, 8, 1, True), 2),  # mtp/ctx4_gen1_dp8_batch64_eplb0_mtp2_512
        _e((64,), _B300_FP8_P, (4, 8, 1, False), 0),  # stp/ctx1_gen4_tp8_batch16_eplb0_mtp0_64
        _e((16,), _B300_FP8_P, (8, 8, 1, False), 0),  # stp/ctx1_gen8_tp8_batch2_eplb0_mtp0_16
        _e((256,), (2, 4, 1, True), (1, 8, 1, True), 0),  # stp/ctx2_gen1_dp8_batch32_eplb0_mtp0_256
        _e((512,), (3, 4, 1, True), (1, 8, 1, True), 0),  # stp/ctx3_gen1_dp8_batch64_eplb0_mtp0_512
        _e((256,), (3, 4, 1, True), (5, 8, 1, False), 0),  # stp/ctx3_gen5_tp8_batch64_eplb0_mtp0_256
        _e((1075,), (5, 4, 1, True), (1, 8, 1, True), 0),  # stp/ctx5_gen1_dp8_batch128_eplb0_mtp0_1075
        _e((3072,), (7, 4, 1, True), (1, 8, 8, True), 0),  # stp/ctx7_gen1_dep8_batch384_eplb0_mtp0_3072
    ),
    ("trtllm", "h100_sxm", "fp8", 1024, 1024): (
        _e((6, 9, 30, 60, 117), _H100_P, (3, 16, 16, False), 3),
        _e((231,), _H100_P, (3, 16, 16, True), 3),
        _e((462,), _H100_P, (3, 16, 16, False), 3),
        _e((615,), _H100_P, (1, 16, 16, True), 2),
        _e((1229,), _H100_P, (1, 16, 16, True), 1),
        _e((6, 9, 30, 60), _H100_P, (3, 16, 16, False), 0),
        _e((231, 462, 924, 1845), _H100_P, (3, 16, 16, True), 0),
        _e((4916,), (2, 16, 16, True), (1, 16, 16, True), 0),
    ),
    ("trtllm", "h100_sxm", "fp8", 8192, 1024): (
        _e((6, 9, 30), _H100_P, (3, 16, 16, False), 3),
        _e((77,), _H100_P, (1, 16, 16, True), 3),
        _e((154,), (2, 16, 16, True), (1, 16, 16, True), 3),
        _e((6, 9, 30), _H100_P, (3, 16, 16, False), 0),
        _e((154,), _H100_P, (2, 16, 16, False), 0),
        _e((308,), (2, 16, 16, True), (1, 16, 16, True), 0),
    ),
    # dsr1-fp8-h200-dynamo-trt, from the srt-slurm recipes themselves (RECIPE_SOURCES): the client counts whose
    # recipes were read. 1k/1k: prefill TP 8, EP 8, attention DP (`enable_attention_dp: true`); decode TEP 8 up to
    # 352 clients, DEP 8 past. 8k/1k: prefill TEP 8 (`enable_attention_dp: false` in the recipes, `dp-attn: true` in
    # nvidia-master.yaml @48f302c: the recipe is what ran).
    ("trtllm", "h200_sxm", "fp8", 1024, 1024): (
        _e((36,), _H200_TRT_ADP_P, (9, 8, 8, False), 0),  # stp/c4_ctx1_gen9_tep8_batch256_eplb0_mtp0
        _e((44,), _H200_TRT_ADP_P, (11, 8, 8, False), 3),  # mtp/c4_ctx1_gen11_tep8_batch128_eplb0_mtp3
        _e((72,), _H200_TRT_ADP_P, (9, 8, 8, False), 0),  # stp/c8_ctx1_gen9_tep8_batch256_eplb0_mtp0
        _e((88,), _H200_TRT_ADP_P, (11, 8, 8, False), 3),  # mtp/c8_ctx1_gen11_tep8_batch128_eplb0_mtp3
        # Past 88 (benchmark concurrencies N x D, read 2026-12-05): 144 is both c16_ctx1_gen9_tep8 recipes (MTP 3,
        # batch 128; plain, batch 256: the same workers, MTP not known); 1,024 is left out (c256_ctx1_gen4_dep8
        # MTP 3 and c512_ctx1_gen2_dep8 MTP 1 both give it: the workers disagree).
        _e((144,), _H200_TRT_ADP_P, (9, 8, 8, False), 3),  # mtp/c16_ctx1_gen9_tep8_batch128_eplb0_mtp3: "144"
        _e((144,), _H200_TRT_ADP_P, (9, 8, 8, False), 0),  # stp/c16_ctx1_gen9_tep8_batch256_eplb0_mtp0: "144"
        _e((352,), _H200_TRT_ADP_P, (11, 8, 8, False), 3),  # mtp/c32_ctx1_gen11_tep8_batch128_eplb0_mtp3: "352"
        _e((512,), _H200_TRT_ADP_P, (8, 8, 8, True), 3),  # mtp/c64_ctx1_gen8_dep8_batch128_eplb0_mtp3: "512"
        _e((896,), _H200_TRT_ADP_P, (7, 8, 8, True), 3),  # mtp/c128_ctx1_gen7_dep8_batch128_eplb0_mtp3: "896"
        _e((1152,), _H200_TRT_ADP_P, (9, 8, 8, True), 0),  # stp/c128_ctx1_gen9_dep8_batch512_eplb0_mtp0: "1152"
        _e((1536,), _H200_TRT_ADP_P, (6, 8, 8, True), 0),  # stp/c256_ctx1_gen6_dep8_batch512_eplb0_mtp0: "1536"
        _e((3584,), (2, 8, 8, True), (7, 8, 8, True), 0),  # stp/c512_ctx2_gen7_dep8_batch512_eplb0_mtp0: "3584"
        # Read 2026-12-06 (matrix2), the same commit, for the db-dump records of these layouts (configs 303, 590):
        _e((288,), _H200_TRT_ADP_P, (9, 8, 8, False), 0),  # stp/c32_ctx1_gen9_tep8_batch256_eplb0_mtp0: "288"
        _e((576,), _H200_TRT_ADP_P, (9, 8, 8, False), 0),  # stp/c64_ctx1_gen9_tep8_batch256_eplb0_mtp0: "576"
    ),
    ("trtllm", "h200_sxm", "fp8", 8192, 1024): (
        _e((28,), _H200_TRT_TEP_P, (7, 8, 8, False), 3),  # mtp/c4_ctx1_gen7_tep8_batch32_eplb0_mtp3
        _e((28,), _H200_TRT_TEP_P, (7, 8, 8, False), 0),  # stp/c4_ctx1_gen7_tep8_batch32_eplb0_mtp0
        _e((64,), _H200_TRT_TEP_P, (1, 8, 8, True), 2),  # mtp/c64_ctx1_gen1_dep8_batch32_eplb0_mtp2
        # Past 64: 256 only c256_ctx3_gen1_dep8 (MTP 2); 512 both c512_ctx3_gen1_dep8 recipes (MTP 1, batch 64;
        # plain, batch 512: the same workers, MTP and batch not known). Read below: 128 (c128_ctx2_gen1 MTP 2,
        # c128_ctx1_gen1 plain: 2 or 1 prefill workers), 160 (c32_ctx3_gen5 MTP 3, c32_ctx2_gen5 plain), 48 (c8_gen6
        # and c16_gen3, MTP and plain each). Left out: 9 (no recipe).
        _e((256,), (3, 8, 8, False), (1, 8, 8, True), 2),  # mtp/c256_ctx3_gen1_dep8_batch32_eplb0_mtp2: "256"
        _e((512,), (3, 8, 8, False), (1, 8, 8, True), 1),  # mtp/c512_ctx3_gen1_dep8_batch64_eplb0_mtp1: "512"
        _e((512,), (3, 8, 8, False), (1, 8, 8, True), 0),  # stp/c512_ctx3_gen1_dep8_batch512_eplb0_mtp0: "512"
        # Read 2026-12-06 (matrix2), the same commit: the counts left out above, and 192 and 768, each recipe's
        # `benchmark: concurrencies` the total (every prefill worker `enable_attention_dp: false`, as c256_ctx5_gen3
        # writes it). Where recipes of one count disagree on the workers (48, 128, 160), a dump row takes the one its
        # db-dump twin's layout is (configs 347 / 301, 675 / 291, 305), else none.
        _e((48,), _H200_TRT_TEP_P, (3, 8, 8, False), 0),  # stp/c16_ctx1_gen3_tep8_batch32_eplb0_mtp0: "48"
        _e((48,), _H200_TRT_TEP_P, (3, 8, 8, False), 2),  # mtp/c16_ctx1_gen3_tep8_batch32_eplb0_mtp2: "48"
        _e((48,), _H200_TRT_TEP_P, (6, 8, 8, False), 0),  # stp/c8_ctx1_gen6_tep8_batch16_eplb0_mtp0: "48"
        _e((48,), _H200_TRT_TEP_P, (6, 8, 8, False), 3),  # mtp/c8_ctx1_gen6_tep8_batch32_eplb0_mtp3: "48"
        _e((128,), _H200_TRT_TEP_P, (1, 8, 8, True), 0),  # stp/c128_ctx1_gen1_dep8_batch256_eplb0_mtp0: "128"
        _e((128,), (2, 8, 8, False), (1, 8, 8, True), 2),  # mtp/c128_ctx2_gen1_dep8_batch32_eplb0_mtp2: "128"
        _e((160,), (2, 8, 8, False), (5, 8, 8, False), 0),  # stp/c32_ctx2_gen5_tep8_batch128_eplb0_mtp0: "160"
        _e((160,), (3, 8, 8, False), (5, 8, 8, False), 3),  # mtp/c32_ctx3_gen5_tep8_batch32_eplb0_mtp3: "160"
        _e((192,), (2, 8, 8, False), (3, 8, 8, True), 0),  # stp/c64_ctx2_gen3_dep8_batch128_eplb0_mtp0: "192"
        _e((768,), (5, 8, 8, False), (3, 8, 8, True), 0),  # stp/c256_ctx5_gen3_dep8_batch256_eplb0_mtp0: "768"
    ),
    # dsr1-fp8-h100-dynamo-sglang: every entry MTP; two decode shapes share the client counts up to 64.
    ("sglang", "h100_sxm", "fp8", 1024, 1024): (
        _e((1, 2, 4, 8, 16, 32, 64, 128), _H100_SGL_P, (2, 16, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((1, 2, 4, 8, 16, 32, 64), _H100_SGL_P, (1, 16, 16, True), SGLANG_HOPPER_MTP_NOT_SIMULATED),
    ),
    ("sglang", "h100_sxm", "fp8", 1024, 8192): (
        _e((1, 2, 4, 8, 16, 32, 64), _H100_SGL_P, (2, 16, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((1, 2, 4, 8, 16, 32, 64), _H100_SGL_P, (1, 16, 16, True), SGLANG_HOPPER_MTP_NOT_SIMULATED),
    ),
    ("sglang", "h100_sxm", "fp8", 8192, 1024): (
        _e((1, 2, 4, 8, 16, 32, 64, 128), _H100_SGL_P, (1, 16, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((1, 2, 4, 8, 16, 32, 64), _H100_SGL_P, (1, 16, 16, True), SGLANG_HOPPER_MTP_NOT_SIMULATED),
    ),
    # dsr1-fp4-gb200-dynamo-trt 1k/1k: the 2026-03-25 dump's client counts only (_ONLY_DUMP).
    ("trtllm", "gb200", "fp4", 1024, 1024): (
        _e((180,), _GB200_FP4_P, (1, 32, 32, True), 3),
        _e((4, 8, 12, 24, 48), _GB200_FP4_P, (4, 8, 8, False), 3),
        _e((4301,), (2, 4, 4, True), (1, 16, 16, True), 1),
        _e((2253,), (3, 4, 4, True), (1, 32, 32, True), 1),
        _e((16130,), (3, 4, 4, True), (5, 4, 4, True), 1),
        _e((4301,), _GB200_FP4_P, (1, 8, 8, True), 0),
        _e((666,), _GB200_FP4_P, (1, 32, 32, True), 0),
        _e((6144,), _GB200_FP4_P, (2, 4, 4, True), 0),
        _e((12, 24, 48, 96, 192), _GB200_FP4_P, (4, 8, 8, False), 0),
        _e((5,), _GB200_FP4_P, (4, 8, 8, False), 0),
        _e((4301,), (2, 4, 4, True), (1, 16, 16, True), 0),
        _e((2253,), (2, 4, 4, True), (1, 32, 32, True), 0),
    ),
    # dsr1-fp4-gb200-dynamo-trt 1k/8k: the fourteen recipes its entries launch (RECIPE_SOURCES), each at its own
    # `benchmark: concurrencies` (the matrix's conc-lists differ at the low counts: [4, 8, 12, 24, 48] and [5] for
    # recipes whose own counts are 28 and 7). File order: MTP, then STP. Every prefill worker 1 x TP 4 / EP 4 with
    # attention DP; `tepN`: decode TP N = EP N, TP attention; `depN`: the same with attention DP.
    ("trtllm", "gb200", "fp4", 1024, 8192): (
        _e((28,), _GB200_FP4_P, (7, 8, 8, False), 3),  # mtp/ctx1_gen7_tep8_batch4_eplb0_mtp3: ['28']
        _e((7,), _GB200_FP4_P, (7, 8, 8, False), 3),  # mtp/ctx1_gen7_tep8_batch1_eplb0_mtp3: ['7']
        _e((128,), _GB200_FP4_P, (1, 32, 32, True), 3),  # mtp/ctx1_gen1_dep32_batch4_eplb0_mtp3: ['128']
        _e((512,), _GB200_FP4_P, (1, 32, 32, True), 3),  # mtp/ctx1_gen1_dep32_batch16_eplb0_mtp3: ['512']
        _e((3072,), _GB200_FP4_P, (3, 16, 16, True), 3),  # mtp/ctx1_gen3_dep16_batch64_eplb0_mtp3: ['3072']
        _e((6144,), _GB200_FP4_P, (3, 16, 16, True), 1),  # mtp/ctx1_gen3_dep16_batch128_eplb0_mtp1: ['6144']
        _e((8192,), _GB200_FP4_P, (1, 32, 32, True), 1),  # mtp/ctx1_gen1_dep32_batch256_eplb288_mtp1: ['8192']
        _e((7,), _GB200_FP4_P, (7, 8, 8, False), 0),  # stp/ctx1_gen7_tep8_batch1_eplb0_mtp0: ['7']
        _e((60,), _GB200_FP4_P, (15, 4, 4, False), 0),  # stp/ctx1_gen15_tep4_batch4_eplb0_mtp0: ['60']
        _e((135,), _GB200_FP4_P, (15, 4, 4, False), 0),  # stp/ctx1_gen15_tep4_batch8_eplb0_mtp0: ['135']
        _e((563,), _GB200_FP4_P, (1, 32, 32, True), 0),  # stp/ctx1_gen1_dep32_batch16_eplb0_mtp0: ['563']
        _e((2048,), _GB200_FP4_P, (1, 32, 32, True), 0),  # stp/ctx1_gen1_dep32_batch64_eplb0_mtp0: ['2048']
        _e((4096,), _GB200_FP4_P, (1, 32, 32, True), 0),  # stp/ctx1_gen1_dep32_batch128_eplb288_mtp0: ['4096']
        _e((8192,), _GB200_FP4_P, (1, 32, 32, True), 0),  # stp/ctx1_gen1_dep32_batch256_eplb288_mtp0: ['8192']
    ),
    ("trtllm", "gb200", "fp4", 8192, 1024): (
        _e((4, 8, 12, 24, 48), _GB200_FP4_P, (4, 8, 8, False), 3),
        _e((180,), (3, 4, 4, True), (1, 32, 32, True), 3),
        _e((1229,), (7, 4, 4, True), (1, 16, 16, True), 1),
        _e((666,), (8, 4, 4, True), (1, 32, 32, True), 3),
        _e((4301,), (11, 4, 4, True), (1, 16, 16, True), 1),
        # dp-attn true in the file, but the recipes it launches are TP attention (ctx1_gen4_tep8_batch16,
        # ctx1_gen4_tep8_batch1: `tep8`, as every dp-attn false entry's): the recipe is what ran.
        _e((12, 44, 76, 5), _GB200_FP4_P, (4, 8, 8, False), 0),
        _e((333,), (2, 4, 4, True), (1, 32, 32, True), 0),
        _e((1229,), (7, 4, 4, True), (1, 32, 32, True), 0),
        _e((2253,), (8, 4, 4, True), (1, 16, 16, True), 0),
        _e((4096,), (10, 4, 4, True), (1, 16, 16, True), 0),
    ),
    ("trtllm", "gb200", "fp8", 1024, 1024): (
        _e((4301, 2151), _GB200_FP8_P, (1, 8, 8, True), 1),
        _e((1229,), _GB200_FP8_P, (1, 16, 16, True), 1),
        _e((615,), _GB200_FP8_P, (1, 32, 32, True), 3),
        _e((36, 18, 9), _GB200_FP8_P, (3, 8, 8, False), 3),
        _e((6144, 4301), _GB200_FP8_P, (1, 8, 8, True), 0),
        _e((2151,), _GB200_FP8_P, (1, 16, 16, True), 0),
        _e((1127, 256), _GB200_FP8_P, (1, 32, 32, True), 0),
        _e((27, 3), _GB200_FP8_P, (3, 8, 8, False), 0),
    ),
    ("trtllm", "gb200", "fp8", 1024, 8192): (
        _e((8192, 2152), _GB200_FP8_P, (2, 16, 16, True), 1),
        _e((564, 72), _GB200_FP8_P, (1, 32, 32, True), 3),
        _e((4, 8), _GB200_FP8_P, (4, 8, 8, False), 3),
        _e((8192,), _GB200_FP8_P, (2, 16, 16, True), 0),
        _e((2048, 564), _GB200_FP8_P, (1, 32, 32, True), 0),
        _e((36, 4), _GB200_FP8_P, (4, 8, 8, False), 0),
    ),
    ("trtllm", "gb200", "fp8", 8192, 1024): (
        _e((666,), (3, 8, 8, True), (1, 8, 8, True), 3),
        _e((666,), (5, 8, 8, True), (1, 16, 16, True), 3),
        _e((333,), (3, 8, 8, True), (1, 16, 16, True), 3),
        _e((333,), (4, 8, 8, True), (1, 32, 32, True), 3),
        _e((90,), (2, 8, 8, True), (1, 32, 32, True), 3),
        _e((15, 6), _GB200_FP8_P, (3, 8, 8, False), 3),
        _e((1229,), (5, 8, 8, True), (1, 16, 16, True), 0),
        _e((666,), (4, 8, 8, True), (1, 32, 32, True), 0),
        _e((615,), (3, 8, 8, True), (1, 16, 16, True), 0),
        _e((333,), (2, 8, 8, True), (1, 32, 32, True), 0),
        _e((63, 18, 6), _GB200_FP8_P, (3, 8, 8, False), 0),
    ),
    # dsr1-fp8-gb200-dynamo-sglang, dsr1-fp4-gb200-dynamo-sglang (2026-03-25 dump only: _ONLY_DUMP),
    # dsr1-fp8-gb300-dynamo-sglang: no MTP.
    ("sglang", "gb200", "fp8", 1024, 1024): (
        _e((4, 8), (1, 4, 1, False), (1, 4, 1, False), 0),
        _e((1024, 2048, 4096), (3, 8, 8, True), (1, 48, 48, True), 0),
        _e((1024, 2048, 4096, 6144), (2, 8, 8, True), (1, 32, 32, True), 0),
        _e((4096,), (1, 8, 8, True), (1, 8, 8, True), 0),
    ),
    ("sglang", "gb200", "fp8", 8192, 1024): (
        _e((4, 8, 16), (1, 8, 1, False), (1, 8, 1, False), 0),
        _e((512, 1024, 2048, 6144), (5, 8, 8, True), (1, 32, 32, True), 0),
        _e((2048, 4096, 6144), (6, 8, 8, True), (1, 24, 24, True), 0),
    ),
    ("sglang", "gb200", "fp4", 1024, 1024): (
        _e((4, 8, 32), (1, 4, 1, False), (2, 4, 1, False), 0),
        _e((512, 2048, 4096, 8192), (4, 4, 4, True), (1, 32, 32, True), 0),
        _e((2048, 4096), (4, 4, 4, True), (1, 48, 48, True), 0),
    ),
    ("sglang", "gb200", "fp4", 8192, 1024): (
        _e((4, 8), (1, 4, 1, False), (4, 4, 1, False), 0),
        _e((512, 2048, 4096), (6, 4, 1, False), (1, 48, 48, True), 0),
        _e((2048,), (10, 4, 1, False), (1, 32, 32, True), 0),
    ),
    ("sglang", "gb300", "fp8", 1024, 1024): (
        _e((4, 8, 16, 32), (1, 4, 1, False), (4, 4, 1, False), 0),
        _e((1024, 2048, 4096, 6144), (2, 8, 8, True), (1, 32, 32, True), 0),
        _e((4096, 7168, 7680), (1, 8, 8, True), (1, 8, 8, True), 0),
    ),
    ("sglang", "gb300", "fp8", 8192, 1024): (
        _e((4, 8), (1, 4, 1, False), (1, 4, 1, False), 0),
        _e((128, 256, 512, 1024), (5, 8, 8, True), (1, 32, 32, True), 0),
        _e((2048, 4096), (6, 8, 8, True), (1, 24, 24, True), 0),
    ),
    # dsr1-fp4-gb300-dynamo-trt, dsr1-fp8-gb300-dynamo-trt.
    ("trtllm", "gb300", "fp4", 1024, 1024): (
        _e((3226,), _GB300_FP4_P, (1, 4, 4, True), 1),
        _e((333,), _GB300_FP4_P, (1, 32, 32, True), MTP_DEPTH_NOT_GIVEN),
        _e((5, 8, 12, 24, 48), _GB300_FP4_P, (4, 8, 8, False), 3),
        _e((2253,), (3, 2, 2, True), (1, 16, 16, True), 1),
        _e((1229,), (3, 2, 2, True), (1, 32, 32, True), 3),
        _e((5, 12, 48, 96, 192), _GB300_FP4_P, (4, 8, 8, False), 0),
        _e((8192,), (2, 2, 2, True), (1, 8, 8, True), 0),
        _e((1229,), (2, 2, 2, True), (1, 32, 32, True), 0),
        _e((4301,), (3, 2, 2, True), (1, 16, 16, True), 0),
        _e((2253,), (3, 2, 2, True), (1, 32, 32, True), 0),
    ),
    ("trtllm", "gb300", "fp4", 1024, 8192): (
        _e((7, 63), _GB300_FP4_P, (7, 8, 8, False), 3),
        _e((563, 2088), _GB300_FP4_P, (1, 32, 32, True), 3),
        _e((8192,), _GB300_FP4_P, (2, 16, 16, True), 1),
        _e((16384,), _GB300_FP4_P, (4, 8, 8, True), 1),
        _e((7, 245), _GB300_FP4_P, (7, 8, 8, False), 0),
        _e((60,), _GB300_FP4_P, (15, 4, 4, False), 0),
        _e((1024, 4096, 8192), _GB300_FP4_P, (1, 32, 32, True), 0),
    ),
    ("trtllm", "gb300", "fp4", 8192, 1024): (
        _e((33,), _GB300_FP4_P, (3, 8, 8, False), 3),
        _e((5, 12, 24), _GB300_FP4_P, (4, 8, 8, False), 3),
        _e((180,), (4, 2, 2, True), (1, 32, 32, True), 3),
        _e((308,), (8, 2, 2, True), (1, 32, 32, True), 3),
        _e((2253,), (10, 2, 2, True), (1, 8, 8, True), 1),
        _e((666,), (10, 2, 2, True), (1, 16, 16, True), 3),
        _e((1127,), (13, 2, 2, True), (1, 16, 16, True), 3),
        _e((72,), _GB300_FP4_P, (3, 8, 8, False), 0),
        _e((5, 12), _GB300_FP4_P, (4, 8, 8, False), 0),
        _e((5, 15, 30), _GB300_FP4_P, (5, 4, 4, False), 0),
        _e((666,), (7, 2, 2, True), (1, 32, 32, True), 0),
        _e((1229,), (9, 2, 2, True), (1, 16, 16, True), 0),
        _e((3228,), (11, 2, 2, True), (3, 4, 4, True), 0),
        _e((2253,), (14, 2, 2, True), (1, 16, 16, True), 0),
    ),
    ("trtllm", "gb300", "fp8", 1024, 1024): (
        _e((8, 24), _GB300_FP8_P, (4, 8, 8, False), 3),
        _e((180,), _GB300_FP8_P, (1, 32, 32, True), 3),
        _e((564,), (2, 4, 4, True), (1, 32, 32, True), 3),
        _e((666,), _GB300_FP8_P, (1, 16, 16, True), 3),
        _e((2253,), (2, 4, 4, True), (1, 16, 16, True), 1),
        _e((8192,), (3, 4, 4, True), (2, 8, 8, True), 1),
        _e((4, 24, 84), _GB300_FP8_P, (4, 8, 8, False), 0),
        _e((1229,), (2, 4, 4, True), (1, 32, 32, True), 0),
        _e((2253,), (2, 4, 4, True), (1, 16, 16, True), 0),
        _e((8602, 12288), (3, 4, 4, True), (2, 8, 8, True), 0),
    ),
    ("trtllm", "gb300", "fp8", 8192, 1024): (
        _e((8, 24), _GB300_FP8_P, (4, 8, 8, False), 3),
        _e((333,), (6, 4, 4, True), (1, 32, 32, True), 3),
        _e((666,), (8, 4, 4, True), (1, 16, 16, True), 3),
        _e((1229,), (10, 4, 4, True), (1, 16, 16, True), 1),
        _e((1229,), (7, 4, 4, True), (1, 8, 8, True), 1),
        _e((4, 24, 36), _GB300_FP8_P, (4, 8, 8, False), 0),
        _e((512,), (6, 4, 4, True), (1, 32, 32, True), 0),
        _e((666,), (4, 4, 4, True), (1, 16, 16, True), 0),
        _e((1229,), (7, 4, 4, True), (1, 16, 16, True), 0),
        _e((2151,), (7, 4, 4, True), (1, 8, 8, True), 0),
    ),
    ("trtllm", "gb300", "fp8", 1024, 8192): (
        _e((4, 16), _GB300_FP8_P, (4, 8, 8, False), 3),
        _e((141, 544), _GB300_FP8_P, (1, 32, 32, True), 3),
        _e((2048,), _GB300_FP8_P, (2, 16, 16, True), 1),
        _e((8192,), _GB300_FP8_P, (4, 8, 8, True), 1),
        _e((4, 36), _GB300_FP8_P, (4, 8, 8, False), 0),
        _e((282, 1024), _GB300_FP8_P, (1, 32, 32, True), 0),
        _e((4096, 8192), _GB300_FP8_P, (2, 16, 16, True), 0),
    ),
    # dsr1-fp4-gb300-dynamo-sglang: no MTP.
    ("sglang", "gb300", "fp4", 1024, 1024): (
        _e((4, 8, 32), (1, 4, 1, False), (2, 4, 1, False), 0),
        _e((512, 2048, 4096, 8192), (4, 4, 4, True), (1, 32, 32, True), 0),
        _e((512, 2048, 4096, 8192), (4, 4, 4, True), (1, 48, 48, True), 0),
    ),
    ("sglang", "gb300", "fp4", 8192, 1024): (
        _e((4, 8, 32, 64), (1, 4, 1, False), (4, 4, 1, False), 0),
        _e((512, 2048, 4096), (6, 4, 1, False), (1, 48, 48, True), 0),
        _e((2048,), (10, 4, 1, False), (1, 32, 32, True), 0),
    ),
    # dsr1-fp4-b200-dynamo-sglang(-mtp), dsr1-fp8-b200-dynamo-sglang(-mtp) 1k/1k, dsr1-fp8-h200-dynamo-sglang.
    ("sglang", "b200_sxm", "fp4", 1024, 1024): (
        _e((16, 128), _B200_FP4_P, (5, 8, 8, False), 0),
        _e((32, 64, 256), _B200_FP4_P, (6, 8, 8, False), 0),
        _e((512,), _B200_FP4_P, (1, 8, 8, True), 0),
        _e((512,), _B200_FP4_P, (2, 8, 8, True), 0),
        _e((16, 512), _B200_FP4_P, (5, 8, 8, False), SGLANG_MTP_STEPS),
        _e((32, 64, 256, 512), _B200_FP4_P, (6, 8, 8, False), SGLANG_MTP_STEPS),
        _e((512, 1024), _B200_FP4_P, (1, 8, 8, True), SGLANG_MTP_STEPS),
        _e((512,), _B200_FP4_P, (2, 8, 8, True), SGLANG_MTP_STEPS),
    ),
    ("sglang", "b200_sxm", "fp4", 8192, 1024): tuple(
        _e(concs, p, d, mtp) for mtp in (0, SGLANG_MTP_STEPS) for concs, p, d in (
            ((64, 128), _B200_FP4_P, (1, 8, 8, False)),
            ((8,), _B200_FP4_P, (5, 8, 8, False)),
            ((4, 128), (2, 4, 4, True), (5, 8, 8, False)),
            ((4, 8, 16, 64), (1, 4, 1, False), (1, 8, 1, False)),
        )) + (_e((1024, 2048), (7, 4, 4, True), (2, 8, 8, True), 0),),
    ("sglang", "b200_sxm", "fp8", 1024, 1024): (
        _e((4,), _B200_SGL_TEP8, (1, 8, 8, False), 0),
        _e((16, 32, 64, 128, 256), _B200_SGL_TEP8, (3, 8, 8, False), 0),
        _e((1024, 2048, 4096), _B200_FP8_P, (5, 8, 8, True), 0),
        _e((2048, 4096), (2, 8, 8, True), (5, 8, 8, True), 0),
        _e((4, 64), _B200_SGL_TEP8, (1, 8, 8, False), SGLANG_MTP_STEPS),
        _e((4, 8, 16, 32, 128), _B200_SGL_TEP8, (3, 8, 8, False), SGLANG_MTP_STEPS),
        _e((512, 4096), _B200_FP8_P, (5, 8, 8, True), SGLANG_MTP_STEPS),
        _e((1024, 2048, 4096), (2, 8, 8, True), (5, 8, 8, True), SGLANG_MTP_STEPS),
        _e((512, 1024, 2048), _B200_FP8_P, (2, 8, 8, True), SGLANG_MTP_B200_FP8_1K_DEP8_1P2D),
    ),
    # dsr1-fp8-b200-dynamo-sglang(-mtp) 8k/1k, nvidia-master.yaml @0004cf5 (recipes/b200-fp8/8k1k/stp/
    # low-latency-tep8-1p1d, -1p4d, -1p6d, max-tpt-dep8-1p1d, -2p1d; mtp/ the same names): read by db-dump layouts
    # only (_TWIN_DATED).
    ("sglang", "b200_sxm", "fp8", 8192, 1024): (
        _e((4, 32, 64, 512), _B200_SGL_TEP8, (1, 8, 8, False), 0),
        _e((64, 512), _B200_SGL_TEP8, (4, 8, 8, False), 0),
        _e((32,), _B200_SGL_TEP8, (6, 8, 8, False), 0),
        _e((128, 512, 1024), _B200_FP8_P, (1, 8, 8, True), 0),
        _e((256, 512, 1024), (2, 8, 8, True), (1, 8, 8, True), 0),
        _e((16, 32, 64), _B200_SGL_TEP8, (1, 8, 8, False), SGLANG_MTP_STEPS),
        _e((8, 256), _B200_SGL_TEP8, (4, 8, 8, False), SGLANG_MTP_STEPS),
        _e((4, 8, 16, 256), _B200_SGL_TEP8, (6, 8, 8, False), SGLANG_MTP_STEPS),
        _e((256,), _B200_FP8_P, (1, 8, 8, True), SGLANG_MTP_STEPS),
        _e((128, 512), (2, 8, 8, True), (1, 8, 8, True), SGLANG_MTP_STEPS),
    ) + tuple(
        # The prefill-EP-1 run: not in @0004cf5; its recipe file, ishandhanani/srt-slurm recipes/b200-fp8/8k1k.yaml
        # @50f459c, launches every prefill worker at TP 8, attention DP 8, EP 1 and sweeps (zip_override_*): low
        # latency 1P3D, 1P4D, 1P6D TP 8 decode at EP 1 ("128", "128", "8x16x32x64x128"), max throughput 1P2D,
        # 1P1D, 2P1D, 3P1D DEP 8 decode ("288", "160x288", "512", "1024"), each plain (stp) and MTP (EAGLE) alike;
        # these are the db-dump records' counts of those layouts (configs 639, 641, 649, 654, 655).
        _e(concs, p, d, mtp) for mtp in (0, SGLANG_MTP_STEPS) for concs, p, d in (
            ((128,), _B200_SGL_EP1_P, (3, 8, 1, False)),
            ((128,), _B200_SGL_EP1_P, (4, 8, 1, False)),
            ((8, 16, 32, 64, 128), _B200_SGL_EP1_P, (6, 8, 1, False)),
            ((288,), _B200_SGL_EP1_P, (2, 8, 8, True)),
            ((160, 288), _B200_SGL_EP1_P, (1, 8, 8, True)),
            ((512,), (2, 8, 1, True), (1, 8, 8, True)),
            ((1024,), (3, 8, 1, True), (1, 8, 8, True)),
        )),
    ("sglang", "h200_sxm", "fp8", 1024, 1024): tuple(
        _e(concs, p, d, mtp) for mtp in (0, SGLANG_HOPPER_MTP_NOT_SIMULATED) for concs, p, d in (
            ((1, 4, 8, 16, 32, 64, 128, 256), _H200_SGL_P, (9, 8, 1, False)),
            ((512, 1024, 2048), _H200_SGL_P, (6, 8, 1, False)),
            ((128, 256, 512, 1024, 2048), (1, 8, 8, True), (6, 8, 8, True)),
        )),
    ("sglang", "h200_sxm", "fp8", 8192, 1024): (
        _e((1, 4, 8), _H200_SGL_P, (7, 8, 1, False), 0),
        _e((4, 8, 16), _H200_SGL_P, (6, 8, 1, False), 0),
        _e((8, 16, 32), _H200_SGL_P, (3, 8, 1, False), 0),
        _e((32, 64, 128), (2, 8, 1, False), (3, 8, 1, False), 0),
        _e((64, 128, 256), _H200_SGL_P, (1, 8, 8, True), 0),
        _e((1, 4, 8), _H200_SGL_P, (7, 8, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((2, 4, 8, 16, 32), _H200_SGL_P, (6, 8, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((4, 8, 16, 32, 64), _H200_SGL_P, (3, 8, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((32, 64, 128), (2, 8, 1, False), (3, 8, 1, False), SGLANG_HOPPER_MTP_NOT_SIMULATED),
        _e((32, 64, 128, 256, 512), _H200_SGL_P, (1, 8, 8, True), SGLANG_HOPPER_MTP_NOT_SIMULATED),
    ),
}

# The decode worker's max_batch_size of each TensorRT-LLM entry above, in the table's order: the `batchN` of the
# recipe each entry's CONFIG_FILE names (ishandhanani/srt-slurm, branch sa-submission-q1-2026,
# recipes/trtllm/...; e.g. b200-fp8/8k1k/stp/ctx1_gen4_tp8_batch32_eplb0_mtp0_128.yaml sets the decode
# worker's `max_batch_size: 32`, h100-fp8/1k1k/mtp/ctx1_gen3_tep16_batch2_eplb0_mtp3.yaml `max_batch_size: 2`).
# An int for every client count of the entry, a tuple for each in turn where the file launches a recipe per
# count (0 would mean not transcribed, no cap simulated: no entry is left so). Past 256 clients every value is read
# from the recipe file itself, as below.
# B200 FP8 1k/1k past 256 clients: read from the recipe files themselves (ishandhanani/srt-slurm @fe2cd90
# recipes/trtllm/b200-fp8/1k1k/{mtp,stp}/, the decode worker's `max_batch_size`, a rank's under
# `enable_attention_dp: true`): ctx1_gen7_dep8_batch128_eplb0_mtp3_896 16, ctx1_gen4_dep8_batch256_eplb0_mtp3_1024
# 32, ctx1_gen3_dep8_batch384_eplb0_mtp3_1184 48, ctx1_gen2_dep8_batch768_eplb0_mtp2_1600 96,
# ctx1_gen5_dep8_batch48_eplb0_mtp0_1920 48, ctx1_gen1_dep8_batch512_eplb0_mtp0_4096 512,
# ctx2_gen5_dep8_batch128_eplb0_mtp0_5152 128. Their names' `batchN` is the worker's (8 ranks) in the first four
# and a rank's in the last three: the yaml field is what the engine reads. 1,184, 1,600 and 5,152 clients run over
# 1,152, 1,536 and 5,120 slots.
# GB300 TensorRT-LLM past 256 clients (dsr1-fp4/fp8-gb300-dynamo-trt, SemiAnalysisAI/InferenceX
# .github/configs/nvidia-master.yaml @0004cf5 names each entry's CONFIG_FILE): read from the recipe files, the decode
# worker's `max_batch_size`, a rank's under `enable_attention_dp: true`. FP4: the fork connorcarpenter15/srt-slurm
# @5a156f6 recipes/trtllm/gb300-fp4/ (the matrix's file names; no other copy in the library), 19 of the 24 files past
# 256 clients or at EP > 8 read, the yaml field equal to the name's `batchN` in each (1k1k
# ctx1_gen1_dep4_batch768_eplb0_mtp1 768, ctx1_gen1_dep32_batch8_eplb0_mtp 8, ctx3_gen1_dep16_batch128_eplb256_mtp1 128,
# ctx3_gen1_dep32_batch32_eplb288_mtp3 32, ctx2_gen1_dep8_batch1024_eplb0_mtp0 1024, ctx2_gen1_dep32_batch32_eplb0_mtp0
# 32, ctx3_gen1_dep16_batch256_eplb256_mtp0 256, ctx3_gen1_dep32_batch64_eplb0_mtp0 64; 1k8k
# ctx1_gen1_dep32_batch16_eplb0_mtp3 16, ..._batch64_eplb288_mtp3 64, ctx1_gen1_dep32_batch128_eplb288_mtp0 128; 8k1k
# ctx9_gen1_dep16_batch64_eplb0_mtp0 64, ctx8_gen1_dep32_batch8_eplb0_mtp3 8, ctx10_gen1_dep8_batch256_eplb0_mtp1 256,
# ctx10_gen1_dep16_batch32_eplb0_mtp3 32, ctx13_gen1_dep16_batch64_eplb256_mtp3 64, ctx7_gen1_dep32_batch16_eplb0_mtp0
# 16, ctx11_gen3_dep4_batch256_eplb0_mtp0 256, ctx14_gen1_dep16_batch128_eplb0_mtp0 128; 8k1k's 180-client
# ctx4_gen1_dep32_batch4_eplb0_mtp3 was transcribed before, 4), the four others not read (1k8k
# ctx1_gen2_dep16_batch256_eplb256_mtp1, ctx1_gen4_dep8_batch512_eplb0_mtp1, ctx1_gen1_dep32_batch32_eplb0_mtp0,
# ctx1_gen1_dep32_batch256_eplb288_mtp0) from their names: their slots equal their clients, so they cap nothing. FP8:
# the names' `batchN` (recipes/trtllm/gb300-fp8/..., the fork's 39 files, docs/validate-accuracy.md "gb300trt"), the
# yaml field checked equal in NVIDIA/srt-slurm's copies 1k1k/stp/ctx2_gen1_dep32_batch32_eplb0_mtp0_1229 @3aea726 (32),
# 1k1k/mtp/ctx2_gen1_dep16_batch128_eplb0_mtp1_2253 @4729d9e (128), 8k1k/stp/ctx7_gen1_dep16_batch64_eplb0_mtp0_1229
# @5f23377 (64; its container dynamo-trtllm 0.8.1.post2, the matrix's image). Most of these entries run fewer slots than
# clients (1,229 clients over 1,024, 2,253 over 2,048, 666 over 512, 333 over 256).
# B200 FP4, B200 FP8 8k/1k, B300 FP4 / FP8, H100 and GB200 FP4 / FP8 past 256 clients (the entries main 8ea3e44 left at
# 0): read from the recipe files the matrix names (nvidia-master.yaml @0004cf5 CONFIG_FILE, each entry's), the copies
# in the fork connorcarpenter15/srt-slurm @5a156f6 recipes/trtllm/ (ishandhanani's sa-submission-q1-2026 branch is not
# in the library), the decode worker's `max_batch_size` (a rank's under `enable_attention_dp: true`). All 93 files
# read; in each the field equals the name's `batchN` (unlike B200 FP8 1k/1k's @fe2cd90 names above). By key, entry
# index: file = max_batch_size (slots a worker x workers against the entry's clients; `dp8`: attention DP 8, EP 1).
# B200 FP4 1k/1k: 0 ctx1_gen2_dep8_batch64_eplb0_mtp2 = 64 (2 x 512 for 1,214), 1 ctx1_gen5_dep8_batch16_eplb0_mtp3
# = 16 (5 x 128, 875), 4 ctx3_gen4_dep8_batch128_eplb0_mtp1 = 128 (4 x 1,024, 4,968), 5
# ctx3_gen5_dep4_batch512_eplb0_mtp1 = 512 (5 x 2,048, 10,860), 6 ctx1_gen1_dep8_batch512_eplb0_mtp0 = 512 (4,096,
# 4,096), 7 ctx1_gen2_dep8_batch128_eplb0_mtp0 = 128 (2 x 1,024, 2,192), 8 ctx1_gen5_dep8_batch32_eplb0_mtp0 = 32
# (5 x 256, 1,365), 11 ctx1_gen6_tep8_batch64_eplb0_mtp0 = 64 (TP attention: 6 x 64, 450). B200 FP4 8k/1k: 4
# ctx3_gen1_dep8_batch64_eplb0_mtp3 = 64 (512, 548), 5 ctx5_gen1_dep8_batch192_eplb0_mtp1 = 192 (1,536; its
# `concurrencies: "1096x1691"`), 6 ctx5_gen2_dep8_batch32_eplb0_mtp3 = 32 (2 x 256, 658), 9
# ctx2_gen5_tep8_batch64_eplb0_mtp0 = 64 (5 x 64, 370), 10 ctx4_gen1_dep8_batch192_eplb0_mtp0 = 192 (1,536, 1,606),
# 11 ctx4_gen3_dep8_batch32_eplb0_mtp0 = 32 (3 x 256, 837), 12 ctx7_gen2_dep8_batch128_eplb0_mtp0 = 128 (2 x 1,024,
# 2,222). B200 FP8 8k/1k: 5 mtp/ctx2_gen1_dep8_batch32_eplb0_mtp3_288 = 32 (256, 288), 6
# mtp/ctx4_gen1_dep8_batch128_eplb0_mtp2_1088 = 128 (1,024, 1,088), 14 stp/ctx2_gen1_dep8_batch640_eplb0_mtp0_640 =
# 640 (5,120, 640). B300 FP4 1k/1k: 0 ctx1_gen1_dep8_batch64_eplb0_mtp3 = 64 (512, 654), 1
# ctx1_gen2_dep8_batch16_eplb0_mtp3 = 16 (2 x 128, 271), 4 ctx2_gen1_dep8_batch256_eplb0_mtp1 = 256 (2,048, 2,342), 5
# ctx5_gen2_dep8_batch512_eplb0_mtp1 = 512 (2 x 4,096, 8,609), 6 ctx5_gen2_dep8_batch768_eplb0_mtp1 = 768 (2 x
# 6,144, 12,926), 7 ctx1_gen2_dep8_batch64_eplb0_mtp0 = 64 (2 x 512, 1,176), 11 ctx2_gen1_dep8_batch512_eplb0_mtp0 =
# 512 (4,096, 4,405), 12 ctx3_gen1_dep8_batch1024_eplb0_mtp0 = 1024 (8,192, 8,192), 13
# ctx3_gen2_dep8_batch256_eplb0_mtp0 = 256 (2 x 2,048, 4,611). B300 FP4 8k/1k: 0 ctx10_gen1_dep8_batch256_eplb0_mtp1 =
# 256 (2,048, 2,198), 5 ctx9_gen1_dep8_batch128_eplb0_mtp1 = 128 (1,024, 1,197), 10 ctx5_gen2_dep8_batch32_eplb0_mtp0
# = 32 (2 x 256, 589), 11 ctx6_gen1_dep8_batch128_eplb0_mtp0 = 128 (1,024, 1,093), 12
# ctx8_gen1_dep8_batch256_eplb0_mtp0 = 256 (2,048, 2,048). B300 FP8 1k/1k: 2 mtp/ctx1_gen1_dp8_batch256_eplb0_mtp1_3072
# = 256 (2,048, 3,072), 3 mtp/ctx1_gen2_dep8_batch128_eplb0_mtp1_2560 = 128 (2 x 1,024, 2,560), 4
# mtp/ctx1_gen5_dep8_batch16_eplb0_mtp2_720 = 16 (5 x 128, 720), 5 mtp/ctx3_gen2_dp8_batch512_eplb0_mtp1_11264 = 512
# (2 x 4,096, 11,264), 6 stp/ctx1_gen1_dep8_batch256_eplb0_mtp0_2112 = 256 (2,048, 2,112), 7
# stp/ctx1_gen2_dp8_batch128_eplb0_mtp0_3072 = 128 (2 x 1,024, 3,072), 8 stp/ctx1_gen3_dp8_batch48_eplb0_mtp0_1280 = 48
# (3 x 384, 1,280), 11 stp/ctx1_gen8_tp8_batch64_eplb0_mtp0_384 = 64 (TP: 8 x 64, 384), 12
# stp/ctx2_gen1_dp8_batch1024_eplb0_mtp0_16384 = 1024 (8,192, 16,384). B300 FP8 8k/1k: 5
# mtp/ctx4_gen1_dp8_batch64_eplb0_mtp2_512 = 64 (512, 512), 9 stp/ctx3_gen1_dp8_batch64_eplb0_mtp0_512 = 64 (512,
# 512), 11 stp/ctx5_gen1_dp8_batch128_eplb0_mtp0_1075 = 128 (1,024, 1,075), 12
# stp/ctx7_gen1_dep8_batch384_eplb0_mtp0_3072 = 384 (3,072, 3,072). H100 1k/1k: 2
# mtp/ctx1_gen3_tep16_batch128_eplb0_mtp3 = 128 (TP: 3 x 128, 462), 3 mtp/ctx1_gen1_dep16_batch32_eplb0_mtp2 = 32
# (512, 615), 4 mtp/ctx1_gen1_dep16_batch64_eplb0_mtp1 = 64 (1,024, 1,229), 7 stp/ctx2_gen1_dep16_batch256_eplb0_mtp0 =
# 256 (4,096, 4,916). H100 8k/1k: 5 stp/ctx2_gen1_dep16_batch16_eplb0_mtp0 = 16 (256, 308). GB200 FP4 1k/1k: 2
# mtp/ctx2_gen1_dep16_batch256_eplb256_mtp1 = 256 (4,096, 4,301), 3 mtp/ctx3_gen1_dep32_batch64_eplb288_mtp1 = 64
# (2,048, 2,253), 4 mtp/ctx3_gen5_dep4_batch768_eplb0_mtp1 = 768 (5 x 3,072, 16,130), 5
# stp/ctx1_gen1_dep8_batch512_eplb0_mtp0 = 512 (4,096, 4,301), 6 stp/ctx1_gen1_dep32_batch16_eplb0_mtp0 = 16 (512,
# 666), 7 stp/ctx1_gen2_dep4_batch768_eplb0_mtp0 = 768 (2 x 3,072, 6,144), 10 stp/ctx2_gen1_dep16_batch256_eplb256_mtp0
# = 256 (4,096, 4,301), 11 stp/ctx2_gen1_dep32_batch64_eplb0_mtp0 = 64 (2,048, 2,253). GB200 FP4 1k/8k: 3
# mtp/ctx1_gen1_dep32_batch16_eplb0_mtp3 = 16 (512, 512), 4 mtp/ctx1_gen3_dep16_batch64_eplb0_mtp3 = 64 (3 x 1,024,
# 3,072), 5 mtp/ctx1_gen3_dep16_batch128_eplb0_mtp1 = 128 (3 x 2,048, 6,144), 6
# mtp/ctx1_gen1_dep32_batch256_eplb288_mtp1 = 256 (8,192, 8,192), 10-13 stp/ctx1_gen1_dep32_batch{16,64,128,256}_...
# = 16, 64, 128, 256 (512, 2,048, 4,096, 8,192 for 563, 2,048, 4,096, 8,192). GB200 FP4 8k/1k: 2
# mtp/ctx7_gen1_dep16_batch64_eplb256_mtp1 = 64 (1,024, 1,229), 3 mtp/ctx8_gen1_dep32_batch16_eplb0_mtp3 = 16 (512,
# 666), 4 mtp/ctx11_gen1_dep16_batch256_eplb256_mtp1 = 256 (4,096, 4,301), 6 stp/ctx2_gen1_dep32_batch8_eplb0_mtp0 = 8
# (256, 333), 7 stp/ctx7_gen1_dep32_batch32_eplb0_mtp0 = 32 (1,024, 1,229), 8 stp/ctx8_gen1_dep16_batch128_eplb0_mtp0
# = 128 (2,048, 2,253), 9 stp/ctx10_gen1_dep16_batch256_eplb256_mtp0 = 256 (4,096, 4,096). GB200 FP8 1k/1k: 0
# mtp/ctx1_gen1_dep8_batch{512,256}_eplb0_mtp1_{4301,2151} = 512, 256 (4,096, 2,048), 1
# mtp/ctx1_gen1_dep16_batch64_eplb0_mtp1_1229 = 64 (1,024), 2 mtp/ctx1_gen1_dep32_batch16_eplb0_mtp3_615 = 16 (512), 4
# stp/ctx1_gen1_dep8_batch{768,512}_eplb0_mtp0_{6144,4301} = 768, 512 (6,144, 4,096), 5
# stp/ctx1_gen1_dep16_batch128_eplb0_mtp0_2151 = 128 (2,048). GB200 FP8 1k/8k: 0
# mtp/ctx1_gen2_dep16_batch{256,64}_eplb0_mtp1_{8192,2152} = 256, 64 (2 x 4,096, 2 x 1,024), 3
# stp/ctx1_gen2_dep16_batch256_eplb0_mtp0_8192 = 256 (2 x 4,096), 4 stp/ctx1_gen1_dep32_batch{64,16}_eplb0_mtp0_{2048,
# 564} = 64, 16 (2,048, 512). GB200 FP8 8k/1k: 0 mtp/ctx3_gen1_dep8_batch64_eplb0_mtp3_666 = 64 (512), 1
# mtp/ctx5_gen1_dep16_batch32_eplb0_mtp3_666 = 32 (512), 2 mtp/ctx3_gen1_dep16_batch16_eplb0_mtp3_333 = 16 (256), 3
# mtp/ctx4_gen1_dep32_batch8_eplb0_mtp3_333 = 8 (256), 6 stp/ctx5_gen1_dep16_batch64_eplb0_mtp0_1229 = 64 (1,024), 7
# stp/ctx4_gen1_dep32_batch16_eplb0_mtp0_666 = 16 (512), 8 stp/ctx3_gen1_dep16_batch32_eplb0_mtp0_615 = 32 (512), 9
# stp/ctx2_gen1_dep32_batch8_eplb0_mtp0_333 = 8 (256). Not carried (the simulator has no knob for them, or they bind
# nothing): the decode `max_num_tokens` (at or above batch x (MTP + 1) in every file but B200 FP8 8k/1k 640 clients,
# 512 under a 640 batch, where 80 a rank run), the CUDA-graph batch lists, B200 FP8 8k/1k MTP's
# `attention_dp_config: enable_balance` (docs/validate-accuracy.md "caps").
_DECODE_BATCH: dict[tuple[str, str, str, int, int], tuple[int | tuple[int, ...], ...]] = {
    ("trtllm", "b200_sxm", "fp4", 1024, 1024): (64, 16, 1, 32, 128, 512, 512, 128, 32, 1, 32, 64),
    ("trtllm", "b200_sxm", "fp4", 8192, 1024): (8, 16, 1, 8, 64, 192, 32, 1, 8, 64, 192, 32, 128),
    ("trtllm", "b200_sxm", "fp8", 1024, 1024): (1, 4, 8, 32, 16, 32, 48, 96, 1024, 1024, 1024, 48, 512, 128),
    ("trtllm", "b200_sxm", "fp8", 8192, 1024): (8, 32, 8, 16, 8, 32, 128, 1, 32, 32, 16, 128, 64, 256, 640),
    ("trtllm", "b300_sxm", "fp4", 1024, 1024): (64, 16, 1, 32, 256, 512, 768, 64, 1, 4, 64, 512, 1024, 256),
    ("trtllm", "b300_sxm", "fp8", 1024, 1024): (1, 16, 256, 128, 16, 512, 256, 128, 48, 64, 64, 64, 1024),
    ("trtllm", "b300_sxm", "fp4", 8192, 1024): (256, 8, 1, 4, 16, 128, 32, 16, 1, 2, 32, 128, 256),
    ("trtllm", "b300_sxm", "fp8", 8192, 1024): (16, 1, 4, 8, 16, 64, 16, 2, 32, 64, 64, 128, 384),
    ("trtllm", "h100_sxm", "fp8", 1024, 1024): ((1, 2, 8, 16, 32), 4, 128, 32, 64, (1, 2, 8, 16), (4, 8, 16, 32), 256),
    ("trtllm", "h100_sxm", "fp8", 8192, 1024): ((1, 2, 8), 4, 8, (1, 2, 8), 64, 16),
    ("trtllm", "h200_sxm", "fp8", 1024, 1024): (256, 128, 256, 128, 128, 256, 128, 128, 128, 512, 512, 512, 256, 256),
    ("trtllm", "h200_sxm", "fp8", 8192, 1024): (32, 32, 32, 32, 64, 512, 32, 32, 16, 32, 256, 32, 128, 32, 128, 256),
    ("trtllm", "gb200", "fp4", 1024, 1024): (4, 8, 256, 64, 768, 512, 16, 768, 32, 1, 256, 64),
    ("trtllm", "gb200", "fp4", 1024, 8192): (4, 1, 4, 16, 64, 128, 256, 1, 4, 8, 16, 64, 128, 256),
    ("trtllm", "gb200", "fp4", 8192, 1024): (8, 4, 64, 16, 256, (16, 16, 16, 1), 8, 32, 128, 256),
    ("trtllm", "gb200", "fp8", 1024, 1024): ((512, 256), 64, 16, (8, 4, 2), (768, 512), 128, (32, 8), (8, 1)),
    ("trtllm", "gb200", "fp8", 1024, 8192): ((256, 64), (16, 2), 2, 256, (64, 16), (8, 1)),
    ("trtllm", "gb200", "fp8", 8192, 1024): (64, 32, 16, 8, 2, (4, 2), 64, 16, 32, 8, (16, 4, 1)),
    ("trtllm", "gb300", "fp4", 1024, 1024): (768, 8, (1, 8, 8, 8, 8), 128, 32, (1, 32, 32, 32, 32), 1024, 32, 256, 64),
    ("trtllm", "gb300", "fp4", 1024, 8192): ((1, 8), (16, 64), 256, 512, (1, 32), 4, (32, 128, 256)),
    ("trtllm", "gb300", "fp4", 8192, 1024): (8, (1, 4, 4), 4, 8, 256, 32, 64, 16, (1, 2), 4, 16, 64, 256, 128),
    ("trtllm", "gb300", "fp8", 1024, 1024): ((1, 4), 4, 16, 32, 128, 512, (1, 4, 16), 32, 128, (512, 768)),
    ("trtllm", "gb300", "fp8", 8192, 1024): ((1, 4), 8, 32, 64, 128, (1, 4, 8), 16, 32, 64, 256),
    ("trtllm", "gb300", "fp8", 1024, 8192): ((1, 4), (4, 16), 64, 256, (1, 8), (8, 32), (128, 256)),
}


def _merged(table: dict, per_key: dict, what: str, merge: Callable[[Entry, Any], Entry]) -> dict:
    """The table with merge(entry, value) for each of its entries under a key of per_key (a value per entry)."""
    out = dict(table)
    for key, values in per_key.items():
        entries = table[key]
        if len(values) != len(entries):
            raise ValueError(f"{key}: {len(values)} {what} for {len(entries)} entries")
        out[key] = tuple(merge(e, v) for e, v in zip(entries, values))
    return out


def _decode_batch(e: Entry, b: Any) -> Entry:
    """The entry with its decode max_batch_size: one value per client count, one for all, or none (0)."""
    b = tuple(b) if isinstance(b, tuple) else (b,) * len(e.concs) if b else ()
    if b and len(b) != len(e.concs):
        raise ValueError(f"{e.concs}: decode batch sizes {b} do not match the client counts")
    return replace(e, batch=b)


TABLE = _merged(TABLE, _DECODE_BATCH, "decode batch sizes", _decode_batch)

# B200 FP8 TensorRT-LLM 8k/1k was measured twice: 2026-02-12 with its prefill workers at EP 8 (the table's entries,
# as nvidia-master.yaml @0004cf5 writes them) and 2026-03-23 with them at EP 1 (the dumps' prefill_moe_ep_size 1,
# `measured=2026-03-23`). The recipes the entries launch set the prefill worker's `moe_expert_parallel_size: 1`
# with `enable_attention_dp: true` and TP 8 (ishandhanani/srt-slurm @e71238b
# recipes/trtllm/b200-fp8/8k1k/mtp/ctx2_gen3_dep8_batch8_eplb0_mtp3_224.yaml: 2 prefill, 3 DEP 8 decode workers,
# decode max_batch_size 8, MTP 3, `concurrencies: [224]`, the table's 224 entry). InferenceX's database dump holds
# the 2026-03-23 run's plain entries (db-dump/2026-04-27 workflow_run_id 333: configs 661, 666, 667, 669, 670) with
# the prefill at attention DP 8, MoE TP 8, EP 1 and the same worker counts as the table's plain entries at 32, 96,
# 128, 256 and 640 clients (4, 6, 1 / 2 / 4, 1 and 2 + 1): the same matrix with the recipe's prefill. Its MTP
# counts (8, 48, 64, 224, 288, 1088: no twin record) take the table's MTP entries with that prefill worker; its
# plain counts keep their twin records.
_PREFILL_EP1_RUN = ("trtllm", "b200_sxm", "fp8", 8192, 1024)
_PREFILL_EP1_SOURCE = "ishandhanani/srt-slurm recipes/trtllm/b200-fp8/8k1k @e71238b"


def _with_prefill_ep1(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    """The entries, then their MTP ones again with the prefill worker at attention DP and EP 1."""
    return entries + tuple(Entry(e.concs, Shape(e.prefill.count, e.prefill.tp, 1, True), e.decode, e.mtp, e.batch)
                           for e in entries if e.mtp > 0)


TABLE[_PREFILL_EP1_RUN] = _with_prefill_ep1(TABLE[_PREFILL_EP1_RUN])


# The prefill ("ctx") worker's TensorRT-LLM `max_batch_size` and `max_num_tokens` of each entry, in TABLE's order,
# as the recipe it launches sets them under `trtllm_config: prefill:` (per attention-DP rank where that worker
# runs `enable_attention_dp: true`: each rank's executor schedules its own batch, SchedulerConfig.adp_per_rank);
# None where not transcribed. Only the configurations whose entries were read from their recipes
# (RECIPE_SOURCES), every recipe of a configuration setting the same pair:
# - H200 1k/1k, ishandhanani/srt-slurm @4893f83 recipes/trtllm/h200/1k1k/stp/c4_ctx1_gen9_tep8_batch256_eplb0_mtp0,
#   c8_ctx1_gen9_tep8_batch256_eplb0_mtp0, mtp/c4_ctx1_gen11_tep8_batch128_eplb0_mtp3,
#   c8_ctx1_gen11_tep8_batch128_eplb0_mtp3 (.yaml): `enable_attention_dp: true`, `max_batch_size: 8`,
#   `max_num_tokens: 8192` (8 ranks).
# - H200 8k/1k, the same commit, recipes/trtllm/h200/8k1k/mtp/c4_ctx1_gen7_tep8_batch32_eplb0_mtp3,
#   stp/c4_ctx1_gen7_tep8_batch32_eplb0_mtp0, mtp/c64_ctx1_gen1_dep8_batch32_eplb0_mtp2: `enable_attention_dp:
#   false`, `max_batch_size: 2`, `max_num_tokens: 16640`.
# Not carried: the B200 FP8 rows (their entries are nvidia-master.yaml's; the 8k/1k row at 8 clients fits two
# entries that disagree on the workers, whose ctx recipes both set 1 and 8,320 a rank: its workers stay assumed,
# and so do its caps), the recipes' `enable_chunked_prefill: false` (every prompt of these rows fits the
# worker's max_num_tokens, so a chunk never forms either way; the simulator's check that an unchunked budget
# holds max_model_len, ISL + OSL, would refuse 8,320 beside 9,216).
_PREFILL_CAPS: dict[tuple[str, str, str, int, int], tuple[tuple[int, int] | None, ...]] = {
    # The entries after the first four (1k/1k) and three (8k/1k) are the layout audit's, above 88 and 64 clients
    # (recipes whose ctx caps were not transcribed): None.
    ("trtllm", "h200_sxm", "fp8", 1024, 1024): ((8, 8192),) * 4 + (None,) * 10,
    ("trtllm", "h200_sxm", "fp8", 8192, 1024): ((2, 16640),) * 3 + (None,) * 13,
    # GB200 FP4 8k/1k: the configuration's one recipe in the library, ishandhanani/srt-slurm @46d030c recipes/trtllm/
    # gb200-fp4/8k1k/mtp/ctx1_gen4_tep8_batch4_eplb0_mtp3.yaml (the first entry's: 1 prefill, 4 TEP 8 decode workers,
    # MTP 3): `enable_attention_dp: true`, TP 4 / EP 4, `max_batch_size: 2`, `max_num_tokens: 16640`. Carried to
    # the configuration's other entries, whose recipes are not in the library: every one runs the same prefill
    # worker (TP 4 / EP 4, attention DP), and the ctx workers of the same family's 8k/1k recipes read keep
    # `max_batch_size: 2` at every entry (NVIDIA/srt-slurm recipes/trtllm/gb300-fp8/8k1k/stp
    # ctx1_gen4_tep8_batch1_eplb0_mtp0_4 @527855c and ctx6_gen1_dep32_batch16_eplb0_mtp0_512 @35088b5: 2, 8,232;
    # ctx7_gen1_dep16_batch64_eplb0_mtp0_1229 @5f23377: 2, 16,384).
    ("trtllm", "gb200", "fp4", 8192, 1024): ((2, 16640),) * 10,
    # GB200 FP4 1k/8k (RECIPE_SOURCES): every 1k8k recipe read sets its ctx worker (TP 4 / EP 4, attention DP)
    # `max_batch_size: 16`, `max_num_tokens: 16384` (mtp/ctx1_gen7_tep8_batch4_eplb0_mtp3, ctx1_gen7_tep8_batch1_eplb0_mtp3,
    # ctx1_gen1_dep32_batch256_eplb288_mtp1, stp/ctx1_gen7_tep8_batch1_eplb0_mtp0, ctx1_gen15_tep4_batch4_eplb0_mtp0
    # @5a156f6; ishandhanani @12b62f4's _lowconc copy the same).
    ("trtllm", "gb200", "fp4", 1024, 8192): ((16, 16384),) * 14,
}
# The configurations whose caps come from a recipe of theirs read apart from the entries (not from RECIPE_SOURCES).
PREFILL_CAPS_RECIPES = {
    ("trtllm", "gb200", "fp4", 8192, 1024):
        "ishandhanani/srt-slurm recipes/trtllm/gb200-fp4/8k1k/mtp/ctx1_gen4_tep8_batch4_eplb0_mtp3.yaml @46d030c",
}


TABLE = _merged(TABLE, _PREFILL_CAPS, "prefill caps", lambda e, c: replace(e, prefill_caps=c or (0, 0)))

# Configurations whose client counts at that commit are one dump's only (the other dump holds counts that
# matrix does not run: GB200 FP4 1k/1k's 2026-04-06 rows at 16, 32, 64, 128, 144, ..., the GB200 SGLang
# 2026-04-06 rows at 2, 16, 64, 128, 256, ...).
_ONLY_DUMP: dict[tuple[str, str, str, int, int], str] = {
    ("trtllm", "gb200", "fp4", 1024, 1024): "source_file=2026-03-25.csv",
    ("trtllm", "gb200", "fp4", 8192, 1024): "source_file=2026-03-25.csv",
    ("sglang", "gb200", "fp8", 1024, 1024): "source_file=2026-03-25.csv",
    ("sglang", "gb200", "fp8", 8192, 1024): "source_file=2026-03-25.csv",
    ("sglang", "gb200", "fp4", 1024, 1024): "source_file=2026-03-25.csv",
    ("sglang", "gb200", "fp4", 8192, 1024): "source_file=2026-03-25.csv",
}

# Client counts both dumps hold for a configuration that no entry of @0004cf5 lists, dated to it by the rest:
# TensorRT-LLM B300 FP8 8k/1k's dumps hold 13 counts, 11 of them exactly its entries' (8, 16, 20, 40, 64, 72, 144,
# 256, 512, 1,075, 3,072: one entry or two each, and no entry's count the dumps lack), under the file's image; 5
# and 10 (measured 2026-02-12, as 20-3,072) are in no entry of @0004cf5, and no other source read gives them:
# @48f302c (older; read whole, 2026-12-06) has no dsr1-fp8-b300-dynamo-trt at all, and the srt-slurm copies the
# library stores hold no b300-fp8 TensorRT-LLM recipe. Their rows fit no entry (candidates) and take the nearest of
# their shape (assumed_entry, flagged).
_UNLISTED_COUNTS: dict[tuple[str, str, str, int, int], tuple[int, ...]] = {
    ("trtllm", "b300_sxm", "fp8", 8192, 1024): (5, 10),
}


# Configurations whose dump rows hold runs of more than one matrix, so a row's configuration and client count do not
# date it to @0004cf5's: SGLang B200 FP8 8k/1k's dumps hold runs with the prefill worker at TP 8, EP 8 (the client
# counts 4-512 of @0004cf5's entries, e.g. 32 of its plain 1P1D and 1P6D TEP 8 and MTP 1P1D entries) and runs at
# prefill attention DP 8, EP 1 (8-1,024 clients, 160 and 288 among them: a later matrix, whose recipe file is read
# instead: TABLE's prefill-EP-1 entries). A dump row takes an entry only where its db-dump twin's layout is one
# (the twins of configs 453-459 are @0004cf5's 1P1D / 1P4D TEP 8, 1P1D and 2P1D DEP 8 entries, those of 639-655
# the recipe's); db-dump records fit by their own layout as everywhere (_db_dump_candidates).
_TWIN_DATED = frozenset({("sglang", "b200_sxm", "fp8", 8192, 1024)})


# Configurations read from the recipes InferenceX launches, not from nvidia-master.yaml @0004cf5, whose client
# counts differ from the dumps' for them. The H200 TensorRT-LLM recipes (ishandhanani/srt-slurm @4893f83,
# recipes/trtllm/h200/{1k1k,8k1k}/{mtp,stp}/c<N>_ctx<P>_gen<D>_..._mtp<K>.yaml, named by nvidia-master.yaml
# @48f302c's dsr1-fp8-h200-dynamo-trt CONFIG_FILEs) each set `benchmark: concurrencies:` to the total the dumps
# hold (c8_ctx1_gen11_..._mtp3: "88", c4_ctx1_gen9_..._mtp0: "36", c64_ctx1_gen1_dep8_..._mtp2: "64"), while the
# yaml's conc-list gives the per-decode-worker N (8, 4, 64). The recipe's own numbers are what dates it to the
# rows: each transcribed count is one the dumps hold (tests/sim/test_validate_inferencex.py); counts the dumps hold
# and no recipe read gives (1k/1k 11 and 13, 8k/1k 9), or recipes that disagree on the workers give (1k/1k 1,024;
# 8k/1k 48, 128, 160: unless a db-dump twin's layout picks one), keep their twin record or the assumption; the recipes' container is the rows' image
# (tensorrtllm-runtime 0.8.1.post1).
# GB200 FP4 1k/8k likewise: nvidia-master.yaml @0004cf5 (and @48f302c, the same 1k/8k entries) launches fourteen
# recipes, ishandhanani/srt-slurm sa-submission-q1-2026 recipes/trtllm/gb200-fp4/1k8k/{mtp,stp}/*.yaml (its
# CONFIG_FILEs), with conc-lists [4, 8, 12, 24, 48], [7], [128], [512], [3072], [6144], [8192] (MTP) and [5], [60],
# [135], [563], [2048], [4096], [8192] (STP). The recipes of those names (read at connorcarpenter15/srt-slurm
# @5a156f6, a copy holding all fourteen; ishandhanani/srt-slurm @12b62f4's mtp/ctx1_gen7_tep8_batch1_eplb0_mtp3_lowconc
# agrees: 7 TEP 8 decode workers, batch 1, MTP 3, concurrencies "7") set `benchmark: concurrencies` to 28
# (ctx1_gen7_tep8_batch4_eplb0_mtp3: 7 workers x batch 4, not the matrix's 4-48), 7 (both ctx1_gen7_tep8_batch1, not
# the STP entry's 5), and the matrix's own count for the other twelve: together exactly the dumps' 12 counts (7, 28,
# 60, 128, 135, 512, 563, 2,048, 3,072, 4,096, 6,144, 8,192, both dumps; measured 2026-03-23, image 0.8.1.post2),
# with two runs at 7 and 8,192 (MTP and STP: the 2026-03-25 dump's two rows at each). The 8k/1k recipes of the same
# copy set the matrix's conc-lists ("4x8x12x24x48", "12x44x76"): there the matrix and the recipes agree.
RECIPE_SOURCES: dict[tuple[str, str, str, int, int], str] = {
    ("trtllm", "gb200", "fp4", 1024, 8192): "ishandhanani/srt-slurm recipes/trtllm/gb200-fp4/1k8k (sa-submission-q1-2026; "
                                            "read at connorcarpenter15/srt-slurm @5a156f6)",
    ("trtllm", "h200_sxm", "fp8", 1024, 1024): "ishandhanani/srt-slurm recipes/trtllm/h200/1k1k @4893f83",
    ("trtllm", "h200_sxm", "fp8", 8192, 1024): "ishandhanani/srt-slurm recipes/trtllm/h200/8k1k @4893f83",
}


# gpt-oss-120b TensorRT-LLM GB200 disaggregated (InferenceX's Dynamo runs, measured 2026-01-07), from the
# srt-slurm recipes ishandhanani/srt-slurm recipes/trtllm/gptoss-fp4/{1k1k,8k1k}/stp/ctx<P>_gen<D>_<tp|dep><N>_
# batch<B>_eplb0_mtp0.yaml (@908ea00 and @4b96b32; read 2026-12-05): every recipe one GPU a prefill worker (TP 1,
# EP 1), no MTP. Each recipe's `benchmark: concurrencies` is the total; the dumps' rows at each decode TP hold
# counts those lists give (1k/1k TP 4: 1-128 from ctx1_gen1_tp4_batch256 "1x2x4x16x32x64x128", 256 and 1,536 from
# ctx1_gen1_dep4_batch512 "256x1024x1536", 3,072 from ctx1_gen3_dep4_batch1024 "3072"; TP 2: 16 from
# ctx1_gen4_tp2_batch32 "16"; 8k/1k TP 4: 2-64 from ctx1_gen1_tp4_batch128 "2x4x8x16x32x64", 512 from
# ctx2_gen1_tp4_batch1024 "128x512"; TP 2: 128 and 512 from ctx2_gen1_dep2_batch512 "128x512", 256 and 384 from
# ctx2_gen1_tp2_batch512 "256x384"; TP 8: 1 from ctx1_gen1_tp8_batch4 "1"); the row's own decode TP picks between
# recipes that run one count at different decode TPs. Left out: 1k/1k TP 2 at 256-2,560, run by both
# ctx1_gen1_dep2_batch1536 ("256x512x1024x2048x2560") and ctx1_gen2_dep2_batch1536 ("512x1024x2048x2560"), one or
# two decode workers (256 is the first's alone, but its decode ep was not read).
_GPTOSS_P1 = (1, 1, 1, False)
GPTOSS_TABLE: dict[tuple[str, str, str, int, int], tuple[Entry, ...]] = {
    ("trtllm", "gb200", "fp4", 1024, 1024): (
        Entry((1, 2, 4, 16, 32, 64, 128), Shape(*_GPTOSS_P1), Shape(1, 4, 1, False), 0, (256,) * 7),
        Entry((256, 1024, 1536), Shape(*_GPTOSS_P1), Shape(1, 4, 4, True), 0, (512,) * 3),
        Entry((3072,), Shape(*_GPTOSS_P1), Shape(3, 4, 4, True), 0, (1024,)),
        Entry((16,), Shape(*_GPTOSS_P1), Shape(4, 2, 1, False), 0, (32,)),
    ),
    ("trtllm", "gb200", "fp4", 8192, 1024): (
        Entry((2, 4, 8, 16, 32, 64), Shape(*_GPTOSS_P1), Shape(1, 4, 1, False), 0, (128,) * 6),
        Entry((128, 512), Shape(2, 1, 1, False), Shape(1, 4, 1, False), 0, (1024,) * 2),
        Entry((128, 512), Shape(2, 1, 1, False), Shape(1, 2, 2, True), 0, (512,) * 2),
        Entry((256, 384), Shape(2, 1, 1, False), Shape(1, 2, 1, False), 0, (512,) * 2),
        Entry((1,), Shape(*_GPTOSS_P1), Shape(1, 8, 1, False), 0, (4,)),
    ),
}
_GPTOSS_SOURCE = "ishandhanani/srt-slurm recipes/trtllm/gptoss-fp4 @908ea00/@4b96b32"

# Kimi-K2.5 TensorRT-LLM GB200 FP4 disaggregated (the 2026-03-25 dump's rows, measured 2026-04-02; none has worker
# counts or a twin record). Not from nvidia-master.yaml: the versions the library holds (@0004cf5, read whole;
# @48f302c and @4026323, older) have no `kimik2.5-fp4-gb200-dynamo-trt` entry, and the InferenceX pull request that
# adds it (SemiAnalysisAI/InferenceX#1026, 2026-04-13: "7 STP" and "8 MTP" entries an ISL, recipes from
# NVIDIA/srt-slurm branch sa-submission-q2-2026) postdates the runs. Read instead from the recipes themselves,
# NVIDIA/srt-slurm recipes/kimi2.5/trtllm_dynamo/disagg/gb200Nvfp4/ISL{1K,8K}_OSL1K/STP/ @0858f39 (read
# 2026-12-06): ctx<P>dep4_gen<D><tep|dep><N>_batch<B>_..._mtp0.yaml, every prefill worker TP 4, EP 4,
# `enable_attention_dp: true`; `tep`: decode TP N, EP N, `enable_attention_dp: false`; `dep`: the same with attention
# DP; decode `max_batch_size` B (a rank's under attention DP). Each recipe's `benchmark: concurrencies` is the total,
# and the fourteen STP recipes at that commit hold exactly the dump's counts at each decode TP (1k/1k TP 4:
# gen5tep4_batch8_allconc "5x15x30x55"; TP 8: gen4tep8_batch128_allconc "4x192x360x668", gen1dep8_batch768_allconc
# "4301x6452"; TP 16: ctx1 gen1dep16_batch32 "666", ctx2 gen1dep16_batch256 "4301"; TP 32: ctx1 gen1dep32_batch64
# "2253", ctx2 gen1dep32_batch128 "4301"; 8k/1k TP 4: gen5tep4_batch16_allconc "5x15x30x60x105", gen4tep4_batch32
# "156"; TP 8: gen4tep8_batch1 "4", ctx5 gen1dep8_batch256 "2151"; TP 16: ctx2 gen1dep16_batch16 "333", ctx3
# gen1dep16_batch32 "615", ctx7 gen1dep16_batch128 "2253"): one recipe a row. Left out: the MTP recipes beside them
# (Eagle drafts, `max_draft_len` 3 or 1, a separate Kimi-K2.5-Thinking-Eagle3 model, not a NextN layer): their counts
# are not the dump's (e.g. 1k/1k ISL1K_OSL1K/MTP/ctx1dep4_gen5tep4_batch2_allconc_eplb0_mtp3 "10x15",
# gen4tep8_batch64_allconc_eplb0_mtp3 "8x48x92x192x336"), so the rows are the STP runs; and the later per-count STP
# recipes of the same folder (other commits, InferenceX#1797's June matrix, counts such as 1,127 the dump lacks).
# The dump writes these rows' prefill and decode expert parallelism as EP 1 (moe_tp_size = tp_size) where every
# recipe runs EP = TP: for these models a row is matched on its prefill TP and decode TP only (_EP_UNWRITTEN).
_GB200_FP4_P2 = (2, 4, 4, True)
KIMI_TABLE: dict[tuple[str, str, str, int, int], tuple[Entry, ...]] = {
    ("trtllm", "gb200", "fp4", 1024, 1024): (
        Entry((5, 15, 30, 55), Shape(*_GB200_FP4_P), Shape(5, 4, 4, False), 0, (8,) * 4),
        Entry((4, 192, 360, 668), Shape(*_GB200_FP4_P), Shape(4, 8, 8, False), 0, (128,) * 4),
        Entry((4301, 6452), Shape(*_GB200_FP4_P), Shape(1, 8, 8, True), 0, (768,) * 2),
        Entry((666,), Shape(*_GB200_FP4_P), Shape(1, 16, 16, True), 0, (32,)),
        Entry((4301,), Shape(*_GB200_FP4_P2), Shape(1, 16, 16, True), 0, (256,)),
        Entry((2253,), Shape(*_GB200_FP4_P), Shape(1, 32, 32, True), 0, (64,)),
        Entry((4301,), Shape(*_GB200_FP4_P2), Shape(1, 32, 32, True), 0, (128,)),
    ),
    ("trtllm", "gb200", "fp4", 8192, 1024): (
        Entry((5, 15, 30, 60, 105), Shape(*_GB200_FP4_P), Shape(5, 4, 4, False), 0, (16,) * 5),
        Entry((156,), Shape(*_GB200_FP4_P), Shape(4, 4, 4, False), 0, (32,)),
        Entry((4,), Shape(*_GB200_FP4_P), Shape(4, 8, 8, False), 0, (1,)),
        Entry((2151,), Shape(5, 4, 4, True), Shape(1, 8, 8, True), 0, (256,)),
        Entry((333,), Shape(*_GB200_FP4_P2), Shape(1, 16, 16, True), 0, (16,)),
        Entry((615,), Shape(3, 4, 4, True), Shape(1, 16, 16, True), 0, (32,)),
        Entry((2253,), Shape(7, 4, 4, True), Shape(1, 16, 16, True), 0, (128,)),
    ),
}
_KIMI_SOURCE = "NVIDIA/srt-slurm recipes/kimi2.5/trtllm_dynamo/disagg/gb200Nvfp4 STP @0858f39"

# GLM-5 TensorRT-LLM GB200 FP4 disaggregated (the 2026-03-25 dump's rows, measured 2026-04-02; no worker counts, no
# twin record), likewise from recipes: no matrix version the library holds has `glm5-fp4-gb200-dynamo-trt`, added by
# SemiAnalysisAI/InferenceX#1803 (STP) and #1800 (MTP) on 2026-06-16. NVIDIA/srt-slurm
# recipes/GLM5/disagg/trtllm_dynamo/gb200_nvfp4/ISL{1K,8K}_OSL1K/STP/ holds recipes of several dates (NVIDIA/srt-slurm
# #8, 2026-04-03: "7" 1k/1k and "6" 8k/1k STP configs; #61's later "Apr-09 points"); the set dated to the rows is the
# thirteen whose versions @b8ae71a or @10b3798 (read 2026-12-06) launch the build
# `trtllm-glm5-xqiao-main3-aarch64-20260402.sqsh`, the rows' measuring day: 1k/1k TP 4 ctx1dep4_gen5tep4_batch8_allconc
# "5 15 30 50" (@10b3798); TP 8 ctx1dep4_gen4tep8_batch128_allconc "4 180 360 616" (@b8ae71a; its later version
# @4f670a8 runs "84x168x336x616"); TP 16 ctx2dep4_gen1dep16_batch128 "2253", ctx2dep4_gen1dep16_batch512_eplb256
# "8192" (@b8ae71a); TP 32 ctx1dep4_gen1dep32_batch32 "1229" (@10b3798), ctx2dep4_gen1dep32_batch64 "2253",
# ctx4dep4_gen1dep32_batch256_eplb288 "8192" (@b8ae71a); 8k/1k TP 4 ctx1dep4_gen5tep4_batch8_allconc "5 10 25 50",
# ctx1dep4_gen3tep4_batch32 "117"; TP 8 ctx1dep4_gen2tep8_batch32 "84" (@10b3798); TP 16 ctx10dep4_gen1dep16_batch128
# "2253"; TP 32 ctx5dep4_gen1dep32_batch16 "615", ctx8dep4_gen1dep32_batch32 "1229" (@b8ae71a). They hold exactly the
# dump's 22 counts per decode TP, one recipe a row. Shapes as KIMI_TABLE's (prefill DEP 4; `tep`: TP attention,
# `dep`: attention DP; decode max_batch_size B a rank). Left out: the recipes with no version at either commit
# (e.g. 8k/1k ctx4dep4_gen1dep32_batch16 "615" @adf51d1 and ctx6dep4_gen1dep32_batch32 "1229" @cace8ad, other
# builds, which would give those counts other prefill workers), and the MTP recipes (added later, #23 / #48).
# The dump writes EP 1 here too (_EP_UNWRITTEN).
GLM5_TABLE: dict[tuple[str, str, str, int, int], tuple[Entry, ...]] = {
    ("trtllm", "gb200", "fp4", 1024, 1024): (
        Entry((5, 15, 30, 50), Shape(*_GB200_FP4_P), Shape(5, 4, 4, False), 0, (8,) * 4),
        Entry((4, 180, 360, 616), Shape(*_GB200_FP4_P), Shape(4, 8, 8, False), 0, (128,) * 4),
        Entry((2253,), Shape(*_GB200_FP4_P2), Shape(1, 16, 16, True), 0, (128,)),
        Entry((8192,), Shape(*_GB200_FP4_P2), Shape(1, 16, 16, True), 0, (512,)),
        Entry((1229,), Shape(*_GB200_FP4_P), Shape(1, 32, 32, True), 0, (32,)),
        Entry((2253,), Shape(*_GB200_FP4_P2), Shape(1, 32, 32, True), 0, (64,)),
        Entry((8192,), Shape(4, 4, 4, True), Shape(1, 32, 32, True), 0, (256,)),
    ),
    ("trtllm", "gb200", "fp4", 8192, 1024): (
        Entry((5, 10, 25, 50), Shape(*_GB200_FP4_P), Shape(5, 4, 4, False), 0, (8,) * 4),
        Entry((117,), Shape(*_GB200_FP4_P), Shape(3, 4, 4, False), 0, (32,)),
        Entry((84,), Shape(*_GB200_FP4_P), Shape(2, 8, 8, False), 0, (32,)),
        Entry((2253,), Shape(10, 4, 4, True), Shape(1, 16, 16, True), 0, (128,)),
        Entry((615,), Shape(5, 4, 4, True), Shape(1, 32, 32, True), 0, (16,)),
        Entry((1229,), Shape(8, 4, 4, True), Shape(1, 32, 32, True), 0, (32,)),
    ),
}
_GLM5_SOURCE = "NVIDIA/srt-slurm recipes/GLM5/disagg/trtllm_dynamo/gb200_nvfp4 STP @b8ae71a/@10b3798"


def _with_prefill_caps(table: dict, caps: dict) -> dict:
    """The table with each configuration's prefill worker caps (max_batch_size, max_num_tokens a rank) on every entry."""
    return {key: tuple(replace(e, prefill_caps=caps[key]) for e in entries) for key, entries in table.items()}


# The ctx (prefill) workers' `max_batch_size` and `max_num_tokens`, a rank's (`enable_attention_dp: true`), the same
# in every recipe of a configuration: Kimi-K2.5 1k/1k 16 and 16,384 (e.g. ISL1K_OSL1K/STP/
# ctx1dep4_gen1dep16_batch32_eplb0_mtp0.yaml @0858f39), 8k/1k 2 and 16,384 (ISL8K_OSL1K/STP/
# ctx7dep4_gen1dep16_batch128_eplb0_mtp0.yaml @0858f39); GLM-5 1k/1k 16 and 16,384, 8k/1k 2 and 16,640
# (ISL8K_OSL1K/STP/ctx10dep4_gen1dep16_batch128_eplb0_mtp0.yaml @b8ae71a). Applied as the DeepSeek-R1 recipes' caps
# are (_PREFILL_CAPS; sim/validate_rows.py: per attention rank, SchedulerConfig.adp_per_rank).
KIMI_TABLE = _with_prefill_caps(KIMI_TABLE, {("trtllm", "gb200", "fp4", 1024, 1024): (16, 16384),
                                             ("trtllm", "gb200", "fp4", 8192, 1024): (2, 16384)})
GLM5_TABLE = _with_prefill_caps(GLM5_TABLE, {("trtllm", "gb200", "fp4", 1024, 1024): (16, 16384),
                                             ("trtllm", "gb200", "fp4", 8192, 1024): (2, 16640)})
# The tables by the rows' model: DeepSeek-R1's from nvidia-master.yaml and its recipes, gpt-oss-120b's, Kimi-K2.5's
# and GLM-5's from recipes.
_MODEL_TABLES = {"DeepSeek-R1": TABLE, "gpt-oss-120b": GPTOSS_TABLE, "Kimi-K2.5": KIMI_TABLE, "GLM-5": GLM5_TABLE}
_MODEL_SOURCES = {"gpt-oss-120b": _GPTOSS_SOURCE, "Kimi-K2.5": _KIMI_SOURCE, "GLM-5": _GLM5_SOURCE}
# Models whose dump rows write the expert parallelism as EP 1 whatever ran (KIMI_TABLE, GLM5_TABLE): matched without.
_EP_UNWRITTEN = frozenset({"Kimi-K2.5", "GLM-5"})


def _own_shape_fits(row: Any, e: Entry) -> bool:
    """Whether the row's own prefill TP, prefill EP and decode TP are the entry's (prefill and decode TP only for the
    models whose dumps leave the expert parallelism unwritten: _EP_UNWRITTEN)."""
    p_tp, p_ep, d_tp = (_num(row.get(c)) for c in ("prefill_tp_size", "prefill_moe_ep_size", "decode_tp_size"))
    if str(row.get("model")) in _EP_UNWRITTEN:
        return (p_tp, d_tp) == (e.prefill.tp, e.decode.tp)
    return (p_tp, p_ep, d_tp) == (e.prefill.tp, e.prefill.ep, e.decode.tp)


def dumps(key: tuple[str, str, str, int, int]) -> tuple[str, ...]:
    """The dumps whose rows a configuration's entries are read for."""
    only = _ONLY_DUMP.get(key)
    return (only,) if only else _DUMPS


def _num(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else int(f)


# Configurations whose plain and MTP entries are separate InferenceX configurations with their own images
# (nvidia-master.yaml @0004cf5: dsr1-fp4-b200-dynamo-sglang `image: lmsysorg/sglang:v0.5.8.post1-cu130-runtime`,
# dsr1-fp4-b200-dynamo-sglang-mtp `image: "lmsysorg/sglang:v0.5.8.post1-cu130"`): a row's own image (its
# silicon_data_source `image=`) says which of the two it ran. (backend, system, precision) -> {ran MTP: image}.
ENTRY_IMAGES: dict[tuple[str, str, str], dict[bool, str]] = {
    ("sglang", "b200_sxm", "fp4"): {False: "lmsysorg/sglang:v0.5.8.post1-cu130-runtime",
                                    True: "lmsysorg/sglang:v0.5.8.post1-cu130"},
}


def row_image(row: Any) -> str:
    """The container image a row's silicon_data_source names (`image=...`), or ''."""
    for part in str(row.get("silicon_data_source", "")).split(";"):
        key, _, value = part.strip().partition("=")
        if key == "image":
            return value
    return ""


# InferenceX's database dump (aiconfigurator-core's `db-dump/2026-04-27; config_id=...` records, model written
# DeepSeek-V3 for the dsr1 configurations: their ids begin `dsr1_`) writes each disaggregated worker kind whole:
# `<side>_num_workers` workers, each of tp_size x attention_dp_size GPUs with the experts moe_tp_size x
# moe_ep_size over the same GPUs. Read against the matrix, on the development DeepSeek-R1 rows' twin records
# (sim/validate_twins.py; docs/validate-accuracy.md "InferenceX's database dump read against the matrix"): an
# entry's worker (count, tp, ep, dp-attn) is written (count, 1, tp, tp / ep, ep) under attention DP and
# (count, tp, 1, tp / ep, ep) without, i.e. the entry's tp is tp_size x attention_dp_size, its ep moe_ep_size, its
# dp-attn attention_dp_size > 1. Of the 229 development rows that fit one entry by their own columns and have a
# db-dump twin, 225 twins are recovered by this rule; the 4 others (H200 TensorRT-LLM, measured 2026-02-14) write
# the prefill worker's attention DP against the srt-slurm recipe TABLE takes it from (RECIPE_SOURCES): for those
# configurations the attention-DP flag is not compared (_layout_fits), and all 229 are recovered.
DB_DUMP = "db-dump/"
_DB_DUMP_MODELS = frozenset({"DeepSeek-R1", "DeepSeek-V3"})  # one checkpoint shape (validate_twins._SAME_SHAPE)
_DB_DUMP_FIELDS = ("num_workers", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")


def db_dump_record(row: Any) -> bool:
    """Whether the row is a disaggregated record of InferenceX's database dump of a dsr1 configuration."""
    return (row.get("mode") == "disagg" and str(row.get("silicon_data_source", "")).startswith(DB_DUMP)
            and str(row.get("model")) in _DB_DUMP_MODELS)


def db_dump_shape(row: Any, side: str, prefix: str = "") -> Shape | None:
    """One worker kind of a db-dump record as the matrix writes it (the rule above), from the columns
    `<prefix><side>_<field>`; None where a column is missing or the experts do not cover the worker's GPUs."""
    n, tp, adp, moe_tp, moe_ep = (_num(row.get(f"{prefix}{side}_{f}")) for f in _DB_DUMP_FIELDS)
    if any(v is None or v < 1 for v in (n, tp, adp, moe_tp, moe_ep)):
        return None
    gpus = tp * adp
    if moe_tp * moe_ep != gpus:
        return None
    return Shape(n, gpus, moe_ep, adp > 1)


def db_dump_image(row: Any) -> str:
    """A db-dump record's container image: the last `;` part of its silicon_data_source (no `image=` key)."""
    last = str(row.get("silicon_data_source", "")).split(";")[-1].strip()
    return "" if "=" in last else last


def _same_worker(entry: Shape, written: Shape, dp_free: bool) -> bool:
    if dp_free:
        return (entry.count, entry.tp, entry.ep) == (written.count, written.tp, written.ep)
    return entry == written


def _layout_fits(key: tuple, fits: list[Entry], row: Any, prefix: str) -> list[Entry]:
    """The entries whose workers are the db-dump layout columns `prefix...` of the row (the rule above)."""
    pre, dec = db_dump_shape(row, "prefill", prefix), db_dump_shape(row, "decode", prefix)
    if pre is None or dec is None:
        return []
    dp_free = key in RECIPE_SOURCES
    return [e for e in fits if _same_worker(e.prefill, pre, dp_free) and _same_worker(e.decode, dec, dp_free)]


def _db_dump_candidates(row: Any) -> list[Entry]:
    """The entries a db-dump record is: its configuration, client count and both workers by the rule above (and
    its image where the plain and MTP entries ran different ones: ENTRY_IMAGES)."""
    key = (str(row.get("backend")), str(row.get("system")), str(row.get("precision")),
           _num(row.get("isl")), _num(row.get("osl")))
    conc = _num(row.get("concurrency"))
    fits = _layout_fits(key, [e for e in TABLE.get(key, ()) if conc in e.concs], row, "")
    images = ENTRY_IMAGES.get(key[:3])
    if images is not None:
        fits = [e for e in fits if images[e.mtp != 0] == db_dump_image(row)]
    return fits


def candidates(row: Any) -> list[Entry]:
    """The table's entries that fit the row: its configuration, client count and its own TP/EP columns (and its
    image, where the plain and MTP entries ran different ones: ENTRY_IMAGES). A db-dump record fits by both its
    workers (_db_dump_candidates). A dump row with a db-dump twin record (sim/validate_twins.py) keeps, of the
    entries its own columns fit, those the twin's layout is, where several fit; and where the row's dump is not
    the one _ONLY_DUMP dates its configuration to, the entries the twin's layout is are the row's (the twin's
    whole layout dates the run: the 2026-04-06 dump's GB200 rows measured 2026-02-08/09 and 2026-03-23 are the
    runs the 2026-03-25 dump holds from those dates; its GB200 rows of 2025-12 have no twin whose layout
    is an entry's)."""
    if db_dump_record(row):
        return _db_dump_candidates(row)
    table = _MODEL_TABLES.get(str(row.get("model")))
    if row.get("mode") != "disagg" or table is None:
        return []
    key = _key(row)
    src = str(row.get("silicon_data_source", ""))
    if not src.startswith(_DUMPS):
        return []
    # _ONLY_DUMP dates DeepSeek-R1's configurations; the recipe tables' counts are their dumps' (both, for gpt-oss).
    dated = table is not TABLE or (src.startswith(dumps(key)) and key not in _TWIN_DATED)
    conc = _num(row.get("concurrency"))
    fits = [e for e in _own_entries(row, table, key) if conc in e.concs]
    if table is TABLE and _is_db_dump_twin(row) and (not dated or len({(e.prefill, e.decode) for e in fits}) > 1):
        by_twin = _layout_fits(key, fits, row, "twin_")
        return by_twin if by_twin or not dated else fits
    return _not_plain_sibling(key, fits, row) if dated and table is TABLE else fits if dated else []


def _not_plain_sibling(key: tuple, fits: list[Entry], row: Any) -> list[Entry]:
    """`fits` without the plain entries of the layout of a db-dump-twinned plain run beside the row (another run at
    its configuration, client count and measured day: validate_twins.add_plain_siblings), where any entry stays."""
    if not fits or _num(row.get(f"{PLAIN_SIBLING}decode_num_workers")) is None:
        return fits
    sibling = set(_layout_fits(key, [e for e in fits if e.mtp == 0], row, PLAIN_SIBLING))
    rest = [e for e in fits if e not in sibling]
    return rest if rest and sibling else fits


def _own_entries(row: Any, table: dict, key: tuple) -> list[Entry]:
    """The table's entries of configuration `key` whose shape is the row's own (_own_shape_fits), and its image
    where the plain and MTP entries ran different ones (ENTRY_IMAGES), whatever their client counts."""
    same = [e for e in table.get(key, ()) if _own_shape_fits(row, e)]
    images = ENTRY_IMAGES.get(key[:3])
    if images is not None:
        same = [e for e in same if images[e.mtp != 0] == row_image(row)]
    return same


def _is_db_dump_twin(row: Any) -> bool:
    """Whether the row's twin record (validate_twins.add_twins) is a db-dump record (its id `dsr1_..._cfg<N>`)."""
    twin = row.get("twin_id")
    return isinstance(twin, str) and twin.startswith("dsr1_")


def agreed_mtp(row: Any) -> int | None:
    """The MTP depth every entry that fits the row ran (0: none), also where those entries disagree on the
    worker counts (inferencex_workers gives None there); None where no entry fits or they disagree on MTP.

    B200 FP8 TensorRT-LLM 8k/1k at 8 clients: two entries of nvidia-master.yaml @0004cf5 fit the row (1 prefill
    and 6 or 2 TP 8 decode workers; decode max_batch_size 8 and 32, _DECODE_BATCH), both MTP 3 in TABLE (their
    `spec-decoding: "mtp"` and the `mtp3` of the recipe files they name): the run drafted 3 tokens a step whichever
    of the two it was. Its worker counts stay assumed (sim/validate_layouts.py)."""
    mtps = {e.mtp for e in candidates(row)}
    return mtps.pop() if len(mtps) == 1 else None


def inferencex_workers(row: Any) -> Match | None:
    """The row's prefill and decode workers from InferenceX's matrix; None when no entry fits, or the
    entries that fit disagree on the workers (ambiguous: the caller keeps its assumption)."""
    fits = candidates(row)
    if not fits or len({(e.prefill, e.decode) for e in fits}) > 1:
        return None
    return _match(row, fits)


def _key(row: Any) -> tuple[str, str, str, int | None, int | None]:
    """The row's configuration as the tables key it: (backend, system, precision, ISL, OSL)."""
    return (str(row.get("backend")), str(row.get("system")), str(row.get("precision")),
            _num(row.get("isl")), _num(row.get("osl")))


def _match(row: Any, fits: list[Entry], assumed: str = "") -> Match:
    """The Match of entries that agree on the workers (MTP, decode batch and prefill caps kept where they agree)."""
    mtps = {e.mtp for e in fits}
    conc = _num(row.get("concurrency")) or 0
    batches = {e.batch_at(conc) for e in fits}  # entries that agree on the workers but not the batch: unknown
    caps = {e.prefill_caps for e in fits}  # likewise the prefill worker's caps
    key = _key(row)
    source = _MODEL_SOURCES.get(str(row.get("model"))) or RECIPE_SOURCES.get(key, _SOURCE)
    if key == _PREFILL_EP1_RUN and fits[0].prefill.ep == 1:
        source += f"; prefill EP 1: {_PREFILL_EP1_SOURCE}"
    return Match(fits[0].prefill, fits[0].decode, mtps.pop() if len(mtps) == 1 else None,
                 batches.pop() if len(batches) == 1 else 0, caps.pop() if len(caps) == 1 else (0, 0), source,
                 assumed)


def _same_shape_nearest(row: Any) -> list[Entry]:
    """The entries of the row's configuration whose prefill TP, prefill EP and decode TP are the row's own (and
    its image, where ENTRY_IMAGES tells the plain and MTP entries apart), nearest to its client count: those whose
    client-count list holds the count nearest it on a log scale (every one at that distance). Only InferenceX's
    dumps' rows (_DUMPS): other runs are not this matrix's."""
    table = _MODEL_TABLES.get(str(row.get("model")))
    conc = _num(row.get("concurrency"))
    if (row.get("mode") != "disagg" or table is None or not conc or conc < 1
            or not str(row.get("silicon_data_source", "")).startswith(_DUMPS)):
        return []
    same = _own_entries(row, table, _key(row))
    if not same:
        return []
    dist = [min(abs(math.log(conc / c)) for c in e.concs) for e in same]
    near = min(dist)
    return [e for e, d in zip(same, dist) if d == near]


def pick_pool(row: Any) -> tuple[list[Entry], bool]:
    """The entries assumed_entry picks from, and whether they fit the row's client count: those that fit the row
    (candidates), else the entries of its shape nearest its client count (_same_shape_nearest)."""
    fits = candidates(row)
    return (fits, True) if fits else (_same_shape_nearest(row), False)


def assumed_entry(row: Any) -> Match | None:
    """For a row without worker counts that no single entry of the matrix is (inferencex_workers gives None):
    one entry of its configuration and shape, picked by a declared rule and flagged in its note.

    The entries: those that fit the row (candidates: they disagree on the workers), else the entries of the row's
    configuration and own TP / EP nearest its client count (_same_shape_nearest: a run of a matrix whose
    client-count lists moved). The pick: the most decode workers, then the deepest MTP. Chosen on the development
    rows among the rules experiments/entry_pick_rules.py scores (docs/validate-rows.md, "An InferenceX entry where
    the matrix is ambiguous"); no row's measured figures are read. None where no entry of the row's shape exists
    (the caller's count assumption, validate_layouts.assume_workers, stays)."""
    fits, at_count = pick_pool(row)
    if not fits:
        return None
    n = len({(e.prefill, e.decode, e.mtp) for e in fits})
    how = (f"{n} entries fit" if at_count else
           f"none at {_num(row.get('concurrency'))} clients; {n} of its shape nearest in clients")
    pick = max(fits, key=lambda e: (e.decode.count, e.mtp))
    return _match(row, [pick], f"{how}, the most decode workers, then the deepest MTP")
