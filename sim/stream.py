"""Records that stream to disk and aggregate online, for runs too long to keep in memory.

Each finished request is one CSV line plus a few 8-byte numbers from which exact percentiles
are taken at the end: a million requests cost ~40 MB, not gigabytes of token timestamps.
"""

from __future__ import annotations

import csv
from array import array
from pathlib import Path
from typing import Any, Callable

import numpy as np

from twinserve.sim.world import RequestRecord

COLUMNS = ("request_id", "replica", "conversation", "turn", "arrival_s", "prompt_tokens",
           "output_tokens", "queue_s", "ttft_s", "tpot_s", "e2e_s", "prefix_hit_tokens",
           "preemptions", "finish_reason")


class RecordStream:
    """A RequestRecord sink: CSV on disk plus online arrays of TTFT, TPOT, E2E and queueing."""

    def __init__(self, path: str | Path | None, progress: Callable[[int], Any] | None = None,
                 progress_every: int = 1000) -> None:
        self._file = open(path, "w", newline="", buffering=1 << 20) if path else None
        self._csv = csv.writer(self._file) if self._file else None
        if self._csv:
            self._csv.writerow(COLUMNS)
        self.ttft = array("d")
        self.tpot = array("d")
        self.e2e = array("d")
        self.queue = array("d")
        self.num_records = 0
        self.num_refused = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.prefix_hit_tokens = 0
        self.last_finish = 0.0
        self._progress = progress
        self._every = progress_every

    def __call__(self, r: RequestRecord) -> None:
        """Take one finished (or refused) request."""
        self.num_records += 1
        nan = float("nan")
        queue = ttft = tpot = e2e = nan
        if r.first_scheduled_time is not None:
            queue = r.first_scheduled_time - r.arrival_time
        if r.finish_time is not None and r.first_token_time is not None:
            n = r.num_output_tokens
            ttft = r.first_token_time - r.arrival_time
            e2e = r.finish_time - r.arrival_time
            if n > 1:
                tpot = (r.finish_time - r.first_token_time) / (n - 1)
                self.tpot.append(tpot)
            self.ttft.append(ttft)
            self.e2e.append(e2e)
            self.queue.append(queue)
            self.output_tokens += n
            self.prompt_tokens += r.num_prompt_tokens
            self.prefix_hit_tokens += r.prefix_hit_tokens
            if r.finish_time > self.last_finish:
                self.last_finish = r.finish_time
        else:
            self.num_refused += 1
        if self._csv:
            self._csv.writerow((r.request_id, r.replica, r.conversation, r.turn,
                                f"{r.arrival_time:.6f}", r.num_prompt_tokens,
                                r.num_output_tokens, f"{queue:.6g}", f"{ttft:.6g}",
                                f"{tpot:.6g}", f"{e2e:.6g}", r.prefix_hit_tokens,
                                r.num_preemptions, r.finish_reason))
        if self._progress is not None and self.num_records % self._every == 0:
            self._progress(self._every)

    def close(self) -> None:
        """Flush and close the CSV file."""
        if self._file:
            self._file.close()
            self._file = None

    def summary(self) -> dict[str, float]:
        """Completed count, throughputs and latency percentiles over everything streamed."""
        out: dict[str, float] = {"records": self.num_records,
                                 "completed": len(self.ttft), "refused": self.num_refused}
        horizon = self.last_finish or float("nan")
        out["request_throughput"] = len(self.ttft) / horizon
        out["output_throughput"] = self.output_tokens / horizon
        out["prefix_hit_rate_of_prompts"] = (self.prefix_hit_tokens / self.prompt_tokens
                                             if self.prompt_tokens else 0.0)
        for name, arr in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e),
                          ("queue", self.queue)):
            v = np.frombuffer(arr, dtype=np.float64) if len(arr) else np.array([np.nan])
            out[f"mean_{name}_s"] = float(np.nanmean(v))
            for p in (50, 90, 99):
                out[f"p{p}_{name}_s"] = float(np.nanpercentile(v, p))
        return out
