"""How busy a measurement's CPUs (and their neighbours) were with other work.

A shared core slows steps unpredictably, so calibrate and fidelity record it and warn
(docs/twin-log.md).
"""

from __future__ import annotations

import time
from typing import Any

import psutil

# Other processes' share of our CPUs above which a measurement is noisy.
NOISY_SHARE = 0.1
# Busy share of the other CPUs above which neighbours are called busy.
BUSY_NEIGHBOURS = 0.5


def _tree_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of this process and its live children (an engine-core process, TP workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _busy_steal(cpus: list[int]) -> tuple[float, float]:
    per = psutil.cpu_times(percpu=True)
    busy = steal = 0.0
    for c in cpus:
        if c >= len(per):  # psutil lists online CPUs in order; numbering with gaps is not mapped
            continue
        t = per[c]
        busy += t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        steal += getattr(t, "steal", 0.0)
    return busy, steal


class HostLoad:
    """Started before a measurement; `result()` after it gives the other work on its CPUs."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        try:
            self.cpus = sorted(self._proc.cpu_affinity())
        except (AttributeError, psutil.Error):  # no affinity API on this platform
            self.cpus = list(range(psutil.cpu_count() or 1))
        self._t0 = time.monotonic()
        self._own0 = _tree_cpu_s(self._proc)
        self._busy0 = _busy_steal(self.cpus)
        self.neighbours = [c for c in range(len(psutil.cpu_times(percpu=True))) if c not in self.cpus]
        self._nbusy0 = _busy_steal(self.neighbours)[0]

    def result(self) -> dict[str, Any] | None:
        """{"cpus", "other_share", "steal_share", "other_cpu_s", "neighbour_share"} since start (None: no time).

        neighbour_share: busy share of the CPUs outside ours, None when ours are all there are.
        """
        wall = time.monotonic() - self._t0
        if wall <= 0:
            return None
        busy, steal = _busy_steal(self.cpus)
        capacity = wall * len(self.cpus)
        other = max(busy - self._busy0[0] - (_tree_cpu_s(self._proc) - self._own0), 0.0)
        nb = None
        if self.neighbours:
            nb = round(min(max(_busy_steal(self.neighbours)[0] - self._nbusy0, 0.0)
                           / (wall * len(self.neighbours)), 1.0), 4)
        return {"cpus": self.cpus, "other_share": round(min(other / capacity, 1.0), 4),
                "steal_share": round(max(steal - self._busy0[1], 0.0) / capacity, 4),
                "other_cpu_s": round(other, 3), "neighbour_share": nb}


def warning(load: dict[str, Any] | None, what: str) -> str | None:
    """A one-line warning for noisy CPUs or busy neighbours (which share the memory bus and cache)."""
    if not load:
        return None
    cpus = ",".join(str(c) for c in load["cpus"])
    if load["other_share"] + load["steal_share"] >= NOISY_SHARE:
        return (f"warning: other processes used {load['other_share']:.0%} (steal {load['steal_share']:.0%}) "
                f"of CPU {cpus} during {what}, so its times are noisy: pin it to a quiet core "
                "(taskset -c N) or stop the other work")
    nb = load.get("neighbour_share")  # absent from older logs
    if nb is not None and nb >= BUSY_NEIGHBOURS:
        return (f"warning: the machine's other CPUs were {nb:.0%} busy during {what}; they share its "
                f"memory bus and cache with CPU {cpus}, so its times may be slow and noisy: "
                "stop the other work")
    return None
