"""Decode steps replayed from CUDA graphs captured once per batch-size bucket.

Small-batch GPU decode is launch-bound; one replay launches every kernel at once. A step pads its
batch to the next bucket (pad rows write no KV, slot -1) and copies inputs into static buffers; on
CPU the same path runs eagerly, so the padding is testable without a GPU. Capture needs a backend
whose launches do not depend on the batch's lengths (``supports_cuda_graphs``). A model with several
KV cache groups (sliding-window and full layers) has a static block table and slot mapping per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinserve.backends.real.attention import AttentionBackend, AttentionMetadata

# Small steps finely, then every 16 (vLLM's spacing).
_SMALL = (1, 2, 4, 8)
MAX_CAPTURE = 512


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Captured batch sizes for an engine that runs at most max_num_seqs requests."""
    top = min(max_num_seqs, MAX_CAPTURE)
    sizes = [b for b in _SMALL if b < top] + list(range(16, top, 16))
    return sorted(set(sizes + [top]))


@dataclass(slots=True)
class _Static:
    input_ids: torch.Tensor  # int64 [B]
    positions: torch.Tensor  # int64 [B]
    slot_mapping: torch.Tensor  # int64 [B], -1 = write nothing
    seq_lens: torch.Tensor  # int32 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    query_start_loc: torch.Tensor  # int32 [B + 1], 0..B
    # Groups 1.. of a model with several KV cache groups: (slot_mapping, block_tables) each.
    groups: list[tuple[torch.Tensor, torch.Tensor]]


class DecodeGraphs:
    """Pure-decode steps through per-bucket CUDA graphs (or their eager twin on CPU)."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                 max_num_seqs: int, max_blocks_per_req: int, max_model_len: int, capture: bool,
                 num_groups: int = 1) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.device = device
        self.max_model_len = max_model_len
        self.buckets = graph_buckets(max_num_seqs)
        self.capture = capture
        b = self.buckets[-1]
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        self.static = _Static(torch.zeros(b, **i64), torch.zeros(b, **i64), torch.full((b,), -1, **i64),
                              torch.ones(b, **i32), torch.zeros((b, max_blocks_per_req), **i32),
                              torch.arange(b + 1, **i32),
                              [(torch.full((b,), -1, **i64), torch.zeros((b, max_blocks_per_req), **i32))
                               for _ in range(num_groups - 1)])
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0

    def bucket_for(self, n: int) -> int | None:
        """The smallest bucket that holds n rows, or None when n is over the largest."""
        return next((b for b in self.buckets if b >= n), None)

    def _meta(self, b: int) -> AttentionMetadata:
        s = self.static
        # max_seq_len is the engine's bound, so a bucket's launches (tiles, split count) are fixed.
        meta = AttentionMetadata(b, b, s.query_start_loc[:b + 1], s.seq_lens[:b], s.block_tables[:b],
                                 s.slot_mapping[:b], 1, self.max_model_len, [1] * b, [self.max_model_len] * b)
        self.backend.plan(meta, self.kv_caches[0][0].shape[1], self.kv_caches[0][0].shape[2])
        if s.groups:
            meta.groups = [meta]
            for slots, tables in s.groups:
                gm = AttentionMetadata(b, b, meta.query_start_loc, meta.seq_lens, tables[:b], slots[:b], 1,
                                       self.max_model_len, meta.query_lens_cpu, meta.seq_lens_cpu)
                self.backend.plan(gm, self.kv_caches[0][0].shape[1], self.kv_caches[0][0].shape[2])
                meta.groups.append(gm)
        return meta

    def _forward(self, b: int) -> torch.Tensor:
        s = self.static
        return self.model(s.input_ids[:b], s.positions[:b], self.kv_caches, self._meta(b), self.backend)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every bucket, largest first so smaller graphs reuse its memory pool."""
        if not self.capture:
            return
        for b in reversed(self.buckets):
            self._forward(b)  # warm-up: Triton compiles and caches its kernels outside capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self._forward(b)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            seq_lens: torch.Tensor, block_tables: torch.Tensor,
            groups: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """Hidden states [n, hidden] of an n-row decode batch (groups: groups 1..'s slots and tables)."""
        n = input_ids.shape[0]
        b = self.bucket_for(n)
        if b is None:
            raise ValueError(f"decode batch of {n} rows is over the largest graph bucket {self.buckets[-1]}")
        s = self.static
        s.input_ids[:n].copy_(input_ids, non_blocking=True)
        s.positions[:n].copy_(positions, non_blocking=True)
        s.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        s.slot_mapping[n:b].fill_(-1)
        s.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        s.seq_lens[n:b].fill_(1)
        width = block_tables.shape[1]
        s.block_tables[:n, :width].copy_(block_tables, non_blocking=True)
        s.block_tables[n:b].zero_()
        if len(groups or ()) != len(s.groups):
            raise ValueError(f"decode batch has {len(groups or ()) + 1} KV groups, the graphs {len(s.groups) + 1}")
        for (slots, tables), (g_slots, g_tables) in zip(s.groups, groups or ()):
            slots[:n].copy_(g_slots, non_blocking=True)
            slots[n:b].fill_(-1)
            tables[:n, :g_tables.shape[1]].copy_(g_tables, non_blocking=True)
            tables[n:b].zero_()
        graph = self.graphs.get(b)
        self.replays += 1
        if graph is None:
            return self._forward(b)[:n]
        graph[0].replay()
        return graph[1][:n]
