"""Per-step records of what ran and how long it took, for fitting the simulator's cost model."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(slots=True)
class StepRecord:
    """One engine step: its shape in cost-model terms and its measured duration."""

    step: int
    num_new_tokens: int
    num_prefills: int
    num_decodes: int
    # (q new tokens, c cached context) per prefill chunk.
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    # Context length per decode sequence.
    decode_context_lens: list[int] = field(default_factory=list)
    step_time: float = 0.0

    @property
    def prefill_attention_work(self) -> float:
        """sum over prefill chunks of q * (c + q / 2): the quadratic prefill attention term."""
        return sum(q * (c + q / 2) for q, c in self.prefill_chunks)

    @property
    def decode_context_sum(self) -> int:
        """sum of decode context lengths: the decode attention term."""
        return sum(self.decode_context_lens)


class StepLog:
    """Keeps every step record in memory and writes them as CSV or JSON lines when asked."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.records: list[StepRecord] = []
        self.path = Path(path) if path else None

    def append(self, record: StepRecord) -> None:
        """Add one step."""
        self.records.append(record)

    def write(self, path: str | Path | None = None) -> Path | None:
        """Write all records; .csv gets flat columns, anything else JSON lines."""
        path = Path(path) if path else self.path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".csv":
            with path.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "num_new_tokens", "num_prefills", "num_decodes",
                            "prefill_tokens", "prefill_attention_work", "decode_context_sum",
                            "prefill_chunks", "decode_context_lens", "step_time"])
                for r in self.records:
                    w.writerow([r.step, r.num_new_tokens, r.num_prefills, r.num_decodes,
                                sum(q for q, _ in r.prefill_chunks), r.prefill_attention_work,
                                r.decode_context_sum, json.dumps(r.prefill_chunks),
                                json.dumps(r.decode_context_lens), f"{r.step_time:.6f}"])
        else:
            with path.open("w") as f:
                for r in self.records:
                    f.write(json.dumps(asdict(r)) + "\n")
        return path
