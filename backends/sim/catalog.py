"""Model and hardware specs as plain data: adding one is a new entry, not new code.

Model shapes are the published Hugging Face configs; hardware figures are vendor datasheet
numbers (dense, interconnect per direction). GPUProfile's efficiencies are physical estimates from
kernel benchmarks and vendor guidance, not fitted to the validation table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from twinserve.core.errors import TwinserveError

from twinserve.backends.sim.precision import Precision

GiB = 1024**3
MiB = 1024**2


class UnknownSpecError(TwinserveError, KeyError):
    """A model or hardware name that is not in the catalog."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"unknown {kind} {name!r}: choose one of {', '.join(known)} "
                         f"or add an entry to twinserve.backends.sim.catalog.{kind.upper()}S")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


# The attention projections NVIDIA's NVFP4 checkpoints keep in 16 bits (ModelOpt `exclude_modules`), by model name,
# as groups: 'q' (q_a / q_b, or q), 'kv' (kv_a / kv_b, or k / v), 'o' (o_proj). One declaration, read by the byte
# counts here (ModelSpec.sixteen_bit_attention) and by the measured backend's GEMM modes (backends/sim/aic/graph.py).
# Sources, aiconfigurator-core (the installed aiconfigurator_core package):
# - sdk/models/helpers.py (ATTENTION_PROJECTION_GROUPS): "Kimi-K2.5-NVFP4 and R1-0528-FP4 exclude the whole block
#   (self_attn*), while DeepSeek-V3.1/V3.2-NVFP4 exclude only q/kv projections (V3.2 also the indexer) and KEEP o_proj
#   quantized"; sdk/models/deepseek.py prices an excluded projection at bfloat16 (its fused q_a + kv_a downscale only
#   when both q and kv are excluded).
# - model_configs/nvidia--Kimi-K2.5-NVFP4_config.json (quantization_config `ignore`: lm_head, every layer's
#   self_attn*, the vision tower; not the shared experts, nor layer 0's dense MLP);
#   nvidia--DeepSeek-V3.1-NVFP4_hf_quant_config.json and -V3.2- (every layer's q_a / q_b / kv_a_proj_with_mqa / kv_b,
#   V3.2 also the indexer; not o_proj);
#   nvidia--GLM-5-NVFP4_hf_quant_config.json (every layer's q_a / q_b / kv_a / kv_b / o_proj and indexer).
# InferenceX's FP4 DeepSeek-R1 runs serve nvidia/DeepSeek-R1-0528-FP4-V2 (the launch scripts' MODEL), and the
# file's FP4 "DeepSeek-V3" rows are those dsr1 runs (sim/validate_recipes.py): both names get R1's block.
# Every one of these checkpoints also excludes lm_head (16-bit here already: embeddings are counted at dtype_bytes)
# and their MTP layer wholesale (NVFP4_16BIT_MTP below). The DSA models'
# (V3.2, GLM-5) indexer weights are not in attention_params; aic's DSA module prices their projections at bfloat16
# (graph.dsa_gemm_mode).
NVFP4_16BIT_ATTENTION: dict[str, frozenset[str]] = {
    "DeepSeek-R1": frozenset({"q", "kv", "o"}),
    "DeepSeek-V3": frozenset({"q", "kv", "o"}),
    "Kimi-K2.5": frozenset({"q", "kv", "o"}),
    "DeepSeek-V3.1": frozenset({"q", "kv"}),
    "DeepSeek-V3.2": frozenset({"q", "kv"}),
    "GLM-5": frozenset({"q", "kv", "o"}),
}
ATTENTION_GROUPS = ("q", "kv", "o")

