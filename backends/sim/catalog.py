"""Model and hardware specs as plain data: adding one is a new entry, not new code.

Model shapes are the published Hugging Face configs; hardware figures are vendor
datasheet numbers (dense bf16, no sparsity). Interconnect bandwidth is per direction.

Each GPU also carries the efficiencies its kernels reach and the memory an engine
cannot give to the KV cache (GPUProfile). They are physical estimates, chosen once
per GPU from kernel benchmarks and vendor guidance, not fitted to the validation
table (tests/sim/test_validation.py checks them against published measurements):

- gemm: fraction of peak dense FLOP/s cuBLAS reaches on large fp16/bf16 GEMMs.
  A100 reaches 70-80%; H100 SXM reaches a lower share of its 989 TFLOP/s (its
  clocks drop under tensor-core load), about 60-65%.
- attention: fraction of peak that FlashAttention-2 reaches in prefill: ~50-60% on
  A100, ~35-40% on H100 (FlashAttention-2 paper, Dao 2023; FA3 raises H100 to ~75%).
- memory: fraction of HBM bandwidth a streaming kernel reaches: ~80% on both.
- comm: fraction of NVLink bandwidth a ring all-reduce reaches on large messages.
- allreduce_latency_s + allreduce_hop_s * (tp - 2): the fixed cost of one small
  all-reduce (NCCL on NVLink: ~35 us at TP 2 to ~60 us at TP 8 on A100/H100;
  measured small NCCL all-reduces on A100 take 40-60 us).
- layer_floor_s: the least one layer's attention or linear group takes however
  small the step (kernel launch and tail effects; decode attention at batch 1
  measures ~17 us per layer).
- cuda_context_gib, nccl_buffer_gib (TP > 1 only), cuda_graph_gib: memory outside
  the allocator that a vLLM-style profiling run does not see but that is gone.
- price_per_hour: USD per GPU-hour for capacity planning; rough 2024-25 on-demand
  cloud list prices, to be replaced by one's own (the study TOML's [search.prices]).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from twinserve.core.errors import TwinserveError

GiB = 1024**3


class UnknownSpecError(TwinserveError, KeyError):
    """A model or hardware name that is not in the catalog."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"unknown {kind} {name!r}: choose one of {', '.join(known)} "
                         f"or add an entry to twinserve.backends.sim.catalog.{kind.upper()}S")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (Llama family: GQA attention, SwiGLU MLP)."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer: q/k/v/o projections plus the three MLP matrices."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def num_params(self) -> int:
        """All weights, embeddings included."""
        emb = self.vocab_size * self.hidden_size
        return self.num_layers * self.params_per_layer + emb * (1 if self.tie_word_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights in memory."""
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each GPU holds: split over TP, one replicated head each once TP exceeds them."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """K and V for one token on one GPU under tensor parallelism (replication counted)."""
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes


@dataclass(slots=True, frozen=True)
class GPUProfile:
    """What real kernels reach on one GPU, its fixed costs and reserves (module docstring)."""

    gemm: float = 0.70
    attention: float = 0.50
    memory: float = 0.80
    comm: float = 0.75
    allreduce_latency_s: float = 35e-6
    allreduce_hop_s: float = 4e-6
    layer_floor_s: float = 17e-6
    cuda_context_gib: float = 0.5
    nccl_buffer_gib: float = 0.4
    cuda_graph_gib: float = 0.5
    price_per_hour: float = 2.0


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    """One accelerator: peak dense throughput, HBM bandwidth and size, link bandwidth."""

    name: str
    peak_flops: float
    mem_bandwidth: float
    mem_bytes: float
    interconnect_bandwidth: float
    profile: GPUProfile = GPUProfile()


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    ModelSpec("Llama-2-7B", 32, 4096, 11008, 32, 32, 128, 32000, 4096),
    ModelSpec("Llama-3-8B", 32, 4096, 14336, 32, 8, 128, 128256, 8192),
    ModelSpec("Llama-2-70B", 80, 8192, 28672, 64, 8, 128, 32000, 4096),
    ModelSpec("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 128, 152064, 32768),
    ModelSpec("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49152, 8192, tie_word_embeddings=True),
]}

HARDWARES: dict[str, HardwareSpec] = {h.name: h for h in [
    HardwareSpec("A100-80GB", 312e12, 2.039e12, 80 * GiB, 300e9,
                 GPUProfile(gemm=0.72, attention=0.55, price_per_hour=1.8)),
    HardwareSpec("H100-SXM", 989e12, 3.35e12, 80 * GiB, 450e9,
                 GPUProfile(gemm=0.62, attention=0.38, price_per_hour=3.0)),
    HardwareSpec("H200", 989e12, 4.8e12, 141e9, 450e9,
                 GPUProfile(gemm=0.62, attention=0.38, price_per_hour=3.7)),
]}


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    if name in table:
        return table[name]
    folded = {k.lower(): v for k, v in table.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise UnknownSpecError(kind, name, sorted(table))


def get_model(name: str) -> ModelSpec:
    """A model spec by name (case-insensitive)."""
    return _lookup(MODELS, "model", name)


def get_hardware(name: str) -> HardwareSpec:
    """A hardware spec by name (case-insensitive)."""
    return _lookup(HARDWARES, "hardware", name)


def spec_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build a ModelSpec or HardwareSpec from a mapping (e.g. a TOML table), unknown keys refused."""
    names = {f.name for f in fields(cls)}
    extra = set(data) - names
    if extra:
        raise TypeError(f"unknown {cls.__name__} fields: {', '.join(sorted(extra))}")
    data = dict(data)
    if cls is HardwareSpec and isinstance(data.get("profile"), dict):
        data["profile"] = spec_from_dict(GPUProfile, data["profile"])
    return cls(**data)
