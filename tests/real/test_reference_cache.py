"""The suite's reference-model caches stay bounded (issue 53 item 16: they held every module's models)."""

from __future__ import annotations

from .arch_helpers import HF_KEEP, remember


def test_remember_keeps_the_newest_entries_and_a_reused_one() -> None:
    cache: dict = {}
    for k in range(HF_KEEP):
        remember(cache, k, str(k))
    remember(cache, 0, "0")  # asked again: now the newest
    remember(cache, "new", "n")
    assert len(cache) == HF_KEEP and 1 not in cache and list(cache)[-2:] == [0, "new"]
    for k in range(10 * HF_KEEP):
        assert remember(cache, ("f", k), k) == k
    assert list(cache) == [("f", k) for k in range(9 * HF_KEEP, 10 * HF_KEEP)]