# The models whose NVIDIA NVFP4 checkpoint keeps the multi-token-prediction layer out of quantization wholesale
# (ModelOpt `exclude_modules` naming the whole layer), so the MTP draft (ModelSpec.mtp_draft) is a 16-bit layer:
# its attention, router, shared expert and routed experts all bfloat16. Sources:
# - aiconfigurator-core's model_configs: nvidia--DeepSeek-V3.1-NVFP4_hf_quant_config.json and -V3.2-
#   (`model.layers.61*`), nvidia--GLM-5-NVFP4_hf_quant_config.json (`model.layers.78*`, its layer past
#   num_hidden_layers 78), nvidia--Qwen3.5-397B-A17B-NVFP4_hf_quant_config.json (`mtp.layers.0*`).
# - DeepSeek-R1-0528's NVFP4 export: NVIDIA/TensorRT-LLM @96094323
#   tensorrt_llm/_torch/_experimental/modeling_v2/models/deepseek_v3/r1_0528_nvfp4__sm_103__dep4/weights.py
#   (the checkpoint ships a bf16 MTP module at layer num_hidden_layers, its own 256 experts; its
#   hf_quant_config.json excludes `model.layers.61*` wholesale). For the -v2 export InferenceX serves, a B200
#   profiling write-up quoting its hf_quant_config.json lists the same `model.layers.61*` beside lm_head and the
#   61 layers' q/kv projections (docs/validate-accuracy.md, mtpdraft).
# The engines honour it: SGLang reads the NextN layer's ModelOpt FP4 exclusions module by module
# (sgl-project/sglang python/sglang/srt/models/deepseek_nextn.py, DeepseekV3ForCausalLMNextN; its NextN
# quant-resolution unit tests assert that under `model.layers.61*` the layer's linears get
# UnquantizedLinearMethod and its fused MoE no quant method); TensorRT-LLM loads the layer's bf16 weights as they
# are (the weights.py above).
# The file's FP4 "DeepSeek-V3" rows are DeepSeek-R1 runs (as for NVFP4_16BIT_ATTENTION).
NVFP4_16BIT_MTP: frozenset[str] = frozenset({"DeepSeek-R1", "DeepSeek-V3", "DeepSeek-V3.1", "DeepSeek-V3.2",
                                             "GLM-5", "Qwen3.5-397B-A17B"})


