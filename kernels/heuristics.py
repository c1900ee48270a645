"""Launch-configuration choices for the attention kernels (pure Python, no Triton import)."""

from __future__ import annotations

from dataclasses import dataclass

# Stand-in SM count off-GPU, where "parallelism" only decides which path tests exercise.
CPU_NOMINAL_SMS = 4
# A split should still stream a few KV tiles, or its partial write costs more than it saves.
MIN_TILES_PER_SPLIT = 4
MAX_SPLITS = 64


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """Tile sizes and launch knobs of one paged-attention launch."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"{name}={size}: tl.dot tiles must be powers of two >= 16")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_config(group: int, head_dim: int, max_query_len: int, on_gpu: bool) -> AttentionConfig:
    """Pick BLOCK_M (packed query rows) and BLOCK_N (keys per tile) from host-side shapes."""
    rows = max(16, _next_pow2(group))
    if max_query_len > 1:
        cap = 128 if on_gpu and head_dim <= 64 else 64
        rows = max(rows, min(cap, _next_pow2(max_query_len * group)))
    if rows < group:
        raise ValueError(f"GQA group {group} does not fit in {rows} rows")
    block_n = 64 if on_gpu else 32
    num_warps = 8 if on_gpu and rows * head_dim >= 128 * 64 else 4
    return AttentionConfig(block_m=rows, block_n=block_n, num_warps=num_warps, num_stages=2)


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    block_n: int,
    num_sms: int,
) -> int:
    """Splits per sequence for split-KV decode: only when programs < SMs, aiming at ~2 per SM."""
    programs = max(1, num_seqs * num_kv_heads)
    if programs >= num_sms:
        return 1
    wanted = -(-2 * num_sms // programs)
    max_useful = max(1, -(-max_seq_len // (block_n * MIN_TILES_PER_SPLIT)))
    splits = min(wanted, max_useful, MAX_SPLITS)
    # Powers of two keep the number of compiled kernel variants small.
    return 1 if splits <= 1 else 1 << (splits.bit_length() - 1)
