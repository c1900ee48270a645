"""The step log: one record per engine step, its batch shape and where its wall time went.

Shapes use the simulator's feature names, so a profile can be fitted from a log. Nothing is
timed or kept unless asked, so a long-running server never grows.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from twinserve.core.errors import TwinserveError, short_repr, unreadable_text

# Columns (in process mode, times are the core's and output_s the front end's, which overlaps
# the core's next step; a fitted profile prices that layout):
#   schedule_s   Scheduler.schedule()            update_s   Scheduler.update_from_output()
#   prepare_s    runner inputs and metadata      output_s   detokenize, stop strings, outputs
#   forward_s    forward + logits (CUDA: device time)  sample_s  sampling (CUDA: rest of runner time)
#   step_time_s  schedule() start to outputs ready
#   gap_s        previous step's end to this start while work waited (driver loop, IPC, credit)
#   execute_s    prepare + forward + sample;  overhead_s = step_time_s + gap_s - execute_s
#   extra        other named costs (all-reduce, grammar mask, ...)
FEATURE_COLUMNS = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context", "prefill_attn",
                   "num_decode_seqs", "decode_context")
TIME_COLUMNS = ("schedule_s", "prepare_s", "forward_s", "sample_s", "update_s", "output_s",
                "gap_s", "execute_s", "overhead_s", "step_time_s")
# Speculative decoding: requests that verified drafts, drafts verified, drafts accepted.
SPEC_COLUMNS = ("num_spec_reqs", "num_draft_tokens", "num_accepted_tokens")
COLUMNS = (("step", "start_s") + FEATURE_COLUMNS
           + ("num_seqs", "num_running", "num_waiting", "num_preempted") + TIME_COLUMNS
           + SPEC_COLUMNS
           + ("prefill_chunks", "decode_context_lens", "scheduled", "extra"))
REQUIRED_COLUMNS = FEATURE_COLUMNS + ("execute_s", "step_time_s")


class StepLogError(TwinserveError, ValueError):
    """A step log file cannot be used."""


@dataclass(slots=True)
class StepRecord:
    """One engine step: its shape in cost-model terms and where its wall time went."""

    step: int
    start_s: float = 0.0
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_context_lens: list[int] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    num_preempted: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    output_s: float = 0.0
    step_time_s: float = 0.0
    gap_s: float = 0.0
    # req_id -> tokens, only when asked (replay checks)
    scheduled: dict[str, int] | None = None
    extra: dict[str, float] = field(default_factory=dict)
    num_spec_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        """Σ q over prefill chunks."""
        return sum(q for q, _ in self.prefill_chunks)

    @property
    def num_prefill_seqs(self) -> int:
        """Prefill chunks in the step."""
        return len(self.prefill_chunks)

    @property
    def prefill_context(self) -> int:
        """Σ c (cached tokens before the chunk) over prefill chunks."""
        return sum(c for _, c in self.prefill_chunks)

    @property
    def prefill_attn(self) -> float:
        """Σ q·(c + q/2) over prefill chunks: the causal attention pairs."""
        return sum(q * (c + q * 0.5) for q, c in self.prefill_chunks)

    @property
    def num_decode_seqs(self) -> int:
        """Sequences generating one token."""
        return len(self.decode_context_lens)

    @property
    def decode_context(self) -> int:
        """Σ context length over decode sequences."""
        return sum(self.decode_context_lens)

    @property
    def num_seqs(self) -> int:
        """Sequences scheduled in the step."""
        return len(self.prefill_chunks) + len(self.decode_context_lens)

    @property
    def num_new_tokens(self) -> int:
        """Tokens computed in the step."""
        return self.num_prefill_tokens + len(self.decode_context_lens)

    @property
    def execute_s(self) -> float:
        """prepare + forward + sample."""
        return self.prepare_s + self.forward_s + self.sample_s

    @property
    def overhead_s(self) -> float:
        """CPU work outside the device path, the driver's gap included."""
        return max(self.step_time_s + self.gap_s - self.execute_s, 0.0)

    def features(self) -> tuple[int, int, int, float, int, int]:
        """The six cost-model features, in CostModel.step_time's argument order."""
        return (self.num_prefill_tokens, self.num_prefill_seqs, self.prefill_context,
                self.prefill_attn, self.num_decode_seqs, self.decode_context)

    def row(self) -> dict[str, Any]:
        """The record as a flat mapping of COLUMNS."""
        out: dict[str, Any] = {"step": self.step, "start_s": self.start_s}
        out.update(zip(FEATURE_COLUMNS, self.features()))
        out.update(num_seqs=self.num_seqs, num_running=self.num_running,
                   num_waiting=self.num_waiting, num_preempted=self.num_preempted)
        for name in TIME_COLUMNS + SPEC_COLUMNS:
            out[name] = getattr(self, name)
        out["prefill_chunks"] = [list(p) for p in self.prefill_chunks]
        out["decode_context_lens"] = self.decode_context_lens
        out["scheduled"] = self.scheduled
        out["extra"] = self.extra
        return out


