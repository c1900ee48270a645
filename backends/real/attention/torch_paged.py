"""Paged attention in plain PyTorch: block-table gathers and SDPA, the CPU default.

Decodes are bucketed by context and gathered by one index_select per bucket into [B, Hkv, S, D]
(GQA folded into the query axis). Window layers read only their window, so older blocks may be freed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from twinserve.backends.real.attention.backend import AttentionMetadata

# Bounding bucket padding keeps cost following the sum of contexts, which the simulator prices.
_MAX_DECODE_BUCKETS = 8
_PAD_TOLERANCE = 0.125
_PAD_SLACK = 32
# Chunked so SDPA reads K/V from cache, not memory (docs/speed.md).
_GATHER_BYTES = 4 << 20


@dataclass(slots=True)
class _DecodeBucket:
    rows: slice  # decodes are a prefix of the flat batch
    # int64 [B * Hkv * S]: rows of the cache viewed as [slots * Hkv, D]
    row_index: torch.Tensor
    shape: tuple[int, int, int]  # (B, Hkv, S)
    mask: torch.Tensor | None  # bool [B, 1, 1, S], True = attend; None when no padding


@dataclass(slots=True)
class _Prefill:
    rows: slice
    context_len: int
    seq_len: int
    slot_index: torch.Tensor | None  # None: no cached context to read back
    mask: torch.Tensor | None


@dataclass(slots=True)
class _TorchPlan:
    decodes: list[_DecodeBucket]
    prefills: list[_Prefill]
    # Per sliding window, built on a window layer's first call.
    block_size: int = 0
    windows: dict[int, "_TorchPlan"] | None = None


def _slots(block_row: torch.Tensor, length: int, block_size: int, first: int = 0) -> torch.Tensor:
    pos = torch.arange(first, length, device=block_row.device)
    return block_row[pos // block_size].long() * block_size + pos % block_size


class TorchPagedAttention:
    """The reference attention path for CPU (and any device)."""

    name = "torch"
    # plan() buckets decodes on the host: not capturable.
    supports_cuda_graphs = False

    def plan(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int) -> None:
        """Build gather indices and masks once per step; every layer reuses them."""
        meta.plan = _build_plan(meta, block_size, num_kv_heads, None)
        meta.plan.windows = {}

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, sliding_window: int | None = None) -> torch.Tensor:
        """Store the new K/V, then attend decodes in buckets and prefills one by one."""
        plan: _TorchPlan = meta.plan
        if sliding_window is not None:
            windowed = plan.windows.get(sliding_window)
            if windowed is None:
                windowed = plan.windows[sliding_window] = _build_plan(
                    meta, plan.block_size, key_cache.shape[2], sliding_window)
            plan = windowed
        return _attend(plan, query, key, value, key_cache, value_cache, meta, scale)


def _build_plan(meta: AttentionMetadata, block_size: int, num_kv_heads: int,
                window: int | None) -> _TorchPlan:
    """Gather indices and masks of one step; with a window, only its positions."""
    bt = meta.block_tables
    hkv = num_kv_heads
    device = bt.device
    nd = meta.num_decodes
    decodes: list[_DecodeBucket] = []
    if nd:
        seqs = meta.seq_lens_cpu[:nd]
        # A decode reads at most the window's W positions.
        lens = seqs if window is None else [min(x, window) for x in seqs]
        for lo, hi in _buckets(lens):
            s_max = max(lens[lo:hi])
            pos = torch.arange(s_max, device=device)
            seq = meta.seq_lens[lo:hi].long().unsqueeze(1)
            if window is None:
                nblk = -(-s_max // block_size)
                blocks = bt[lo:hi, :nblk].long()
                idx = blocks[:, pos // block_size] * block_size + pos % block_size
                valid = pos.unsqueeze(0) < seq
            else:
                start = (seq - window).clamp(min=0)
                abs_pos = start + pos.unsqueeze(0)  # [B, S]
                valid = abs_pos < seq
                abs_pos = torch.where(valid, abs_pos, start)  # padding re-reads a window slot
                blk = bt[lo:hi].long().gather(1, abs_pos // block_size)
                idx = blk * block_size + abs_pos % block_size
            mask = None if bool(valid.all()) else valid[:, None, None, :]
            heads = torch.arange(hkv, device=device)
            rows = (idx.unsqueeze(1) * hkv + heads[None, :, None]).reshape(-1)
            decodes.append(_DecodeBucket(slice(lo, hi), rows, (hi - lo, hkv, s_max), mask))
    prefills: list[_Prefill] = []
    start = nd
    for i in range(nd, len(meta.query_lens_cpu)):
        q, s = meta.query_lens_cpu[i], meta.seq_lens_cpu[i]
        ctx = s - q
        idx = mask = None
        qpos = ctx + torch.arange(q, device=device).unsqueeze(1)
        if ctx > 0:
            first = 0 if window is None else max(0, ctx - window + 1)
            idx = _slots(bt[i], s, block_size, first)
            kpos = torch.arange(first, s, device=device).unsqueeze(0)
            mask = kpos <= qpos
            if window is not None:
                mask &= kpos > qpos - window
        elif window is not None and q > window:
            kpos = torch.arange(s, device=device).unsqueeze(0)
            mask = (kpos <= qpos) & (kpos > qpos - window)
        prefills.append(_Prefill(slice(start, start + q), ctx, s, idx, mask))
        start += q
    return _TorchPlan(decodes, prefills, block_size)


def _attend(plan: _TorchPlan, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            key_cache: torch.Tensor, value_cache: torch.Tensor, meta: AttentionMetadata,
            scale: float) -> torch.Tensor:
    _, _, hkv, d = key_cache.shape
    kc = key_cache.view(-1, hkv, d)
    vc = value_cache.view(-1, hkv, d)
    kc.index_copy_(0, meta.slot_mapping, key)
    vc.index_copy_(0, meta.slot_mapping, value)
    hq = query.shape[1]
    group = hq // hkv
    out = torch.empty_like(query)
    k_rows = key_cache.view(-1, d)
    v_rows = value_cache.view(-1, d)
    for b in plan.decodes:
        n, _, s_max = b.shape
        per_row = hkv * s_max
        step = max(1, _GATHER_BYTES // (2 * per_row * d * key_cache.element_size()))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            rows = slice(b.rows.start + lo, b.rows.start + hi)
            index = b.row_index[lo * per_row:hi * per_row]
            q = query[rows].view(-1, hkv, group, d)
            k = k_rows.index_select(0, index).view(hi - lo, hkv, s_max, d)  # [B, Hkv, S, D]
            v = v_rows.index_select(0, index).view(hi - lo, hkv, s_max, d)
            mask = None if b.mask is None else b.mask[lo:hi]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            out[rows] = o.reshape(-1, hq, d)
    for p in plan.prefills:
        q = query[p.rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, T, D]
        if p.slot_index is None:
            k, v = key[p.rows], value[p.rows]
        else:
            k, v = kc.index_select(0, p.slot_index), vc.index_select(0, p.slot_index)
        k = k.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
        if p.mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=p.mask, scale=scale)
        out[p.rows] = o[0].transpose(0, 1)
    return out


def _buckets(lens: list[int]) -> list[tuple[int, int]]:
    tol = _PAD_TOLERANCE
    while True:
        out = _runs(lens, tol)
        if len(out) <= _MAX_DECODE_BUCKETS:
            return out
        tol *= 2


def _runs(lens: list[int], tol: float) -> list[tuple[int, int]]:
    """Greedy runs whose context spread is at most max(tol x shortest, slack)."""
    out: list[tuple[int, int]] = []
    lo, lo_len, hi_len = 0, lens[0], lens[0]
    for i in range(1, len(lens)):
        x = lens[i]
        top = max(hi_len, x)
        if top - min(lo_len, x) > max(tol * min(lo_len, x), _PAD_SLACK):
            out.append((lo, i))
            lo, lo_len, hi_len = i, x, x
        else:
            lo_len, hi_len = min(lo_len, x), top
    out.append((lo, len(lens)))
    return out
