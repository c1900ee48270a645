"""Step-time cost models: what one engine step costs, from the batch's shape (StepFeatures).

Roofline-shaped, as in ../shared/FACTS.md (after Vidur, MLSys 2024; Sarathi-Serve, OSDI 2024):
linear layers cost per token, attention per (query, key) pair, decode attention per context token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec
from twinserve.backends.sim.parallel import Parallelism, PipelineCostModel, _loop_step_time


@dataclass(slots=True)
class StepFeatures:
    """The batch shape a cost model prices; q: a request's new tokens, c: its cached tokens."""

    num_prefill_tokens: int = 0  # Σ q over prefill requests
    num_prefill_seqs: int = 0
    prefill_context: int = 0     # Σ c over prefill requests
    prefill_attn: float = 0.0    # Σ q·(c + q/2): causal attention pairs
    num_decode_seqs: int = 0     # requests generating one token
    decode_context: int = 0      # Σ c over decode requests

    def as_args(self) -> tuple[int, int, int, float, int, int]:
        """The features in CostModel.step_time's argument order."""
        return (self.num_prefill_tokens, self.num_prefill_seqs, self.prefill_context,
                self.prefill_attn, self.num_decode_seqs, self.decode_context)


def sliding_pairs(num_prefill_tokens: float, num_prefill_seqs: float, prefill_context: float,
                  prefill_attn: float, window: int) -> float:
    """The causal (query, key) pairs of prefill chunks in a layer with a sliding window.

    A query at position x sees min(x, window) keys, counted continuously as prefill_attn counts
    q·(c + q/2): one chunk gets the integral of min(x, window) over [c, c + q]. Several chunks
    are taken as equal chunks of their mean size (exact for one chunk), at most prefill_attn.
    """
    if not num_prefill_seqs:
        return 0.0
    q, c, w = num_prefill_tokens / num_prefill_seqs, prefill_context / num_prefill_seqs, window
    if c + q <= w:
        per_chunk = q * (c + q * 0.5)
    elif c >= w:
        per_chunk = q * w
    else:
        per_chunk = (w * w - c * c) * 0.5 + (c + q - w) * w
    pairs = num_prefill_seqs * per_chunk
    return pairs if pairs < prefill_attn else prefill_attn


def windowed_features(window: int, share: float, num_prefill_tokens: float, num_prefill_seqs: float,
                      prefill_context: float, prefill_attn: float, num_decode_seqs: float,
                      decode_context: float) -> tuple[float, float, float, float, float, float]:
    """The six features with the attention terms of a `share` of layers capped at a `window`.

    The caps are the roofline's (RooflineCostModel): a sliding layer computes sliding_pairs and
    reads at most `window` cached tokens per sequence.
    """
    if not window or not share:
        return (num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn, num_decode_seqs,
                decode_context)
    pa = prefill_attn - share * (prefill_attn - sliding_pairs(num_prefill_tokens, num_prefill_seqs,
                                                              prefill_context, prefill_attn, window))
    pc = prefill_context - share * (prefill_context - min(prefill_context, num_prefill_seqs * window))
    dc = decode_context - share * (decode_context - min(decode_context, num_decode_seqs * window))
    return (num_prefill_tokens, num_prefill_seqs, pc, pa, num_decode_seqs, dc)


