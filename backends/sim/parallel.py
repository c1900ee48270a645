"""How one engine is laid over GPUs: tensor, attention data, expert and pipeline parallelism.

As vLLM and the aiconfigurator rows lay them out: attention runs at TP `tensor_parallel_size`
on each of `data_parallel_size` ranks (attention DP), each rank with its own sequences; the MoE
layers take every rank's tokens, their experts split over `expert_parallel_size` GPUs and each
expert over the rest (moe_tp = tp x dp / ep; vLLM's --enable-expert-parallel is ep = tp x dp).
`pipeline_parallel_size` stages each hold a contiguous share of the layers.

`redundant_experts` is SGLang's `--ep-num-redundant-experts` (EPLB): E + R physical experts, the R
extra ones replicas of hot experts, laid E + R over ep, so (E + R) % ep == 0 (256 experts over 48
GPUs with 32 redundant: 6 a GPU). Each GPU holds (E + R) / ep experts' weights; the routed work is
unchanged (every token still goes to top-k experts; a replica takes a share of its expert's tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from twinserve.core.errors import InvalidConfigError

from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec

if TYPE_CHECKING:
    from twinserve.backends.sim.cost_model import Efficiency, RooflineCostModel


class ParallelismError(InvalidConfigError):
    """A parallel layout the model's shape does not allow; names the field and what is allowed."""


