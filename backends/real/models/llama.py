"""A Llama-architecture decoder for serving: one flat varlen batch, paged KV cache.

Config switches (models/config.py) make it Mistral, Qwen2, Qwen3 or Gemma 3.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from twinserve.core.errors import UnsupportedConfigFieldError, UnsupportedModelError
from twinserve.backends.real.attention.backend import AttentionBackend, AttentionMetadata
from twinserve.backends.real.models.config import LlamaConfig, ModelConfig, common_fields, reject
from twinserve.backends.real.models.rope import RotaryEmbedding


_SILU = ("silu", "swish")


def _check_act(arch: str, cfg: dict[str, Any], key: str, allowed: tuple[str, ...]) -> None:
    reject(arch, cfg, key, allowed, " or ".join(allowed))


def llama_config(cfg: dict[str, Any], arch: str = "LlamaForCausalLM") -> ModelConfig:
    """LlamaForCausalLM: full attention everywhere, optional attention/MLP biases."""
    _check_act(arch, cfg, "hidden_act", _SILU)
    if cfg.get("sliding_window") is not None and arch == "LlamaForCausalLM":
        raise UnsupportedConfigFieldError(arch, "sliding_window", cfg["sliding_window"],
                                          "None (Llama has no sliding window; use MistralForCausalLM)")
    kw = common_fields(arch, cfg)
    kw.update(attention_bias=bool(cfg.get("attention_bias", False)), mlp_bias=bool(cfg.get("mlp_bias", False)))
    return ModelConfig(**kw)


# Rows up to which x @ W_t beats F.linear, by CPU ISA (docs/speed.md).
SMALL_BATCH_ROWS = 4
SMALL_BATCH_ROWS_BY_CAPABILITY = {"AVX512": 64}
# On AMD CPUs MKL's fp32 sgemm is slow for few rows; oneDNN's prepacked product is not, so
# only 1-row products take x @ W_t there and the rest the prepacked weights (docs/speed.md).
AMD_SMALL_BATCH_ROWS = 1
# Quantized kernels only win on weight-bound 1-row products (docs/speed.md).
INT8_ROWS = 1
# Q4_1's block size.
INT4_GROUP = 32
# MKL's sgemm runs 16 rows faster than 9-15 (docs/speed.md). 0 turns padding off.
PAD_ROWS = 16
PAD_MIN_ROWS = 9


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor_id from /proc/cpuinfo ('' where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def fp32_prepack_preferred() -> bool:
    """True where fp32 products above small_batch_rows rows should run on oneDNN-prepacked weights."""
    return cpu_vendor() == "AuthenticAMD" and torch.backends.mkldnn.is_available()


def default_small_batch_rows() -> int:
    """The row count up to which this CPU's fp32 products take the transposed weight copies."""
    if fp32_prepack_preferred():
        return AMD_SMALL_BATCH_ROWS
    return SMALL_BATCH_ROWS_BY_CAPABILITY.get(torch.backends.cpu.get_cpu_capability(), SMALL_BATCH_ROWS)


def layer_projections(layer: nn.Module) -> tuple[nn.Linear, ...]:
    """A decoder layer's four projections, in a step's order."""
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)


def _padded(x: torch.Tensor) -> int:
    n = x.shape[0]
    if PAD_MIN_ROWS <= n < PAD_ROWS and x.dtype == torch.float32 and not x.is_cuda:
        return PAD_ROWS
    return 0


