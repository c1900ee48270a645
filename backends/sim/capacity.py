"""KV-cache capacity derived the way a real engine sizes its pool."""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.groups import group_windows

from twinserve.backends.sim.catalog import GiB, HardwareSpec, ModelSpec
from twinserve.backends.sim.parallel import Parallelism


class DoesNotFitError(InvalidConfigError):
    """The weights and reserves leave no room for one KV block on this GPU at this TP."""


@dataclass(slots=True)
class KVCapacity:
    """How the pool size was derived, per GPU, in bytes (kept for the report)."""

    num_blocks: int
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    block_bytes: float
    reserved_bytes: float = 0.0  # CUDA context, NCCL buffers, CUDA graphs
    state_bytes: float = 0.0  # linear-attention recurrent states of max_num_seqs sequences


def model_kv_groups(model: ModelSpec) -> tuple[int, ...]:
    """The KV cache groups the engine builds for the model: each group's window, 0 = full."""
    if not model.sliding_window or not model.num_sliding_layers:
        return (0,)
    slide = min(model.num_sliding_layers, model.num_layers)
    return group_windows([None] * (model.num_layers - slide) + [model.sliding_window] * slide)


def activation_reserve_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                             max_num_seqs: int) -> float:
    """Peak activation bytes per GPU for the largest step (what a profiling run would find)."""
    m = model
    # An MoE token's MLP activations are its top-k experts' intermediates.
    inter = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    per_token = (4 * m.hidden_size + ((m.num_heads + 2 * m.num_kv_heads) * m.head_dim
                                      + 2 * inter) / tp) * m.dtype_bytes
    return max_num_batched_tokens * per_token + max_num_seqs * m.vocab_size * 4


def runtime_reserve_bytes(hardware: HardwareSpec, tp: int, cuda_graphs: bool = True) -> float:
    """Memory outside the allocator per GPU: CUDA context, NCCL buffers (TP > 1), CUDA graphs."""
    p = hardware.profile
    gib = p.cuda_context_gib + (p.nccl_buffer_gib if tp > 1 else 0.0)
    if cuda_graphs:
        gib += p.cuda_graph_gib
    return gib * GiB


# What an engine's memory share is a share of: vLLM's gpu_memory_utilization and SGLang's
# mem_fraction_static take it of the GPU's total memory; TensorRT-LLM's KvCacheConfig
# free_gpu_memory_fraction (default 0.9) of the memory free once the model is loaded (its docs,
# "How to Change KV Cache Behavior": "allocate 90% of free GPU memory for KV cache").
MEMORY_BASES = ("total", "free")


def usable_kv_bytes(mem_bytes: float, utilization: float, taken: float, basis: str = "total") -> float:
    """Bytes left for K/V on a GPU of mem_bytes when weights and the rest take `taken`."""
    if basis == "free":
        return (mem_bytes - taken) * utilization
    if basis != "total":
        raise InvalidConfigError("kv_memory_basis", basis, " or ".join(MEMORY_BASES))
    return mem_bytes * utilization - taken