def sixteen_bit_mtp_draft(model: "ModelSpec") -> bool:
    """Whether `model` is the 16-bit MTP draft ModelSpec.mtp_draft makes of a checkpoint NVFP4_16BIT_MTP names."""
    return (model.name.endswith("-MTP") and model.name[:-len("-MTP")] in NVFP4_16BIT_MTP
            and model.precision.quantization == "none")


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape: GQA or MLA attention, SwiGLU MLP or mixture-of-experts."""

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
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    sliding_window: int = 0
    num_sliding_layers: int = 0
    precision: Precision = Precision()
    # DeepSeek's first_k_dense_replace: leading layers with a dense MLP of intermediate_size.
    num_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): 0 = GQA attention.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5: config.json's index_topk, index_n_heads,
    # index_head_dim): a lightning indexer of index_n_heads x index_head_dim picks the index_topk
    # cached tokens each query's MLA attends to. 0 = dense attention.
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    # RMSNorm on q and k before RoPE (Qwen3, MiniMax-M2; from config.json's architectures).
    qk_norm: bool = False
    # The q / k RMSNorm spans the whole projection, not each head (MiniMax-M2's config.json: qk_norm_type
    # 'per_layer'): under attention TP each rank holds a slice of the heads, so every layer all-reduces the
    # ranks' partial variances before normalising (vLLM's MiniMaxText01RMSNormTP.forward_qk, SGLang's
    # MiniMaxM2RMSNormTP).
    qk_norm_across_heads: bool = False
    # Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5): a fixed-size recurrent state per
    # sequence instead of a growing K/V; the other layers are full attention. 0 = none.
    num_linear_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    linear_state_dtype_bytes: int = 4  # the recurrent state's dtype (config.json's mamba_ssm_dtype)
    # Multi-token-prediction modules after the last layer (DeepSeek-V3/R1's and GLM-5's
    # num_nextn_predict_layers, Qwen3.5's mtp_num_hidden_layers): not in the forward pass; the engines
    # run them as a speculative draft (mtp_draft). 0 = none.
    num_mtp_layers: int = 0
    # The quantization for which the checkpoint quantizes the routed experts only, keeping attention,
    # shared experts, dense MLPs and the LM head in 16 bits ('' = none): Kimi-K2.5's native INT4
    # checkpoint (its config.json's compressed-tensors `ignore`: self_attn, shared_experts, the dense
    # mlp projections, lm_head). A study at that quantization prices those layers 16-bit.
    experts_only_quantization: str = ""

    @property
    def layer_weight_bytes(self) -> float:
        """Bytes per weight of the layers outside the routed experts (attention, dense and shared MLPs)."""
        p = self.precision
        if self.experts_only_quantization and p.quantization == self.experts_only_quantization:
            return float(self.dtype_bytes)
        return p.weight_bytes

    @property
    def sixteen_bit_attention(self) -> frozenset[str]:
        """The attention projection groups ('q', 'kv', 'o') this model's checkpoint keeps in 16 bits at this
        precision (NVFP4_16BIT_ATTENTION: NVIDIA's NVFP4 checkpoints); empty otherwise."""
        if self.precision.quantization != "nvfp4":
            return frozenset()
        return NVFP4_16BIT_ATTENTION.get(self.name, frozenset())

    @property
    def always_weight_bytes(self) -> float:
        """Bytes of the layers outside the routed experts (attention, dense and shared MLPs, routers): at
        layer_weight_bytes a weight, less the attention projections the checkpoint keeps at 16 bits."""
        kept = self.attention_group_params(self.sixteen_bit_attention)
        return self.always_params * self.layer_weight_bytes + kept * (self.dtype_bytes - self.layer_weight_bytes)

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one compressed latent per token cached)."""
        return self.kv_lora_rank > 0

    @property
    def num_full_attention_layers(self) -> int:
        """Layers with softmax attention over a growing K/V (all but the linear-attention ones)."""
        return self.num_layers - self.num_linear_layers

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a linear-attention layer's short convolution (q, k and v)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_v_width

    @property
    def linear_v_width(self) -> int:
        """Value heads x their width of a linear-attention layer."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_attn_params_per_layer(self) -> int:
        """Gated DeltaNet weights of one layer: q/k/v/z and beta/alpha in, the conv, out."""
        h, v = self.hidden_size, self.linear_v_width
        qkvz = self.linear_conv_dim + v
        return h * (qkvz + 2 * self.linear_num_value_heads) + self.linear_conv_dim * self.linear_conv_kernel_dim + v * h

    @property
    def attention_params(self) -> int:
        """Attention weights of every layer: full-attention and linear-attention ones."""
        return (self.num_full_attention_layers * self.attn_params_per_layer
                + self.num_linear_layers * self.linear_attn_params_per_layer)

    def linear_state_bytes_per_seq_per_gpu(self, tp: int) -> int:
        """One sequence's recurrent state on one GPU: per linear layer, a key x value matrix per value
        head (the state's dtype) and the last kernel-1 inputs of the conv (the model's dtype), TP-split."""
        if not self.num_linear_layers:
            return 0
        heads = max(1, self.linear_num_value_heads // tp)
        ssm = heads * self.linear_key_head_dim * self.linear_value_head_dim * self.linear_state_dtype_bytes
        conv = self.linear_conv_dim // tp * (self.linear_conv_kernel_dim - 1) * self.dtype_bytes
        return self.num_linear_layers * (ssm + conv)

    @property
    def linear_attn_flops_per_token(self) -> float:
        """Recurrent-state FLOPs of one token over every linear layer: per value head, reading the
        state with k, the delta-rule update and reading it with q, each a key x value product (2 FLOPs a MAC)."""
        return (self.num_linear_layers * 3 * 2.0 * self.linear_num_value_heads
                * self.linear_key_head_dim * self.linear_value_head_dim)

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of q and k (MLA: the no-position part plus the rotary part)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """Per-head width of v."""
        return self.v_head_dim if self.is_mla else self.head_dim

    def attn_group_params_per_layer(self, group: str) -> int:
        """One layer's weights of an attention projection group (ATTENTION_GROUPS): 'q' (GQA q; MLA q_a and
        q_b, or q), 'kv' (GQA k and v; MLA kv_a and kv_b) or 'o'."""
        h, n = self.hidden_size, self.num_heads
        if group == "o":
            return n * self.v_dim * h
        if not self.is_mla:
            return h * n * self.head_dim if group == "q" else h * self.num_kv_heads * self.head_dim * 2
        if group == "q":
            return (h * self.q_lora_rank + self.q_lora_rank * n * self.qk_head_dim if self.q_lora_rank
                    else h * n * self.qk_head_dim)
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        return kv_a + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)

    def attention_group_params(self, groups: frozenset[str] | tuple[str, ...]) -> int:
        """Weights of these attention projection groups over every full-attention layer."""
        return self.num_full_attention_layers * sum(self.attn_group_params_per_layer(g) for g in groups)

    @property
    def attn_params_per_layer(self) -> int:
        """Attention projection weights of one layer (GQA q/k/v/o; MLA's down/up projections)."""
        return sum(self.attn_group_params_per_layer(g) for g in ATTENTION_GROUPS)

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """MLP weights every token reads in an MoE layer (router plus shared experts), or the dense MLP."""
        if not self.is_moe:
            return 3 * self.hidden_size * self.intermediate_size
        return self.hidden_size * self.num_experts + self.num_shared_experts * self.expert_params

    @property
    def always_params(self) -> int:
        """Layer weights every step reads whatever the routing: attention, dense MLPs, routers, shared experts."""
        dense_mlp = 3 * self.hidden_size * self.intermediate_size
        if not self.is_moe:
            return self.attention_params + self.num_layers * dense_mlp
        return (self.attention_params + self.num_dense_layers * dense_mlp
                + self.num_moe_layers * self.dense_mlp_params_per_layer)

    @property
    def routed_params(self) -> int:
        """Weights of every routed expert of every MoE layer."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def params_per_layer(self) -> float:
        """Weights of one layer on average (embeddings excluded)."""
        return (self.always_params + self.routed_params) / self.num_layers

    @property
    def active_params_per_layer(self) -> float:
        """Weights one token computes with, per layer on average (its top-k experts only)."""
        routed = self.num_moe_layers * self.num_experts_per_tok * self.expert_params
        return (self.always_params + routed) / self.num_layers

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """All weights, embeddings included."""
        return self.always_params + self.routed_params + self.embedding_params

    @property
    def num_active_params(self) -> int:
        """Weights one token uses, embeddings included (num_params for a dense model)."""
        routed = self.num_moe_layers * self.num_experts_per_tok * self.expert_params
        return self.always_params + routed + self.embedding_params

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights in memory: layers and experts in their formats, embeddings 16-bit."""
        p = self.precision
        return int(self.always_weight_bytes + self.routed_params * p.expert_weight_bytes
                   + self.embedding_params * self.dtype_bytes)

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """Cached elements per token per layer: K and V per KV head, or MLA's latent plus rotary key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def indexer_bytes_per_token_per_layer(self) -> int:
        """DeepSeek Sparse Attention's indexer key cache for one token of one layer: index_head_dim FP8
        values and a 4-byte scale per 128 of them, whatever the KV dtype (SGLang's and vLLM's DSA indexer
        cache; aiconfigurator-core's common.indexer_cache_entry_bytes). 0 without DSA."""
        d = self.index_head_dim if self.index_topk else 0
        return d + -(-d // 128) * 4

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V (MLA: the latent; DSA: and the indexer's key) for one token across the full-attention layers."""
        return self.num_full_attention_layers * (self.kv_elems_per_token_per_layer * self.precision.kv_bytes
                                                 + self.indexer_bytes_per_token_per_layer)

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each GPU holds: split over TP, one replicated head each once TP exceeds them."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """K and V for one token on one GPU under tensor parallelism (replication counted; MLA's latent is whole on each)."""
        if self.is_mla:
            return self.kv_bytes_per_token
        return (2 * self.num_full_attention_layers * self.kv_heads_per_gpu(tp) * self.head_dim
                * self.precision.kv_bytes)

    def expected_experts(self, num_tokens: float) -> float:
        """Distinct experts a batch touches per layer, E(1 - (1 - k/E)^B): uniform routing, an upper bound."""
        e, k = self.num_experts, self.num_experts_per_tok
        if not e or num_tokens <= 0:
            return 0.0
        return e * (1.0 - (1.0 - k / e) ** num_tokens)

    def with_precision(self, precision: Precision) -> "ModelSpec":
        """The same shape in other data types."""
        return replace(self, precision=precision)

    def mtp_draft(self) -> "ModelSpec":
        """The model's multi-token-prediction module as a draft model: one decoder layer of the
        model's own kind (an MoE layer for DeepSeek-V3/R1: "1x Multi-Tokens Prediction (MTP) layer
        (MoE-architecture equivalent)", TensorRT-LLM's blog "Pushing Latency Boundaries: Optimizing
        DeepSeek-R1 Performance on NVIDIA B200 GPUs") with the target's embedding and LM head. The
        engines reuse the one layer for each drafted token (TensorRT-LLM's MTP Eagle, SGLang's NextN),
        so one layer stands for any number of drafts. Its input projection (2 x hidden -> hidden) and
        norms are left out (under 1% of the layer's weights). At NVFP4 the layer is 16-bit where the
        checkpoint excludes it from quantization (NVFP4_16BIT_MTP): weights and GEMMs at the model's
        dtype, the K/V cache as the target's (the engines' one pool)."""
        if not self.num_mtp_layers:
            raise ValueError(f"{self.name} has no multi-token-prediction layers (its config gives no "
                             "num_nextn_predict_layers)")
        precision = self.precision
        if precision.quantization == "nvfp4" and self.name in NVFP4_16BIT_MTP:
            precision = replace(precision, quantization="none")
        return replace(self, name=f"{self.name}-MTP", num_layers=1, num_dense_layers=0, num_sliding_layers=0,
                       num_linear_layers=0, num_mtp_layers=0, precision=precision)


@dataclass(slots=True, frozen=True)
class GPUProfile:
    """What real kernels reach on one GPU, its fixed costs and reserves."""

    gemm: float = 0.70       # of dense peak, cuBLAS large GEMMs (A100 70-80%, H100 60-65%: clocks drop)
    attention: float = 0.50  # of peak, FlashAttention-2 prefill (Dao 2023: A100 50-60%, H100 35-40%)
    memory: float = 0.80     # of HBM bandwidth, streaming kernels
    comm: float = 0.75       # of NVLink bandwidth, ring all-reduce of large messages
    # Small all-reduce: latency + hop * (tp - 2); NCCL on NVLink ~35 us at TP 2 to ~60 us at TP 8.
    allreduce_latency_s: float = 35e-6
    allreduce_hop_s: float = 4e-6
    layer_floor_s: float = 17e-6  # launch and tail effects: batch-1 decode attention ~17 us/layer
    # Memory outside the allocator that a vLLM-style profiling run does not see.
    cuda_context_gib: float = 0.5
    nccl_buffer_gib: float = 0.4  # TP > 1 only
    cuda_graph_gib: float = 0.5
    price_per_hour: float = 2.0  # USD, rough 2024-25 on-demand; override with [search.prices]


# Host links per direction: PCIe x16 is 16 lanes of 16 (Gen4) or 32 (Gen5) GT/s, 128b/130b coded,
# which the datasheets round to 64 / 128 GB/s both directions together. NVLink-C2C (Grace to
# Hopper/Blackwell): 900 GB/s both directions (GH200, GB200 NVL72 and GB300 NVL72 datasheets).
PCIE_GEN4_X16 = 32e9
PCIE_GEN5_X16 = 64e9
NVLINK_C2C = 450e9


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    """One accelerator: dense 16-bit, FP8 and FP4 peaks (0: none), HBM bandwidth and size, link bandwidth."""

    name: str
    peak_flops: float
    mem_bandwidth: float
    mem_bytes: float
    interconnect_bandwidth: float
    profile: GPUProfile = GPUProfile()
    peak_flops_fp8: float = 0.0
    peak_flops_fp4: float = 0.0
    # GPUs one NVLink domain joins (an HGX board: 8; an NVL72 rack: 72), and the network past it.
    nvlink_domain: int = 8
    internode_bandwidth: float = 50e9
    # The GPU's link to host memory, per direction (the host KV tier's loads and stores): PCIe Gen5 x16
    # by default; a DMA copy's fixed cost per transfer is an estimate (~10 us launch and setup).
    host_link_bandwidth: float = PCIE_GEN5_X16
    host_link_latency_s: float = 10e-6

    def collective_bandwidth(self, num_gpus: int) -> float:
        """Per-GPU link bandwidth of a collective over num_gpus: NVLink inside the domain, else the network."""
        return self.interconnect_bandwidth if num_gpus <= self.nvlink_domain else self.internode_bandwidth

    def gemm_peak(self, precision: Precision, experts: bool = False) -> float:
        """The dense peak the linear layers (or the routed experts) run at under this precision.

        A format the GPU lacks computes in 16 bits from dequantized weights (vLLM's Marlin kernels:
        NVFP4 on Hopper, FP8 on A100).
        """
        kind = precision.gemm_kind(experts)
        if kind == "fp4" and self.peak_flops_fp4 > 0:
            return self.peak_flops_fp4
        if kind == "fp8" and self.peak_flops_fp8 > 0:
            return self.peak_flops_fp8
        return self.peak_flops


# Published Hugging Face configs; most live in backends/sim/models/ (sources in its README).
MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    ModelSpec("Llama-2-7B", 32, 4096, 11008, 32, 32, 128, 32000, 4096),
    ModelSpec("Llama-3-8B", 32, 4096, 14336, 32, 8, 128, 128256, 8192),
    ModelSpec("Llama-2-70B", 80, 8192, 28672, 64, 8, 128, 32000, 4096),
    ModelSpec("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49152, 8192, tie_word_embeddings=True),
]}

# One-shot NVLink all-reduce of 2025 engines (TensorRT-LLM's and vLLM's custom kernels) at decode sizes:
# fitted on the development rows of aiconfigurator-core's silicon_sample.csv (Llama-3.1-70B and
# Qwen3-32B, H100/H200/B200, TP 2-8; experiments/rows_tpot.py, docs/capacity.md), where NCCL's
# 35 us + 4 us a hop put TP 8 decode 60-96% above the measured TPOT.
_AR_2025 = {"allreduce_latency_s": 18e-6, "allreduce_hop_s": 1e-6}

# Vendor datasheets, dense (sparse figures halved); efficiencies by analogy are said so on their line.
# Past the NVLink domain (8 GPUs, NVL72 racks 72) collectives take the network: one ConnectX-7
# 400 Gb/s NIC per GPU (DGX H100/H200/B200 datasheets), 50 GB/s a direction, unless said.
# Memory is what the driver reports (nvidia-smi's total), the figure vLLM's gpu_memory_utilization and
# SGLang's mem_fraction_static take their share of; datasheets round it (H200 "141 GB" is 143,771 MiB,
# B200 "180 GB" 183,359 MiB). nvidia-smi totals: public nvidia-smi outputs and aiconfigurator-core's
# systems/*.yaml (gb200 189,471 MiB, b300 275,040 MiB, gb300 284,208 MiB).
HARDWARES: dict[str, HardwareSpec] = {h.name: h for h in [
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100); no FP8 tensor cores.
    HardwareSpec("A100-80GB", 312e12, 2.039e12, 80 * GiB, 300e9,
                 GPUProfile(gemm=0.72, attention=0.55, price_per_hour=1.8),
                 host_link_bandwidth=PCIE_GEN4_X16),  # datasheet: PCIe Gen4 64 GB/s
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), SXM; host link PCIe Gen5 128 GB/s.
    HardwareSpec("H100-SXM", 989e12, 3.35e12, 80 * GiB, 450e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=3.0), peak_flops_fp8=1979e12),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), SXM: H100's compute; PCIe Gen5 128 GB/s.
    HardwareSpec("H200", 989e12, 4.8e12, 143771 * MiB, 450e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=3.7), peak_flops_fp8=1979e12),
    # NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s); PCIe only: all-reduce latency estimated 2x.
    HardwareSpec("L40S", 362e12, 864e9, 48e9, 32e9,
                 GPUProfile(gemm=0.70, attention=0.50, allreduce_latency_s=70e-6,
                            allreduce_hop_s=10e-6, price_per_hour=1.0), peak_flops_fp8=733e12,
                 host_link_bandwidth=PCIE_GEN4_X16),  # datasheet: PCIe Gen4 x16 64 GB/s
    # NVIDIA H20 (Hopper export variant): NVIDIA partner spec sheets (no public datasheet).
    HardwareSpec("H20", 148e12, 4.0e12, 96e9, 450e9,
                 GPUProfile(gemm=0.65, attention=0.40, price_per_hour=1.5), peak_flops_fp8=296e12),
    # Blackwell, per GPU, dense (the datasheets' sparse figures halved); H100's efficiencies by analogy.
    # NVIDIA DGX B200 datasheet (nvidia.com/en-us/data-center/dgx-b200): 8 GPUs, 1,440 GB HBM3e, 64 TB/s,
    # FP8 72 PF and FP4 144 PF sparse, NVLink 5 1.8 TB/s per GPU (both directions).
    HardwareSpec("B200", 2250e12, 8.0e12, 183359 * MiB, 900e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=6.0), peak_flops_fp8=4500e12,
                 peak_flops_fp4=9000e12),
    # NVIDIA HGX B300 spec (nvidia.com/en-us/data-center/hgx): 8 GPUs, FP4 144 PF sparse / 108 PF dense,
    # FP8 72 PF and BF16 36 PF sparse, NVLink 5 1.8 TB/s per GPU; the Blackwell Ultra GPU (NVIDIA technical
    # blog "Inside NVIDIA Blackwell Ultra", 2025): 288 GB HBM3e at 8 TB/s.
    HardwareSpec("B300", 2250e12, 8.0e12, 275040 * MiB, 900e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=7.0), peak_flops_fp8=4500e12,
                 peak_flops_fp4=13500e12, internode_bandwidth=100e9),  # ConnectX-8, 800 Gb/s per GPU
    # NVIDIA GB200 NVL72 spec (nvidia.com/en-us/data-center/gb200-nvl72): 72 GPUs, FP4 1,440 PF, FP8 720 PF,
    # BF16 360 PF (sparse), HBM3e 13.4 TB at 576 TB/s, NVLink 130 TB/s (1.8 TB/s per GPU, both directions).
    HardwareSpec("GB200", 2500e12, 8.0e12, 189471 * MiB, 900e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=7.0), peak_flops_fp8=5000e12,
                 peak_flops_fp4=10000e12, nvlink_domain=72,
                 host_link_bandwidth=NVLINK_C2C, host_link_latency_s=5e-6),  # Grace over NVLink-C2C
    # NVIDIA GB300 NVL72 spec (nvidia.com/en-us/data-center/gb300-nvl72): 72 GPUs, FP4 1,440 PF sparse /
    # 1,080 PF dense, FP8 720 PF and BF16 360 PF sparse, HBM3e up to 21 TB at 576 TB/s, NVLink 130 TB/s.
    HardwareSpec("GB300", 2500e12, 8.0e12, 284208 * MiB, 900e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=8.0), peak_flops_fp8=5000e12,
                 peak_flops_fp4=15000e12, nvlink_domain=72, internode_bandwidth=100e9,
                 host_link_bandwidth=NVLINK_C2C, host_link_latency_s=5e-6),  # Grace over NVLink-C2C
    # NVIDIA GH200 datasheet (nvidia.com/en-us/data-center/grace-hopper-superchip), 96 GB HBM3 version:
    # H100's compute (FP8 3,958 and BF16 1,979 TFLOPS sparse), 4 TB/s, NVLink 900 GB/s, Grace's 480 GB
    # LPDDR5X over NVLink-C2C 900 GB/s; H100's efficiencies by analogy.
    HardwareSpec("GH200", 989e12, 4.0e12, 96e9, 450e9,
                 GPUProfile(gemm=0.62, attention=0.38, **_AR_2025, price_per_hour=3.5), peak_flops_fp8=1979e12,
                 host_link_bandwidth=NVLINK_C2C, host_link_latency_s=5e-6),
    # AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x);
    # published MI300X GEMM studies reach ~45-55% of peak.
    HardwareSpec("MI300X", 1307e12, 5.3e12, 192e9, 448e9,
                 GPUProfile(gemm=0.48, attention=0.30, memory=0.75, price_per_hour=2.5),
                 peak_flops_fp8=2615e12),
]}