def _dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, padded to PAD_ROWS rows when that is faster."""
    rows = _padded(x)
    if rows:
        n = x.shape[0]
        return nn.functional.linear(nn.functional.pad(x, (0, 0, 0, rows - n)), weight, bias)[:n]
    return nn.functional.linear(x, weight, bias)


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """layer(x) through whichever quantized, prepacked or transposed copy fits the rows."""
    # __dict__: a getattr miss on a Module costs ~1 us through Module.__getattr__.
    d = layer.__dict__
    w4 = d.get("weight_int4")
    if w4 is not None and x.shape[0] <= INT8_ROWS:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, w4, INT4_GROUP, d["weight_int4_sz"])
        return out if layer.bias is None else out + layer.bias
    w8 = d.get("weight_int8")
    if w8 is not None and x.shape[0] <= INT8_ROWS:
        out = torch.ops.aten._weight_int8pack_mm(x, w8, d["weight_scale"])
        return out if layer.bias is None else out + layer.bias
    table = d.get("row_paths")
    if table is not None:
        n = x.shape[0]
        kind = table[n] if n < len(table) else table[-1]
        if kind == _TRANSPOSED:
            out = x @ d["weight_rows_t"]
        elif kind == _BLOCKED:
            out = d["few_rows"].mm(x, d["weight_blocked"], d["out_features"])
        elif kind == _PREPACKED:
            return torch.ops.mkldnn._linear_pointwise(x, d["weight_packed"], layer.bias, "none", [], "")
        else:
            return _dense(x, layer.weight, layer.bias)
        return out if layer.bias is None else out + layer.bias
    wt = getattr(layer, "weight_t", None)
    if wt is not None and x.shape[0] <= d["small_rows"]:
        out = x @ wt
        return out if layer.bias is None else out + layer.bias
    packed = d.get("weight_packed")
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
    return _dense(x, layer.weight, layer.bias)


# Path codes of a product plan's table, indexed by rows (product_paths.PATHS).
_TRANSPOSED, _PREPACKED, _LINEAR, _BLOCKED = range(4)
_CODES = {"transposed": _TRANSPOSED, "prepacked": _PREPACKED, "linear": _LINEAR, "blocked": _BLOCKED}


def row_table(table: tuple[str, ...]) -> tuple[int, ...]:
    """A plan's table (rows 1..n, then larger) as path codes indexed by rows (index 0 unused)."""
    return (_CODES[table[0]], *(_CODES[p] for p in table))


def packed_bf16_supported() -> bool:
    """True where oneDNN runs bf16 products on this CPU (AVX512-BF16 or AMX) from prepacked weights."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise") and bool(ops._is_mkldnn_bf16_supported()))


class RMSNorm(nn.Module):
    """RMS norm, computed in fp32 as the reference does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last axis and scale."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMS norm: weight stored as an offset from 1."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last axis and scale by 1 + weight."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg: LlamaConfig, size: int) -> RMSNorm:
    """The config's RMS norm over `size` values."""
    return (GemmaRMSNorm if cfg.gemma_norms else RMSNorm)(size, cfg.rms_norm_eps)


class LlamaAttention(nn.Module):
    # Set by shard_llama on a tensor-parallel rank (o_proj is row-parallel).
    """Self-attention with GQA; K/V go through the attention backend into the paged cache."""
    tp = None
    # Its KV cache group (core/kv/groups.py), set by the model runner: whose block table it reads.
    kv_group = 0

    def __init__(self, cfg: LlamaConfig, rope: RotaryEmbedding, window: int | None = None) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias or cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.rope = rope
        self.window = window  # None: full attention

    def forward(self, cos_sin: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, backend: AttentionBackend) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        t = x.shape[0]
        qkv = linear(x, self.qkv_proj)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.contiguous().view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(cos_sin, q, k)
        if self.kv_group and meta.groups is not None:
            meta = meta.groups[self.kv_group]
        if self.window is None:
            o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        else:
            o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, sliding_window=self.window)
        out = linear(o.reshape(t, self.q_size), self.o_proj)
        return out if self.tp is None else self.tp.all_reduce(out)