def kv_capacity(model: ModelSpec, hardware: HardwareSpec, tp: int, block_size: int,
                gpu_memory_utilization: float = 0.9, max_num_batched_tokens: int = 2048,
                max_num_seqs: int = 256, activation_reserve: float | None = None,
                num_blocks_override: int | None = None,
                runtime_reserve: float | None = None, kv_groups: tuple[int, ...] = (0,),
                parallel: Parallelism | None = None, memory_basis: str = "total") -> KVCapacity:
    """(memory × utilisation − weights − activations − runtime reserve) / bytes per block, per GPU.

    memory_basis "free": utilisation is a share of what is left after the weights, activations and
    reserve instead (TensorRT-LLM's free_gpu_memory_fraction), (memory − the rest) × utilisation.

    KV heads replicate once tp exceeds them, as in vLLM. With several KV groups a block is a page:
    block_size tokens of one group's layers (num_layers / groups), as core/kv/groups.py lays them out.
    With a parallel layout the GPU is one of the heaviest pipeline stage's (its layers' weights and
    K/V), and each attention-DP rank keeps its own sequences' K/V: the engine's pool is dp times a GPU's.
    """
    if parallel is not None and (parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1
                                 or parallel.expert_parallel_size > 1):
        return _parallel_capacity(model, hardware, parallel, block_size, gpu_memory_utilization,
                                  max_num_batched_tokens, max_num_seqs, activation_reserve,
                                  num_blocks_override, runtime_reserve, kv_groups, memory_basis)
    groups = len(kv_groups) or 1
    if model.num_layers % groups:
        raise InvalidConfigError("kv_groups", list(kv_groups),
                                 f"groups of equal size: a divisor of {model.name}'s {model.num_layers} layers")
    weights = model.weight_bytes / tp
    act = (activation_reserve if activation_reserve is not None
           else activation_reserve_bytes(model, tp, max_num_batched_tokens, max_num_seqs))
    reserved = runtime_reserve if runtime_reserve is not None else runtime_reserve_bytes(hardware, tp)
    # Linear-attention layers keep one fixed-size state per running sequence, beside the paged K/V.
    state = model.linear_state_bytes_per_seq_per_gpu(tp) * max_num_seqs
    usable = usable_kv_bytes(hardware.mem_bytes, gpu_memory_utilization, weights + act + reserved + state,
                             memory_basis)
    block_bytes = block_size * model.kv_bytes_per_token_per_gpu(tp) / groups
    if num_blocks_override is not None:
        return KVCapacity(num_blocks_override, usable, weights, act, block_bytes, reserved, state)
    n = int(usable // block_bytes)
    if n < 1:
        raise DoesNotFitError(
            "gpu_memory_utilization", gpu_memory_utilization,
            f"a value leaving room for KV blocks: {model.name} weights take "
            f"{weights / 2**30:.1f} GiB per GPU of {hardware.mem_bytes / 2**30:.1f} GiB on "
            f"{hardware.name} at tp={tp}" + (f" (and {state / 2**30:.1f} GiB of linear-attention states)"
                                             if state else "") + "; raise tensor_parallel_size or use a bigger GPU")
    return KVCapacity(n, usable, weights, act, block_bytes, reserved, state)


def _parallel_capacity(model: ModelSpec, hardware: HardwareSpec, par: Parallelism, block_size: int,
                       gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                       activation_reserve: float | None, num_blocks_override: int | None,
                       runtime_reserve: float | None, kv_groups: tuple[int, ...],
                       memory_basis: str = "total") -> KVCapacity:
    """kv_capacity for one GPU of the heaviest stage, the pool counted over the DP ranks."""
    tp, dp = par.tensor_parallel_size, par.data_parallel_size
    stage = par.stage_model(model)
    weights = par.weight_bytes_per_gpu(model)
    act = (activation_reserve if activation_reserve is not None
           else activation_reserve_bytes(stage, tp, max(1, max_num_batched_tokens // dp), max(1, max_num_seqs // dp)))
    reserved = (runtime_reserve if runtime_reserve is not None
                else runtime_reserve_bytes(hardware, par.num_gpus))
    state = stage.linear_state_bytes_per_seq_per_gpu(tp) * max(1, max_num_seqs // dp)  # one rank's sequences
    usable = usable_kv_bytes(hardware.mem_bytes, gpu_memory_utilization, weights + act + reserved + state,
                             memory_basis)
    block_bytes = block_size * stage.kv_bytes_per_token_per_gpu(tp) / (len(kv_groups) or 1)
    if num_blocks_override is not None:
        return KVCapacity(num_blocks_override, usable, weights, act, block_bytes, reserved, state)
    n = int(usable // block_bytes)
    if n < 1:
        raise DoesNotFitError(
            "gpu_memory_utilization", gpu_memory_utilization,
            f"a value leaving room for KV blocks: {model.name} weights take {weights / 2**30:.1f} GiB per GPU "
            f"of {hardware.mem_bytes / 2**30:.1f} GiB on {hardware.name} at tp={tp}, dp={dp}, "
            f"ep={par.expert_parallel_size}, pp={par.pipeline_parallel_size}; spread it over more GPUs")
    return KVCapacity(n * dp, usable, weights, act, block_bytes, reserved, state)
