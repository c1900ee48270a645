"""Device self-check sections used by experiments/gpu_check.py: correctness, CUDA graphs, speed.

Each section takes a ``Context`` and reports rows through ``ctx.report(section, case,
status, detail)``; with ``--cpu-smoke`` the same code runs tiny shapes under the interpreter.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from twinserve.kernels import ops
from twinserve.kernels.bench import (attention_bytes, attention_flops, peak_bandwidth, random_cache_pool,
                    scattered_block_tables, time_call, varlen_metadata)
from twinserve.kernels.heuristics import choose_config
from twinserve.kernels.reference import ref_paged_attention, ref_store_kv
from twinserve.kernels.testing import make_paged_batch

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class Context:
    """What every section needs: options, time budget, device facts and the report sink."""

    args: Any
    deadline: Any
    report: Callable[[str, str, str, str], None]
    device: torch.device = field(init=False)
    smoke: bool = field(init=False)
    peak: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.smoke = bool(self.args.cpu_smoke)
        self.device = torch.device("cpu" if self.smoke else "cuda")

    def describe_device(self) -> None:
        """Report versions, the device and its peak bandwidth."""
        import triton

        name = "cpu (Triton interpreter)" if self.smoke else torch.cuda.get_device_name(self.device)
        self.peak = self.args.peak_gbps * 1e9 if self.args.peak_gbps else peak_bandwidth(name)
        peak = f"{self.peak / 1e12:.2f} TB/s" if self.peak else "unknown (pass --peak-gbps)"
        self.report("env", "device", "INFO", f"{name}; peak {peak}; torch {torch.__version__}; "
                    f"triton {triton.__version__}; threads {torch.get_num_threads()}")

    def sync(self) -> None:
        """Wait for queued device work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _max_err(out: torch.Tensor, ref: torch.Tensor, rows: int) -> float:
    return (out[:rows].float() - ref[:rows].float()).abs().max().item() if rows else 0.0


def section_correct(ctx: Context) -> None:
    """Kernels vs references across dtypes, GQA ratios, block sizes, head dims and split modes."""
    rng = random.Random(0)
    dtypes = [torch.float32, torch.float16] if ctx.smoke else [torch.bfloat16, torch.float16, torch.float32]
    for dtype in dtypes:
        # bf16 cannot be tested on CPU, so it gets every ratio here; fp32/fp16 are covered by the CPU suite.
        groups = (1, 3, 4, 8) if dtype == torch.bfloat16 and not ctx.args.quick else (1, 4)
        for block_size, head_dim in ((16, 64), (32, 128)):
            if ctx.deadline.left() < 30:
                ctx.report("correct", f"{DTYPE_NAMES[dtype]} bs{block_size} d{head_dim}", "SKIP", "time budget")
                continue
            worst, failures = 0.0, []
            for group in groups:
                if ctx.smoke:
                    q_lens, c_lens = [1, 1, 5, 12], [rng.randint(0, 60) for _ in range(4)]
                else:
                    q_lens = [1, 1, 1, 1, 37, 130, 1, 260]
                    c_lens = [rng.randint(0, 1500) for _ in q_lens]
                    c_lens[-1] = 0  # a fresh prompt among chunks with context
                b = make_paged_batch(q_lens, c_lens, num_kv_heads=2, group=group, head_dim=head_dim,
                                     block_size=block_size, dtype=dtype, device=ctx.device, pad_tokens=2,
                                     generator=torch.Generator().manual_seed(group))
                ref = ref_paged_attention(*b.attention_args())
                for mode, kwargs in (("nosplit", {"split_kv": False}), ("split4", {"split_kv": True, "num_splits": 4}),
                                     ("auto", {})):
                    out = ops.paged_attention(*b.attention_args(), **kwargs)
                    err = _max_err(out, ref, b.num_real_tokens)
                    worst = max(worst, err)
                    if not err <= TOLERANCE[dtype]:
                        failures.append(f"g{group}/{mode}={err:.2e}")
                # The store kernel must reproduce the reference writer bit for bit.
                kc, vc = b.key_cache.clone(), b.value_cache.clone()
                ops.store_kv(b.new_key, b.new_value, kc, vc, b.slot_mapping)
                ref_store_kv(b.new_key, b.new_value, b.key_cache, b.value_cache, b.slot_mapping)
                if not (torch.equal(kc, b.key_cache) and torch.equal(vc, b.value_cache)):
                    failures.append(f"g{group}/store_kv")
            case = f"{DTYPE_NAMES[dtype]} bs{block_size} d{head_dim} gqa{','.join(map(str, groups))}"
            detail = f"max|err| {worst:.2e} (tol {TOLERANCE[dtype]:.0e})"
            ctx.report("correct", case, "FAIL" if failures else "PASS",
                       detail + (" failing: " + " ".join(failures) if failures else ""))
    _decode_auto_split_case(ctx)