class CostModel(Protocol):
    """Prices one engine step in seconds; the same inputs must always give the same float."""

    name: str

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step with this batch shape."""


@dataclass(slots=True)
class Efficiency:
    """How far below peak real kernels run, plus fixed costs (defaults: catalog.GPUProfile's)."""

    gemm: float = 0.70          # fraction of peak FLOP/s reached by large dense GEMMs
    attention: float = 0.50     # fraction of peak FLOP/s reached by prefill attention
    memory: float = 0.80        # fraction of HBM bandwidth reached when streaming
    comm: float = 0.75          # fraction of link bandwidth reached by large all-reduces
    allreduce_latency_s: float = 35e-6  # fixed cost of one small all-reduce at TP 2 ...
    step_overhead_s: float = 1.5e-3     # scheduler, input prep, sampling, launch
    per_seq_overhead_s: float = 10e-6   # per scheduled request (metadata, sampling)
    allreduce_hop_s: float = 4e-6       # ... plus this per extra GPU in the ring
    layer_floor_s: float = 17e-6        # least time of a layer's attention, and of its GEMMs
    # Router GEMM, top-k and token permutation: three small kernels per MoE layer (~5 us each).
    moe_layer_overhead_s: float = 15e-6

    @classmethod
    def for_hardware(cls, hardware: HardwareSpec, **overrides: float) -> "Efficiency":
        """The GPU's catalog efficiencies; overrides (e.g. from a study file) win."""
        p = hardware.profile
        eff = cls(p.gemm, p.attention, p.memory, p.comm, p.allreduce_latency_s,
                  allreduce_hop_s=p.allreduce_hop_s, layer_floor_s=p.layer_floor_s)
        for name, value in overrides.items():
            setattr(eff, name, value)
        return eff

    def validate(self) -> None:
        """Refuse non-physical factors."""
        for name in ("gemm", "attention", "memory", "comm"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"efficiency {name}={v!r} must be in (0, 1]")
        for name in ("allreduce_latency_s", "allreduce_hop_s", "layer_floor_s",
                     "step_overhead_s", "per_seq_overhead_s", "moe_layer_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"efficiency {name} must be >= 0")

    def allreduce_time(self, nbytes: float, tp: int, link_bandwidth: float) -> float:
        """One ring all-reduce of nbytes over tp GPUs: latency by ring size + 2(tp-1)/tp of the bytes."""
        if tp <= 1:
            return 0.0
        latency = self.allreduce_latency_s + self.allreduce_hop_s * (tp - 2)
        return latency + 2.0 * (tp - 1) / tp * nbytes / (link_bandwidth * self.comm)


# Grouped expert GEMMs: FLOP time plus weight read (the dense layers' soft knee), or the larger of the two.
EXPERT_SOFT_KNEE = True


class RooflineCostModel:
    """Per-GPU step time from FLOPs, bytes and messages, with measured-shaped efficiencies.

    GEMM FLOP time plus weight read is added, not maxed: a soft knee, half efficiency at the
    ridge point. Routed experts are grouped GEMMs: at a few tokens per expert they are bound by
    reading the E(1 - (1 - k/E)^B) experts a B-token step touches, so they cost the larger of
    that read and their FLOPs. Per-layer floors model launches; sliding-window layers read at
    most the window. Parallelism (backends/sim/parallel.py): the step is one stage's, with the
    engine's sequences spread evenly over the attention data-parallel ranks, every rank's tokens
    meeting in the MoE layers, and the experts split over the expert-parallel group.
    """

    __slots__ = ("name", "model", "hardware", "tp", "par", "eff", "_k_tok", "_k_seq", "_w_time",
                 "_k_attn", "_k_kv", "_comm_fixed", "_comm_tok", "_floor", "_c_lin_tok",
                 "_w_expert", "_k_kv_slide", "_window", "_slide_frac", "_k_expert", "_local_experts",
                 "_k_dec_flop", "_dp", "_moe_fixed", "_moe_tok", "_k_state")

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                 efficiency: Efficiency | None = None, parallel: Parallelism | None = None) -> None:
        par = parallel or Parallelism(tensor_parallel_size=tp)
        tp = par.tensor_parallel_size
        par.check(model)
        self.name = "roofline"
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.par = par
        self._dp = dp = par.data_parallel_size
        ep, moe_tp = par.expert_parallel_size, par.moe_tensor_parallel_size
        self.eff = eff = efficiency or Efficiency.for_hardware(hardware)
        eff.validate()
        m = model
        prec = m.precision
        peak_g = hardware.gemm_peak(prec) * eff.gemm
        peak_e = hardware.gemm_peak(prec, experts=True) * eff.gemm
        peak_16 = hardware.peak_flops * eff.gemm
        peak_a = hardware.peak_flops * eff.attention
        bw = hardware.mem_bandwidth * eff.memory
        # Per-rank features: the dense part runs on each DP rank's own tokens at TP tp.
        self._c_lin_tok = 2.0 * m.always_params / tp
        # Linear-attention layers: their recurrent-state FLOPs per token run on the attention kernels.
        self._k_tok = self._c_lin_tok / peak_g + m.linear_attn_flops_per_token / tp / peak_a
        # ... and each sequence in a step reads and writes its fixed-size state once (no K/V growth).
        self._k_state = 2.0 * m.linear_state_bytes_per_seq_per_gpu(tp) / bw
        self._k_seq = 2.0 * m.vocab_size * m.hidden_size / tp / peak_16
        weights = m.always_weight_bytes + m.vocab_size * m.hidden_size * m.dtype_bytes
        self._w_time = weights / tp / bw
        # Experts see every rank's tokens; each GPU holds E / ep of them, each split moe_tp ways, or
        # (E + R) / ep with R redundant replicas (SGLang's EPLB): a busy step reads every physical one,
        # while the routed FLOPs below stay tokens x top-k / ep (a replica takes a share of its expert's
        # tokens, it adds none).
        self._local_experts = par.physical_experts(m) / ep if m.is_moe else 0.0
        self._w_expert = m.num_moe_layers * m.expert_params * prec.expert_weight_bytes / moe_tp / bw
        self._k_expert = (2.0 * m.num_moe_layers * m.num_experts_per_tok * m.expert_params
                          / (moe_tp * ep) / peak_e)
        heads = m.num_full_attention_layers * m.num_heads / tp
        self._k_attn = 2.0 * heads * (m.qk_head_dim + m.v_dim) / peak_a
        # Decode attention FLOPs per cached token: MLA's absorbed form scores the latent plus the
        # rotary key and sums the latent per head; GQA's are small beside its K/V read.
        if m.is_mla:
            self._k_dec_flop = 2.0 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) / peak_a
        else:
            self._k_dec_flop = 0.0
        # K/V bytes per context token, split into full-attention and sliding-window layers.
        kv = m.kv_bytes_per_token_per_gpu(tp) / bw
        self._slide_frac = m.num_sliding_layers / m.num_layers if m.sliding_window else 0.0
        self._k_kv_slide = kv * self._slide_frac
        self._k_kv = kv - self._k_kv_slide
        self._window = m.sliding_window
        self._floor = m.num_layers * eff.layer_floor_s
        if m.is_moe:
            self._w_time += m.num_moe_layers * eff.moe_layer_overhead_s
        link = hardware.collective_bandwidth(tp * dp)
        # Tokens cross GPUs in the MoE layers only when attention DP spreads them: under attention TP
        # every GPU holds every token, runs its own experts on them and the layer all-reduces as usual.
        split_moe = m.is_moe and dp > 1
        # TP all-reduces: two a layer, but one in an MoE layer whose experts exchange tokens instead.
        n_ar = 2 * m.num_layers - (m.num_moe_layers if split_moe else 0)
        if tp > 1:
            latency = eff.allreduce_time(0.0, tp, hardware.collective_bandwidth(tp))
            self._comm_fixed = n_ar * latency
            per_token = eff.allreduce_time(m.hidden_size * m.dtype_bytes, tp,
                                           hardware.collective_bandwidth(tp)) - latency
            self._comm_tok = n_ar * per_token
            if m.qk_norm_across_heads:
                # One more a layer: the ranks' partial q / k variances, two fp32 a token (catalog.ModelSpec).
                self._comm_fixed += m.num_layers * latency
                self._comm_tok += m.num_layers * (eff.allreduce_time(8.0, tp, hardware.collective_bandwidth(tp))
                                                  - latency)
        else:
            self._comm_fixed = 0.0
            self._comm_tok = 0.0
        self._moe_fixed = self._moe_tok = 0.0
        if split_moe:
            self._moe_fixed, self._moe_tok = _moe_exchange(m, eff, tp * dp, ep, moe_tp, link)

    def _linear(self, tokens_r: float, seqs_r: float, tokens: float) -> float:
        """Dense layers on one rank's tokens plus the experts on every rank's, floored."""
        t_lin = self._k_tok * tokens_r + self._k_seq * seqs_r + self._w_time
        if self._local_experts:
            m = self.model
            touched = self._local_experts * (1.0 - (1.0 - m.num_experts_per_tok / m.num_experts) ** tokens)
            read = self._w_expert * touched
            flop = self._k_expert * tokens
            t_lin += flop + read if EXPERT_SOFT_KNEE else (read if read > flop else flop)
        return t_lin if t_lin > self._floor else self._floor

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: overheads + linear + attention + all-reduce and expert exchange."""
        tokens = num_prefill_tokens + num_decode_seqs
        seqs = num_prefill_seqs + num_decode_seqs
        dp = self._dp
        if dp > 1:  # one rank's share; the ranks run in lockstep
            if num_prefill_seqs:
                # Each prompt lives whole on one rank, so the step lasts as long as the rank holding
                # ceil(ps / dp) of them, each of the mean size (the measured backend's rule,
                # AicCostModel._busiest_rank_time, where the engines' sources are cited); the experts
                # still see every rank's tokens (`tokens`).
                share = -(-num_prefill_seqs // dp) / num_prefill_seqs
                num_prefill_tokens, num_prefill_seqs = num_prefill_tokens * share, -(-num_prefill_seqs // dp)
                prefill_context, prefill_attn = prefill_context * share, prefill_attn * share
            num_decode_seqs, decode_context = num_decode_seqs / dp, decode_context / dp
        tokens_r = num_prefill_tokens + num_decode_seqs
        seqs_r = num_prefill_seqs + num_decode_seqs
        floor = self._floor
        t_lin = self._linear(tokens_r, seqs_r, tokens)
        k_kv = self._k_kv
        t_attn = self._k_attn * prefill_attn
        t_pkv = k_kv * (prefill_context + num_prefill_tokens)
        if self._window and num_prefill_tokens:
            w = self._window
            t_attn = (t_attn * (1.0 - self._slide_frac) + self._k_attn * self._slide_frac
                      * sliding_pairs(num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn, w))
            # The chunk's own K/V, and at most a window of cached K/V before it.
            t_pkv += self._k_kv_slide * (min(prefill_context, num_prefill_seqs * w) + num_prefill_tokens)
        if t_attn < t_pkv:
            t_attn = t_pkv
        t_attn += self._decode_kv(decode_context, num_decode_seqs)
        if self._k_state and num_prefill_seqs:
            t_attn += self._k_state * num_prefill_seqs
        if t_attn < floor:
            t_attn = floor
        eff = self.eff
        t = eff.step_overhead_s + eff.per_seq_overhead_s * seqs_r + t_lin + t_attn
        if self._comm_fixed:
            t += self._comm_fixed + self._comm_tok * tokens_r
        if self._moe_fixed:
            t += self._moe_fixed + self._moe_tok * tokens
        return t

    def _decode_kv(self, context: float, n: float) -> float:
        """K/V read time of n decoding sequences over context tokens (windows applied; MLA: or its FLOPs)."""
        t = self._k_kv * (context + n)
        if self._k_dec_flop:
            f = self._k_dec_flop * (context + n)
            t = f if f > t else t
        if self._window:
            t += self._k_kv_slide * min(context + n, n * self._window)
        if self._k_state:
            t += self._k_state * n
        return t

    def decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                          deadline: float) -> tuple[list[float], list[float]]:
        """step_time of consecutive decode-only steps, bit-identical to step_time's floats."""
        dp = self._dp
        n = num_seqs / dp if dp > 1 else num_seqs  # one rank's share, as step_time splits it
        floor = self._floor
        t_lin = self._linear(n, n, num_seqs)
        eff = self.eff
        base = eff.step_overhead_s + eff.per_seq_overhead_s * n + t_lin
        comm = self._comm_fixed + self._comm_tok * n if self._comm_fixed else 0.0
        moe = self._moe_fixed + self._moe_tok * num_seqs if self._moe_fixed else 0.0
        k_kv = self._k_kv
        plain = not self._window and not self._k_dec_flop and not self._k_state
        decode_kv = self._decode_kv
        durations: list[float] = []
        ends: list[float] = []
        add_duration, add_end = durations.append, ends.append
        t = start
        for _ in range(max_steps):
            if t >= deadline:
                break
            c = context / dp if dp > 1 else context
            t_attn = k_kv * (c + n) if plain else decode_kv(c, n)
            if t_attn < floor:
                t_attn = floor
            d = base + t_attn
            if comm:
                d += comm
            if moe:
                d += moe
            t = t + d
            add_duration(d)
            add_end(t)
            context += num_seqs
        return durations, ends

    def max_tokens_per_second(self) -> float:
        """An upper bound on processed tokens per second: linear-layer FLOPs at 100% of peak."""
        m = self.model
        per_tok = self._c_lin_tok + 2.0 * m.num_moe_layers * m.num_experts_per_tok * m.expert_params / self.tp
        return self.hardware.gemm_peak(m.precision) / per_tok