@dataclass(slots=True, frozen=True)
class Parallelism:
    """TP, attention DP, EP and PP sizes of one engine."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    redundant_experts: int = 0

    def physical_experts(self, model: ModelSpec) -> int:
        """Experts the expert-parallel group holds: the model's plus the redundant replicas."""
        return model.num_experts + self.redundant_experts if model.is_moe else 0

    @property
    def moe_tensor_parallel_size(self) -> int:
        """GPUs each expert is split over."""
        return self.tensor_parallel_size * self.data_parallel_size // self.expert_parallel_size

    @property
    def num_gpus(self) -> int:
        """GPUs of the engine: tp x dp per stage, times the stages."""
        return self.tensor_parallel_size * self.data_parallel_size * self.pipeline_parallel_size

    def check(self, model: ModelSpec) -> None:
        """ParallelismError unless every size divides what it splits."""
        tp, dp, ep, pp = (self.tensor_parallel_size, self.data_parallel_size, self.expert_parallel_size,
                          self.pipeline_parallel_size)
        for name, v in (("tensor_parallel_size", tp), ("data_parallel_size", dp),
                        ("expert_parallel_size", ep), ("pipeline_parallel_size", pp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParallelismError(name, v, "an integer >= 1")
        r = self.redundant_experts
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ParallelismError("redundant_experts", r, "an integer >= 0")
        if r and not model.is_moe:
            raise ParallelismError("redundant_experts", r, f"0: {model.name} has no experts")
        if model.num_heads % tp or (not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads):
            raise ParallelismError("tensor_parallel_size", tp,
                                   f"a divisor of {model.name}'s {model.num_heads} attention heads "
                                   f"(and of its {model.num_kv_heads} KV heads, or a multiple of them): "
                                   f"{tp} does not divide them")
        if model.num_linear_layers and (model.linear_num_key_heads % tp or model.linear_num_value_heads % tp):
            raise ParallelismError("tensor_parallel_size", tp,
                                   f"a divisor of {model.name}'s {model.linear_num_key_heads} linear-attention "
                                   f"key heads and {model.linear_num_value_heads} value heads")
        if ep > 1:
            if not model.is_moe:
                raise ParallelismError("expert_parallel_size", ep, f"1: {model.name} has no experts")
            if (model.num_experts + r) % ep:
                held = (f"{model.num_experts} experts + {r} redundant = {model.num_experts + r}" if r
                        else f"{model.num_experts} experts")
                raise ParallelismError("expert_parallel_size", ep,
                                       f"a divisor of {model.name}'s {held} (engine.redundant_experts "
                                       f"adds replicas, SGLang's --ep-num-redundant-experts)")
            if (tp * dp) % ep:
                raise ParallelismError("expert_parallel_size", ep,
                                       f"a divisor of tensor_parallel_size x data_parallel_size = {tp * dp}")
        if pp > model.num_layers:
            raise ParallelismError("pipeline_parallel_size", pp,
                                   f"at most {model.name}'s {model.num_layers} layers")

    def stage_model(self, model: ModelSpec) -> ModelSpec:
        """The heaviest pipeline stage as a model of its own: ceil(layers / pp) layers.

        Embeddings and the LM head stay on it: the last stage holds the LM head and, being the
        largest, sets the pipeline's pace.
        """
        pp = self.pipeline_parallel_size
        if pp == 1:
            return model
        layers = math.ceil(model.num_layers / pp)
        slide = math.ceil(model.num_sliding_layers * layers / model.num_layers) if model.num_sliding_layers else 0
        dense = model.num_dense_layers // pp  # the heaviest stage: MoE layers where it can
        # Full-attention layers where it can too: their K/V grows, a linear layer's state does not.
        linear = model.num_linear_layers * layers // model.num_layers if model.num_linear_layers else 0
        return replace(model, num_layers=layers, num_sliding_layers=slide, num_dense_layers=dense,
                       num_linear_layers=linear)

    def weight_bytes_per_gpu(self, model: ModelSpec) -> float:
        """Weights one GPU of the heaviest stage holds: dense part over TP, the physical experts (the
        model's plus the redundant ones) over the whole group: (E + R) / ep experts, each over moe_tp."""
        m, p = self.stage_model(model), model.precision
        dense = m.always_weight_bytes + m.embedding_params * m.dtype_bytes
        experts = m.num_moe_layers * self.physical_experts(m) * m.expert_params * p.expert_weight_bytes
        return dense / self.tensor_parallel_size + experts / (self.tensor_parallel_size * self.data_parallel_size)


class PipelineCostModel:
    """A pipeline of identical stages, each priced by the roofline of the heaviest stage.

    The simple model, as vLLM runs PP: a step's batch is cut into pp micro-batches that chase
    each other through the stages, so every sequence advances once per cycle of pp stage-times,
    each plus the hand-off of a micro-batch's hidden states to the next stage (the last stage's
    sampled tokens go back to the first). Host cost is paid once a step.
    """

    name = "roofline"

    def __init__(self, stage: "RooflineCostModel", parallel: Parallelism, link_bandwidth: float) -> None:
        self.stage = stage
        self.model = stage.model
        self.hardware = stage.hardware
        self.tp = stage.tp
        self.par = parallel
        self.eff = stage.eff
        pp = parallel.pipeline_parallel_size
        eff = stage.eff
        self._pp = pp
        self._send_fixed = eff.allreduce_latency_s
        self._send_tok = stage.model.hidden_size * stage.model.dtype_bytes / (link_bandwidth * eff.comm)

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: pp stage-times of a micro-batch, each with its hand-off."""
        pp = self._pp
        stage = self.stage.step_time(num_prefill_tokens / pp, num_prefill_seqs / pp, prefill_context / pp,
                                     prefill_attn / pp, num_decode_seqs / pp, decode_context / pp)
        host = self.eff.step_overhead_s
        send = self._send_fixed + self._send_tok * (num_prefill_tokens + num_decode_seqs) / pp
        return host + pp * (stage - host + send)

    def decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                          deadline: float) -> tuple[list[float], list[float]]:
        """step_time of consecutive decode-only steps."""
        return _loop_step_time(self.step_time, num_seqs, context, max_steps, start, deadline)

    def max_tokens_per_second(self) -> float:
        """The stage's bound: every stage works on its own micro-batch at once."""
        return self.stage.max_tokens_per_second()


def _loop_step_time(step_time, num_seqs: int, context: int, max_steps: int, start: float,
                    deadline: float) -> tuple[list[float], list[float]]:
    """Consecutive decode steps priced by step_time itself."""
    durations: list[float] = []
    ends: list[float] = []
    t = start
    for _ in range(max_steps):
        if t >= deadline:
            break
        d = step_time(0, 0, 0, 0.0, num_seqs, context)
        t = t + d
        durations.append(d)
        ends.append(t)
        context += num_seqs
    return durations, ends