def _decode_auto_split_case(ctx: Context) -> None:
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    ctx_len = 200 if ctx.smoke else 20000
    b = make_paged_batch([1, 1], [ctx_len, ctx_len // 3 + 5], num_kv_heads=1 if ctx.smoke else 8, group=4,
                         head_dim=64 if ctx.smoke else 128, block_size=16, dtype=dtype, device=ctx.device,
                         generator=torch.Generator().manual_seed(7))
    splits = ops.resolve_num_splits(None, None, 1, 2, b.key_cache.shape[2], b.max_seq_len,
                                    choose_config(4, b.query.shape[2], 1, not ctx.smoke).block_n, ctx.device)
    err = _max_err(ops.paged_attention(*b.attention_args()), ref_paged_attention(*b.attention_args()), 2)
    status = "PASS" if err <= TOLERANCE[dtype] and splits > 1 else "FAIL"
    ctx.report("correct", f"long decode auto split ({splits} splits)", status, f"max|err| {err:.2e}")


def section_graph(ctx: Context) -> None:
    """Capture decode attention in a CUDA graph, change the metadata in place, replay, compare."""
    if ctx.device.type != "cuda":
        ctx.report("graph", "cuda graph replay", "SKIP", "needs CUDA")
        return
    dtype, max_ctx, batch = torch.bfloat16, 2048, 8
    b = make_paged_batch([1] * batch, [max_ctx - 1] * batch, num_kv_heads=2, group=4, head_dim=128,
                         block_size=16, dtype=dtype, device=ctx.device, generator=torch.Generator().manual_seed(3))
    for label, kwargs in (("no split", {"split_kv": False}), ("4 splits", {"split_kv": True, "num_splits": 4})):
        args = list(b.attention_args())
        out = ops.paged_attention(*args, **kwargs)  # compile outside the capture
        ctx.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.paged_attention(*args, **kwargs)
        # New step, same padded shapes: other lengths, other blocks, other queries.
        g = torch.Generator().manual_seed(11)
        new_lens = torch.randint(1, max_ctx + 1, (batch,), generator=g, dtype=torch.int32)
        b.seq_lens.copy_(new_lens.to(ctx.device))
        b.block_tables.copy_(b.block_tables[torch.randperm(batch, generator=g).to(ctx.device)])
        b.query.normal_()
        graph.replay()
        ctx.sync()
        err = _max_err(out, ref_paged_attention(*b.attention_args()), batch)
        ctx.report("graph", f"replay with new metadata, {label}", "PASS" if err <= TOLERANCE[dtype] else "FAIL",
                   f"max|err| {err:.2e}")


def _shape(ctx: Context) -> tuple[int, int, int]:
    if ctx.smoke:
        return 4, 1, 64
    q_heads, kv_heads, head_dim = (int(x) for x in ctx.args.heads.split(","))
    return q_heads, kv_heads, head_dim


def section_decode(ctx: Context) -> None:
    """Decode attention bandwidth (one new token per sequence) vs the device's peak."""
    q_heads, kv_heads, head_dim = _shape(ctx)
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    elem = torch.finfo(dtype).bits // 8
    batches = [1, 2] if ctx.smoke else [int(x) for x in ctx.args.batches.split(",")]
    contexts = [64, 160] if ctx.smoke else [int(x) for x in ctx.args.contexts.split(",")]
    bs = ctx.args.block_size
    pool_blocks = max(b * -(-c // bs) for b in batches for c in contexts) + 1
    block_bytes = bs * kv_heads * head_dim * elem * 2
    if ctx.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ctx.device)
        pool_blocks = min(pool_blocks, int(free * 0.6) // block_bytes)
    key_cache, value_cache = random_cache_pool(pool_blocks, bs, kv_heads, head_dim, dtype, ctx.device)
    ctx.report("decode", "shape", "INFO", f"q_heads {q_heads}, kv_heads {kv_heads}, head_dim {head_dim}, "
               f"{DTYPE_NAMES[dtype]}, block {bs}, pool {pool_blocks * block_bytes / 2**30:.1f} GiB")
    gen = torch.Generator().manual_seed(0)
    best_long = 0.0
    for batch in batches:
        for context in contexts:
            case = f"batch {batch:>3} ctx {context:>5}"
            if batch * -(-context // bs) > pool_blocks:
                ctx.report("decode", case, "SKIP", "does not fit in memory")
                continue
            if ctx.deadline.left() < 20:
                ctx.report("decode", case, "SKIP", "time budget")
                continue
            tables = scattered_block_tables(batch, context, bs, pool_blocks, gen, ctx.device)
            qsl, seq_lens = varlen_metadata([1] * batch, [context] * batch, ctx.device)
            query = torch.randn(batch, q_heads, head_dim, device=ctx.device).to(dtype)
            out = torch.empty_like(query)
            splits = ops.resolve_num_splits(None, None, 1, batch, kv_heads, context,
                                            choose_config(q_heads // kv_heads, head_dim, 1, not ctx.smoke).block_n,
                                            ctx.device)

            def call() -> None:
                ops.paged_attention(query, key_cache, value_cache, tables, qsl, seq_lens, head_dim ** -0.5,
                                    1, context, out=out)

            seconds = time_call(call, ctx.device, warmup=1 if ctx.smoke else 3, iters=2 if ctx.smoke else 10)
            moved = attention_bytes([1] * batch, [context] * batch, q_heads, kv_heads, head_dim, elem)
            gbps = moved / seconds / 1e9
            share = f"{100 * moved / seconds / ctx.peak:5.1f}% of peak" if ctx.peak else "peak unknown"
            if ctx.peak and context >= 8192:
                best_long = max(best_long, moved / seconds / ctx.peak)
            ctx.report("decode", case, "INFO", f"{seconds * 1e6:9.1f} us  {gbps:8.1f} GB/s  {share}  splits {splits}")
    if ctx.peak and best_long:
        ctx.report("decode", "best at ctx >= 8k vs 70% target", "PASS" if best_long >= 0.7 else "WARN",
                   f"{100 * best_long:.1f}% of peak")
    del key_cache, value_cache


def section_prefill(ctx: Context) -> None:
    """Prefill and chunked-prefill throughput, with torch SDPA on contiguous K/V as a yardstick."""
    q_heads, kv_heads, head_dim = _shape(ctx)
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    cases = ([("2 x 32", [32, 32], [0, 0])] if ctx.smoke else
             [("32 x 512", [512] * 32, [0] * 32), ("8 x 2048", [2048] * 8, [0] * 8),
              ("2 x 8192", [8192] * 2, [0] * 2), ("4 x 2048 chunk on 6144 ctx", [2048] * 4, [6144] * 4)])
    bs = ctx.args.block_size
    for name, q_lens, c_lens in cases:
        if ctx.deadline.left() < 20:
            ctx.report("prefill", name, "SKIP", "time budget")
            continue
        seq_lens_list = [q + c for q, c in zip(q_lens, c_lens)]
        pool_blocks = sum(-(-s // bs) for s in seq_lens_list) + 1
        key_cache, value_cache = random_cache_pool(pool_blocks, bs, kv_heads, head_dim, dtype, ctx.device)
        gen = torch.Generator().manual_seed(1)
        tables = scattered_block_tables(len(q_lens), max(seq_lens_list), bs, pool_blocks, gen, ctx.device)
        qsl, seq_lens = varlen_metadata(q_lens, seq_lens_list, ctx.device)
        query = torch.randn(sum(q_lens), q_heads, head_dim, device=ctx.device).to(dtype)

        def call() -> None:
            ops.paged_attention(query, key_cache, value_cache, tables, qsl, seq_lens, head_dim ** -0.5,
                                max(q_lens), max(seq_lens_list))

        seconds = time_call(call, ctx.device, warmup=1 if ctx.smoke else 2, iters=1 if ctx.smoke else 5)
        flops = attention_flops(q_lens, seq_lens_list, q_heads, head_dim)
        detail = f"{seconds * 1e3:8.2f} ms  {sum(q_lens) / seconds:11.0f} tok/s  {flops / seconds / 1e12:7.1f} TFLOP/s"
        detail += _sdpa_yardstick(ctx, q_lens, c_lens, q_heads, kv_heads, head_dim, dtype, flops)
        ctx.report("prefill", name, "INFO", detail)
        del key_cache, value_cache


def _sdpa_yardstick(ctx: Context, q_lens: list[int], c_lens: list[int], q_heads: int, kv_heads: int,
                    head_dim: int, dtype: torch.dtype, flops: int) -> str:
    if ctx.device.type != "cuda" or len(set(q_lens)) != 1 or any(c_lens):
        return ""
    try:
        import torch.nn.functional as F

        q = torch.randn(len(q_lens), q_heads, q_lens[0], head_dim, device=ctx.device, dtype=dtype)
        k = torch.randn(len(q_lens), kv_heads, q_lens[0], head_dim, device=ctx.device, dtype=dtype)
        seconds = time_call(lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True),
                            ctx.device, warmup=2, iters=5)
        return f"  | torch SDPA (contiguous) {flops / seconds / 1e12:6.1f} TFLOP/s"
    except Exception as exc:  # noqa: BLE001 - a yardstick failure must not hide our figure
        return f"  | SDPA n/a ({type(exc).__name__})"


SECTIONS: dict[str, Callable[[Context], None]] = {
    "correct": section_correct,
    "graph": section_graph,
    "decode": section_decode,
    "prefill": section_prefill,
}