# aiconfigurator-core's system names (its systems/*.yaml, silicon_sample.csv's `system`) -> HARDWARES.
AIC_SYSTEMS: dict[str, str] = {
    "a100_sxm": "A100-80GB",
    "h100_sxm": "H100-SXM",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "b300_sxm": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
    "l40s": "L40S",
}


def hardware_for_aic_system(system: str) -> "HardwareSpec":
    """Our catalog GPU for an aiconfigurator system name (e.g. 'h200_sxm'); UnknownSpecError if none."""
    if system not in AIC_SYSTEMS:
        raise UnknownSpecError("aic_system", system, sorted(AIC_SYSTEMS))
    return get_hardware(AIC_SYSTEMS[system])


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    if name in table:
        return table[name]
    folded = {k.lower(): v for k, v in table.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise UnknownSpecError(kind, name, sorted(table))


_ALL_MODELS: dict[str, ModelSpec] = {}
# Functions returning more catalog models, read once; hf_config adds the shipped config files
# (backends/sim/models/*.json) when the package is imported (backends/sim/__init__.py).
MODEL_SOURCES: list[Callable[[], dict[str, ModelSpec]]] = []


def all_models() -> dict[str, ModelSpec]:
    """MODELS plus every MODEL_SOURCES' models, read once."""
    if not _ALL_MODELS:
        for source in MODEL_SOURCES:
            _ALL_MODELS.update(source())
        _ALL_MODELS.update(MODELS)
    return _ALL_MODELS


def get_model(name: str) -> ModelSpec:
    """A model spec by name (case-insensitive): MODELS or a shipped config file."""
    return _lookup(all_models(), "model", name)


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


def catalog_name(spec: ModelSpec) -> str:
    """The name of the catalog model (built in or shipped config) of spec's shape, else spec.name."""
    def shape(m: ModelSpec) -> tuple[int, ...]:
        return (m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim,
                m.vocab_size, m.num_experts, m.sliding_window, m.num_sliding_layers)

    mine = shape(spec)
    for known in all_models().values():
        if shape(known) == mine:
            return known.name
    return spec.name
