"""KV cache groups: a model's layers split by attention type into equal-sized groups.

Full-attention layers and each sliding window form a type. Every group holds the same number of
layers (the gcd of the types' counts), so one page of the shared pool (block_size tokens of one
group's layers) has one size for all groups, and the j-th layer of every group can share one
physical KV tensor. The design follows vLLM v1's hybrid KV cache allocator (docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Sequence

from twinserve.core.errors import InvalidConfigError


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers that share one block table: window None (full attention) or W tokens."""

    window: int | None
    layers: tuple[int, ...]


def kv_cache_groups(layer_windows: Sequence[int | None]) -> list[KVCacheGroup]:
    """Groups of equal size, full attention first, then windows ascending; one group if uniform."""
    if not layer_windows:
        raise InvalidConfigError("layer_windows", list(layer_windows), "at least one layer")
    by_type: dict[int | None, list[int]] = {}
    for i, w in enumerate(layer_windows):
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise InvalidConfigError("layer_windows", w, "None (full attention) or a window >= 1")
        by_type.setdefault(w, []).append(i)
    size = 0
    for layers in by_type.values():
        size = gcd(size, len(layers))
    order = sorted(by_type, key=lambda w: -1 if w is None else w)
    return [KVCacheGroup(w, tuple(by_type[w][k:k + size]))
            for w in order for k in range(0, len(by_type[w]), size)]


def group_windows(layer_windows: Sequence[int | None]) -> tuple[int, ...]:
    """Each group's window, 0 for full attention (SchedulerConfig.kv_groups)."""
    return tuple(g.window or 0 for g in kv_cache_groups(layer_windows))


def max_pages(num_tokens: int, block_size: int, windows: Sequence[int | None],
              max_step_tokens: int | None = None) -> int:
    """The most pages a request of num_tokens holds at once (KVCacheManager.can_fit's count).

    A full group: every block. A sliding group, alone or not: at most its window and one step's
    blocks, (W - 1 + step) // block_size + 2, since a step frees what the window left before it
    allocates (KVCacheManager.allocate_slots). Without a step bound, every block.
    """
    n = -(-num_tokens // block_size)
    return sum(n if w is None or max_step_tokens is None else min(n, (w - 1 + max_step_tokens) // block_size + 2)
               for w in windows)


def layer_slots(groups: Sequence[KVCacheGroup]) -> dict[int, tuple[int, int]]:
    """layer -> (its group, its index j in the group): layer j of every group shares tensor j."""
    return {layer: (g, j) for g, group in enumerate(groups) for j, layer in enumerate(group.layers)}