class LlamaMLP(nn.Module):
    """SwiGLU (Gemma: GeGLU) feed-forward."""

    tp = None  # down_proj is row-parallel, like o_proj

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gelu = cfg.hidden_act == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate, up = linear(x, self.gate_up_proj).split(self.inter, dim=-1)
        act = nn.functional.gelu(gate, approximate="tanh") if self.gelu else nn.functional.silu(gate)
        out = linear(act * up, self.down_proj)
        return out if self.tp is None else self.tp.all_reduce(out)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals (Gemma: each block also post-normed)."""
    def __init__(self, cfg: LlamaConfig, rope: RotaryEmbedding, window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.self_attn = LlamaAttention(cfg, rope, window)
        # Llama: the MLP's pre-norm; Gemma: the attention output's post-norm.
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mlp = LlamaMLP(cfg)
        self.sandwich = cfg.gemma_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)

    def forward(self, cos_sin: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, backend: AttentionBackend) -> torch.Tensor:
        """One decoder layer."""
        if self.sandwich:
            a = self.self_attn(cos_sin, self.input_layernorm(h), kv_cache, meta, backend)
            h = h + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = h + self.self_attn(cos_sin, self.input_layernorm(h), kv_cache, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head (tied or not)."""
    tp = None  # tensor parallel: the head computes this rank's vocab slice, then gathers

    def __init__(self, cfg: LlamaConfig, max_len: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                               cfg.max_position_embeddings, max_len, dtype)
        # Gemma 3's local layers use their own RoPE base.
        local = rope
        if cfg.local_rope_theta is not None:
            local = RotaryEmbedding(cfg.head_dim, cfg.local_rope_theta, None, cfg.max_position_embeddings,
                                    max_len, dtype)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, rope if w is None else local, w)
                                    for w in cfg.layer_windows)
        self.norm = make_norm(cfg, cfg.hidden_size)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = rope
        self.local_rope = None if local is rope else local
        # Gemma scales embeddings by sqrt(hidden), rounded to the dtype as HF does.
        self.embed_scale = (torch.tensor(cfg.hidden_size ** 0.5, dtype=dtype).item()
                            if cfg.gemma_norms else None)
        self.small_batch_rows = 0

    @classmethod
    def config_from_hf(cls, cfg: dict) -> LlamaConfig:
        """The architecture record from a transformers config.json dict (see models/architectures.py)."""
        return llama_config(cfg)

    def projections(self) -> Iterator[nn.Linear]:
        """Every layer's projections; not the LM head."""
        for layer in self.layers:
            yield from layer_projections(layer)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """Token ids [T] and positions [T] -> final hidden states [T, hidden]."""
        h = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        cos_sin = self.rope.lookup(positions)
        local = cos_sin if self.local_rope is None else self.local_rope.lookup(positions)
        for layer, cache in zip(self.layers, kv_caches):
            h = layer(cos_sin if layer.self_attn.rope is self.rope else local, h, cache, meta, backend)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, hidden] -> fp32 logits [N, vocab]."""
        head_packed = self.__dict__.get("head_packed")
        head_t = getattr(self, "head_t", None)
        head_int8 = self.__dict__.get("head_int8")
        table = self.__dict__.get("head_rows")
        if head_int8 is not None and hidden.shape[0] <= INT8_ROWS:
            logits = torch.ops.aten._weight_int8pack_mm(hidden, head_int8, self.head_scale).float()
        elif table is not None:
            n = hidden.shape[0]
            kind = table[n] if n < len(table) else table[-1]
            if kind == _TRANSPOSED:
                logits = (hidden @ self.__dict__["head_rows_t"]).float()
            elif kind == _BLOCKED:
                logits = self.__dict__["few_rows"].mm(hidden, self.__dict__["head_blocked"],
                                                      self.__dict__["head_out"]).float()
            elif kind == _PREPACKED:
                logits = torch.ops.mkldnn._linear_pointwise(hidden, head_packed, None, "none", [], "").float()
            else:
                weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
                logits = _dense(hidden, weight).float()
        elif head_t is not None and hidden.shape[0] <= self.small_batch_rows:
            logits = (hidden @ head_t).float()
        elif head_packed is not None:
            logits = torch.ops.mkldnn._linear_pointwise(hidden, head_packed, None, "none", [], "").float()
        else:
            weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = _dense(hidden, weight).float()
        return logits if self.tp is None else self.tp.gather_vocab(logits)

    def add_packed_weights(self) -> None:
        """Keep the weights prepacked for oneDNN, which F.linear would reorder on every call (docs/speed.md)."""
        def pack(weight: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)

        for lin in self.projections():
            lin.weight_packed = pack(lin.weight)  # not a buffer to move or save
        self.head_packed = pack(self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)

    def add_int8_weights(self) -> None:
        """Keep per-channel int8 copies of the weights for weight-bound INT8_ROWS-row products (docs/speed.md)."""
        def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            w = weight.detach().float()
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            return q, scale.to(torch.bfloat16)

        for lin in self.projections():
            lin.weight_int8, lin.weight_scale = quantize(lin.weight)
        self.head_int8, self.head_scale = quantize(
            self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)

    def add_int4_weights(self) -> None:
        """Keep int4 copies of the projections and an int8 LM head, for 1-row products.

        Groups are GGUF Q4_1's layout, so a Q4_1 model keeps its own values up to bf16 rounding.
        """
        g = INT4_GROUP
        for lin in self.projections():
            n, k = lin.weight.shape
            if k % g:
                raise UnsupportedModelError(f"int4 weights need rows of a multiple of {g} values, got {k}")
            w = lin.weight.detach().float().view(n, k // g, g)
            low = w.amin(dim=-1, keepdim=True)
            scale = ((w.amax(dim=-1, keepdim=True) - low) / 15).clamp(min=1e-12)
            q = torch.round((w - low) / scale).clamp(0, 15).to(torch.int32).view(n, k)
            # The kernel computes (q - 8) * scale + zero, so zero = min + 8 * scale.
            sz = torch.stack([scale.view(n, k // g), (low + 8 * scale).view(n, k // g)], dim=-1)
            lin.weight_int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            lin.weight_int4_sz = sz.transpose(0, 1).contiguous().to(torch.bfloat16)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        w = head.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.head_int8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.head_scale = scale.to(torch.bfloat16)

    def add_small_batch_weights(self, rows: int | None = None) -> None:
        """Keep [in, out] weight copies for products of at most `rows` rows (None: by CPU; see SMALL_BATCH_ROWS)."""
        for lin in self.projections():
            lin.register_buffer("weight_t", lin.weight.detach().t().contiguous(), persistent=False)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.register_buffer("head_t", weight.detach().t().contiguous(), persistent=False)
        self.set_small_batch_rows(default_small_batch_rows() if rows is None else rows)

    def set_product_plan(self, projections: tuple[str, ...], head: tuple[str, ...]) -> None:
        """Products of r rows take the plan's path for r (product_paths.ProductPlan); only the copies
        those paths read are kept."""
        from twinserve.backends.real import few_rows

        module = few_rows.load()[0] if "blocked" in (*projections, *head) else None
        if module is None and "blocked" in (*projections, *head):
            raise RuntimeError("a product plan names the few-row kernel, which did not load")
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        for lin in self.projections():
            d = lin.__dict__
            w = lin.weight.detach()
            d["row_paths"] = row_table(projections)
            d["out_features"] = w.shape[0]
            d["few_rows"] = module
            if "transposed" in projections:
                d["weight_rows_t"] = w.t().contiguous()
            if "prepacked" in projections:
                d["weight_packed"] = torch.ops.mkldnn._reorder_linear_weight(w, 1)
            if "blocked" in projections:
                d["weight_blocked"] = module.pack(w)
        d = self.__dict__
        d["head_rows"] = row_table(head)
        d["few_rows"] = module
        d["head_out"] = weight.shape[0]
        w = weight.detach()
        if "transposed" in head:
            d["head_rows_t"] = w.t().contiguous()
        if "prepacked" in head:
            d["head_packed"] = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        if "blocked" in head:
            d["head_blocked"] = module.pack(w)

    def set_small_batch_rows(self, rows: int) -> None:
        """Products of at most `rows` rows take the transposed copies (add_small_batch_weights)."""
        self.small_batch_rows = int(rows)
        for lin in self.projections():
            lin.small_rows = int(rows)
