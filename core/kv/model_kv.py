"""The model's KV cache groups on the scheduler's config: one rule for the engine and the simulator.

The config's own kv_groups win, else its sliding_window (one group), else the model's groups. The
engine never takes either from a user (backends/real/config.FROM_ENGINE), so it runs the model's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from twinserve.core.kv.groups import group_windows
from twinserve.core.sched.config import SchedulerConfig


def model_group_windows(layer_windows: Sequence[int | None] | None) -> tuple[int, ...]:
    """Each KV group's window (0 = full attention) for a model's per-layer windows (None: all full)."""
    return group_windows(list(layer_windows) if layer_windows else [None])


def kv_groups_for(sched: Any, model_groups: Sequence[int]) -> tuple[int, ...]:
    """The groups the scheduler runs: sched.kv_groups if set, else its sliding_window, else the model's."""
    if sched.kv_groups:
        return tuple(sched.kv_groups)
    if sched.sliding_window:
        return (sched.sliding_window,)
    return tuple(model_groups)


def with_model_kv(sched: SchedulerConfig, model_groups: Sequence[int]) -> SchedulerConfig:
    """sched with the KV groups it runs (kv_groups_for): several groups, or one group's window."""
    groups = kv_groups_for(sched, model_groups)
    if len(groups) > 1:
        return dataclasses.replace(sched, kv_groups=groups, sliding_window=0)
    if groups[0] and not sched.sliding_window:
        return dataclasses.replace(sched, sliding_window=groups[0])
    return sched