_JSON_COLUMNS = ("prefill_chunks", "decode_context_lens", "scheduled", "extra")


class StepLog:
    """Streams step records to a file (CSV or JSON lines by suffix) and/or keeps them; off when neither."""

    def __init__(self, path: str | Path | None = None, keep: bool = False,
                 record_schedule: bool = False) -> None:
        self.path = Path(path) if path else None
        self.keep = keep
        self.record_schedule = record_schedule
        self.records: list[StepRecord] = []
        self.num_records = 0
        self._file: IO[str] | None = None
        self._csv: Any = None

    @property
    def enabled(self) -> bool:
        """Only then does the engine time its phases."""
        return self.keep or self.path is not None

    def append(self, record: StepRecord) -> None:
        """Add one step: kept if asked, written to the file if there is one."""
        self.num_records += 1
        if self.keep:
            self.records.append(record)
        if self.path is not None:
            self._write(record)

    def _write(self, record: StepRecord) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", newline="")
            if self.path.suffix == ".csv":
                self._csv = csv.writer(self._file)
                self._csv.writerow(COLUMNS)
        row = record.row()
        if self._csv is not None:
            self._csv.writerow([json.dumps(row[c]) if c in _JSON_COLUMNS else row[c]
                                for c in COLUMNS])
        else:
            self._file.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        """Push what was written to disk."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file (records stay in memory if kept)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._csv = None

    def write(self, path: str | Path) -> Path:
        """Write the kept records to a file (CSV or JSON lines by suffix)."""
        out = StepLog(path)
        for r in self.records:
            out.append(r)
        out.close()
        return Path(path)

    def rows(self) -> list[dict[str, Any]]:
        """The kept records as flat rows (what fit_step_log reads)."""
        return [r.row() for r in self.records]


def extra_costs(shape: Any, comm_time_s: float = 0.0) -> dict[str, float]:
    """Step costs beyond the cost model's features, by name (the twin can fit a term per name)."""
    extra: dict[str, float] = {}
    if getattr(shape, "num_constrained", 0):
        # Grammar mask time is inside sample_s; the twin can charge it per constrained sequence.
        extra["grammar_mask_s"] = shape.grammar_mask_time
        extra["num_constrained"] = float(shape.num_constrained)
    if comm_time_s:
        # Tensor parallelism: rank 0's collectives, inside forward_s.
        extra["comm_time_s"] = comm_time_s
    if getattr(shape, "forward_launch_time", 0.0):
        # CUDA: host launch time, beside forward_s's device time (close when launch-bound).
        extra["forward_launch_s"] = shape.forward_launch_time
    return extra


def read_step_log(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a step log file (CSV or JSON lines)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise StepLogError(f"{p}: step log not found") from None
    except (OSError, UnicodeDecodeError) as e:
        line, why = unreadable_text(p, e)
        raise StepLogError(f"{p}{f':{line}' if line else ''}: {why}") from None
    rows: list[dict[str, Any]] = []
    if p.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise StepLogError(f"{p}: the step log has no column {missing[0]!r} "
                               f"(needed: {', '.join(REQUIRED_COLUMNS)})")
        for i, raw in enumerate(reader, 2):
            rows.append(_parse_row(raw, p, i))
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise StepLogError(f"{p}:{i}: not a JSON object ({e.msg})") from None
            if not isinstance(raw, dict):
                raise StepLogError(f"{p}:{i}: a step record is a JSON object, not {type(raw).__name__}")
            missing = [c for c in REQUIRED_COLUMNS if c not in raw]
            if missing:
                raise StepLogError(f"{p}:{i}: the step record has no column {missing[0]!r}")
            rows.append(_parse_row(raw, p, i))
    return rows


def _parse_row(raw: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _JSON_COLUMNS and isinstance(value, str):
            try:
                value = json.loads(value) if value else None
            except json.JSONDecodeError as e:
                raise StepLogError(f"{path}:{line}: column {key!r} is not JSON ({e.msg}): "
                                   f"{short_repr(value, 80)}") from None
        elif key in REQUIRED_COLUMNS or key in TIME_COLUMNS:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise StepLogError(f"{path}:{line}: column {key!r} is not a number: "
                                   f"{value!r}") from None
        out[key] = value
    return out


def iter_feature_rows(rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Rows that computed something (only they carry cost information)."""
    for r in rows:
        if r["num_prefill_tokens"] + r["num_decode_seqs"] > 0:
            yield r