def _moe_exchange(m: ModelSpec, eff: Efficiency, n: int, ep: int, moe_tp: int,
                  link: float) -> tuple[float, float]:
    """(fixed, per group token) seconds of the MoE layers' token exchange over n GPUs.

    With experts split (ep > 1) each token is dispatched to the ranks of its top-k experts and
    combined back, an all-to-all pair: per GPU, its 1/n share of the tokens, to min(k, ep) ranks
    ((ep - 1)/ep of them remote), times moe_tp slices. With experts replicated over attention DP
    (ep = 1) the tokens are all-gathered and reduce-scattered instead. 16-bit hidden states.
    """
    latency = eff.allreduce_latency_s + eff.allreduce_hop_s * max(0, n - 2)
    h = m.hidden_size * m.dtype_bytes
    if ep > 1:
        per_token = min(m.num_experts_per_tok, ep) * moe_tp * (ep - 1) / ep * h / n
    else:
        per_token = (n - 1) / n * h
    per_layer = 2.0 * per_token / (link * eff.comm)
    return m.num_moe_layers * 2 * latency, m.num_moe_layers * per_layer


def roofline_for(model: ModelSpec, hardware: HardwareSpec, parallel: Parallelism,
                 efficiency: Efficiency | None = None) -> RooflineCostModel | PipelineCostModel:
    """The roofline for this layout: one stage's model, wrapped in the pipeline when pp > 1."""
    parallel.check(model)
    stage = RooflineCostModel(parallel.stage_model(model), hardware, parallel.tensor_parallel_size,
                              efficiency, parallel)
    if parallel.pipeline_parallel_size == 1:
        return stage
    return PipelineCostModel(stage, parallel, hardware.collective_bandwidth(parallel.num_gpus))


# Run totals and draft-model steps live in work.py; imported here for their users.
from twinserve.backends.sim.work import DraftModelSteps, WorkTotals  # noqa: E402

__all__ = ["CostModel", "DraftModelSteps", "Efficiency", "RooflineCostModel", "StepFeatures", "WorkTotals",
           "sliding_pairs", "windowed_features"]
