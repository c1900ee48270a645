"""Tensor parallelism for the Llama model: which heads, rows and vocab a rank owns, and the collectives.

Megatron-style: QKV and gate/up are column-parallel, o_proj and down_proj row-parallel with an
all-reduce, embedding and LM head split by vocab. KV heads split unevenly or are replicated when
tp exceeds them, so ranks may hold different head counts (the KV cache is sized by the smallest).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.models.config import LlamaConfig


def split_sizes(n: int, parts: int) -> list[int]:
    """n items in `parts` contiguous near-equal chunks (the first ones one larger)."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def chunk(n: int, parts: int, index: int) -> range:
    """The index-th of split_sizes(n, parts) as a range."""
    sizes = split_sizes(n, parts)
    lo = sum(sizes[:index])
    return range(lo, lo + sizes[index])


def head_partition(num_heads: int, num_kv_heads: int, tp: int, rank: int) -> tuple[list[int], list[int]]:
    """(query heads, KV heads) that `rank` of `tp` owns; a typed error when no valid split exists."""
    if num_heads % num_kv_heads:
        raise InvalidConfigError("num_attention_heads", num_heads, f"a multiple of num_key_value_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    if tp <= num_kv_heads:
        kv = list(chunk(num_kv_heads, tp, rank))
        return [k * group + j for k in kv for j in range(group)], kv
    if tp % num_kv_heads or tp // num_kv_heads > group:
        raise InvalidConfigError(
            "tensor_parallel_size", tp,
            f"at most {num_kv_heads} (KV heads), or a multiple of it up to {num_heads} (query heads)")
    reps = tp // num_kv_heads
    k = rank // reps
    return [k * group + j for j in chunk(group, reps, rank % reps)], [k]


@dataclass(slots=True)
class TensorParallel:
    """This rank's place in the group and the collectives the model calls; times them."""

    rank: int
    world_size: int
    group: object | None = None
    # Host time since the last take_comm_time(): with async NCCL, launch time unless synchronized.
    comm_time_s: float = 0.0
    vocab_sizes: list[int] = field(default_factory=list)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over ranks, in place."""
        import torch.distributed as dist

        t = time.perf_counter()
        dist.all_reduce(x, group=self.group)
        self.comm_time_s += time.perf_counter() - t
        return x

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, local vocab] per rank -> [N, full vocab] on every rank (shards may be uneven)."""
        import torch.distributed as dist

        t = time.perf_counter()
        width = max(self.vocab_sizes)
        local = logits
        if local.shape[1] < width:
            local = nn.functional.pad(local, (0, width - local.shape[1]))
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        out = torch.cat([p[:, :n] for p, n in zip(parts, self.vocab_sizes)], dim=1)
        self.comm_time_s += time.perf_counter() - t
        return out

    def take_comm_time(self) -> float:
        """Collective time since the last call, and reset."""
        t, self.comm_time_s = self.comm_time_s, 0.0
        return t


class VocabParallelEmbedding(nn.Embedding):
    """This rank's vocab rows; ids outside them contribute zeros, then an all-reduce sums the ranks."""

    def __init__(self, full: nn.Embedding, lo: int, hi: int, tp: TensorParallel) -> None:
        super().__init__(hi - lo, full.embedding_dim, _weight=full.weight.detach()[lo:hi].clone(),
                         _freeze=True)
        self.lo, self.hi, self.tp = lo, hi, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """[T] ids -> [T, hidden]."""
        mine = (ids >= self.lo) & (ids < self.hi)
        local = torch.where(mine, ids - self.lo, torch.zeros_like(ids))
        h = nn.functional.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(h)


def _rows(w: torch.Tensor, idx: list[int]) -> torch.Tensor:
    return w.detach()[idx].clone()


def _keep(lin: nn.Linear, rows: list[int] | None = None, cols: list[int] | None = None,
          bias_on: bool = True) -> None:
    w = lin.weight.detach()
    if rows is not None:
        lin.weight = nn.Parameter(w[rows].clone(), requires_grad=False)
        if lin.bias is not None:
            lin.bias = nn.Parameter(lin.bias.detach()[rows].clone(), requires_grad=False)
        lin.out_features = len(rows)
    if cols is not None:
        lin.weight = nn.Parameter(w[:, cols].clone(), requires_grad=False)
        lin.in_features = len(cols)
        if lin.bias is not None and not bias_on:
            lin.bias.data.zero_()  # a row-parallel bias is added once, by rank 0


def shard_llama(model: nn.Module, tp: TensorParallel) -> nn.Module:
    """Cut a full LlamaForCausalLM down to this rank's share, in place; returns it."""
    cfg: LlamaConfig = model.config
    rank, size = tp.rank, tp.world_size
    hd = cfg.head_dim
    q_heads, kv_heads = head_partition(cfg.num_attention_heads, cfg.num_key_value_heads, size, rank)
    q_rows = [h * hd + d for h in q_heads for d in range(hd)]
    k_rows = [cfg.q_size + k * hd + d for k in kv_heads for d in range(hd)]
    v_rows = [cfg.q_size + cfg.kv_size + k * hd + d for k in kv_heads for d in range(hd)]
    inter = list(chunk(cfg.intermediate_size, size, rank))
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        _keep(attn.qkv_proj, rows=q_rows + k_rows + v_rows)
        _keep(attn.o_proj, cols=q_rows, bias_on=rank == 0)
        attn.num_heads, attn.num_kv_heads = len(q_heads), len(kv_heads)
        attn.q_size, attn.kv_size = len(q_heads) * hd, len(kv_heads) * hd
        attn.tp = tp
        _keep(mlp.gate_up_proj, rows=inter + [cfg.intermediate_size + i for i in inter])
        _keep(mlp.down_proj, cols=inter, bias_on=rank == 0)
        mlp.inter = len(inter)
        mlp.tp = tp
    tp.vocab_sizes = split_sizes(cfg.vocab_size, size)
    vocab = chunk(cfg.vocab_size, size, rank)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, vocab.start, vocab.stop, tp)
    if model.lm_head is not None:
        _keep(model.lm_head, rows=list(vocab))
    model.tp = tp
    # Local shapes: the runner sizes the KV cache and plans attention from these.
    model.config = dataclasses.replace(cfg, num_attention_heads=len(q_heads),
                                       num_key_value_heads=len(kv_heads), intermediate_size=len(inter))
    model.full_config = cfg
    return model
