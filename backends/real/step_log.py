"""The step log: one record per engine step, its batch shape and where its wall time went.

A record carries the batch shape in the simulator's own feature names (the columns
that backends/sim/fitted.py fits), the shape itself (prefill chunks as (new, cached)
pairs, decode context lengths) and the wall time of each phase of the step:

    schedule_s   Scheduler.schedule()
    prepare_s    model runner: flat inputs, attention metadata
    forward_s    model forward and logits (on CUDA: device time between two events around them)
    sample_s     sampler, appending the sampled tokens (on CUDA: the rest of the step's wall
                 time after prepare_s, so the three still add up to the runner's wall time)
    update_s     Scheduler.update_from_output()
    output_s     engine: incremental detokenization, stop strings, building outputs
    step_time_s  from the start of schedule() to the outputs being ready (the sum, plus glue)
    gap_s        from the previous step's end to this step's start while requests were
                 waiting for it (the driver's own loop: admitting arrivals, dispatching outputs)

execute_s (prepare + forward + sample) is what the device path costs and overhead_s
(step_time_s + gap_s - execute_s) is the engine's CPU work between forwards; a fitted profile
models both, so a study can ask what a faster scheduler would buy. Other costs (an
all-reduce, a grammar mask, a process hop) go into ``extra`` under their own names.

With the engine core in its own process (engine_core_mode='process') the core process times
its own steps and sends each one's shape and phase times with its outputs (core_messages.StepTrace);
the front end writes one record per core step (several when it reads several batches at once).
The cadence the simulator must reproduce is the core's, so there:

    step_time_s  the core's step: from the start of schedule() to its outputs wrapped for the
                 wire (no output processing: the front end does that while the core runs on)
    gap_s        the core's time from the previous step's end to this one's start while it had
                 work: sending the batch, the IPC hop, reading requests, and waiting for the
                 front end's credit (core_proc.MAX_UNCONSUMED_BATCHES) when it falls behind
    output_s     the front end's processing of the batch that carried this step (recorded on
                 the last step of a batch read at once, 0 on the others); it overlaps the core's
                 next step, and adds to step times only through gap_s, when the core waits for it
    start_s      the core's step start on time.monotonic (one clock for both processes)

so step_time_s + gap_s is, as in process, the time between the starts of two busy steps.
A profile fitted on such a log prices that layout (twinserve fidelity refuses to mix them).

Nothing is kept unless asked: with a path every record is streamed to the file as it is
made (CSV or JSON lines by suffix), with keep=True records stay in memory; with neither
the engine does not even time its phases (nor does a core process, told by a message), so a
long-running server never grows.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from twinserve.core.errors import TwinserveError

# The batch-shape columns, named as the simulator's StepFeatures names them.
FEATURE_COLUMNS = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context", "prefill_attn",
                   "num_decode_seqs", "decode_context")
TIME_COLUMNS = ("schedule_s", "prepare_s", "forward_s", "sample_s", "update_s", "output_s",
                "gap_s", "execute_s", "overhead_s", "step_time_s")
# Speculative decoding: requests that verified drafts, draft tokens verified, drafts accepted.
SPEC_COLUMNS = ("num_spec_reqs", "num_draft_tokens", "num_accepted_tokens")
COLUMNS = (("step", "start_s") + FEATURE_COLUMNS
           + ("num_seqs", "num_running", "num_waiting", "num_preempted") + TIME_COLUMNS
           + SPEC_COLUMNS
           + ("prefill_chunks", "decode_context_lens", "scheduled", "extra"))
# What a fit needs from a log.
REQUIRED_COLUMNS = FEATURE_COLUMNS + ("execute_s", "step_time_s")


class StepLogError(TwinserveError, ValueError):
    """A step log file cannot be used; the message names the file and the column or line."""


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
    # req_id -> tokens scheduled this step (kept only when the engine is asked to).
    scheduled: dict[str, int] | None = None
    extra: dict[str, float] = field(default_factory=dict)
    num_spec_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    # -- the simulator's features ------------------------------------------------
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
        """Device path: inputs, forward, sampling."""
        return self.prepare_s + self.forward_s + self.sample_s

    @property
    def overhead_s(self) -> float:
        """The engine's CPU work outside the device path (the driver's gap included)."""
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
    """Streams step records to a file and/or keeps them in memory; disabled when neither."""

    def __init__(self, path: str | Path | None = None, keep: bool = False,
                 record_schedule: bool = False) -> None:
        self.path = Path(path) if path else None
        self.keep = keep
        # Keep each step's {req_id: tokens} (for replay checks); costs a dict per step.
        self.record_schedule = record_schedule
        self.records: list[StepRecord] = []
        self.num_records = 0
        self._file: IO[str] | None = None
        self._csv: Any = None

    @property
    def enabled(self) -> bool:
        """True when records go anywhere (only then does the engine time its phases)."""
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
        # Structured output: grammar bitmask fill + apply + matcher advance (inside sample_s), and
        # how many sequences were constrained; the twin can charge grammar_mask_s per sequence.
        extra["grammar_mask_s"] = shape.grammar_mask_time
        extra["num_constrained"] = float(shape.num_constrained)
    if comm_time_s:
        # Tensor parallelism: rank 0's seconds in collectives, inside forward_s (see README).
        extra["comm_time_s"] = comm_time_s
    if getattr(shape, "forward_launch_time", 0.0):
        # CUDA: host time to launch the forward; forward_s is its device time (launch-bound
        # steps have the two close).
        extra["forward_launch_s"] = shape.forward_launch_time
    return extra


def read_step_log(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a step log file (CSV or JSON lines); names the file and the missing column."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise StepLogError(f"{p}: step log not found") from None
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
            missing = [c for c in REQUIRED_COLUMNS if c not in raw]
            if missing:
                raise StepLogError(f"{p}:{i}: the step record has no column {missing[0]!r}")
            rows.append(_parse_row(raw, p, i))
    return rows


def _parse_row(raw: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _JSON_COLUMNS and isinstance(value, str):
            value = json.loads(value) if value else None
        elif key in REQUIRED_COLUMNS or key in TIME_COLUMNS:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise StepLogError(f"{path}:{line}: column {key!r} is not a number: "
                                   f"{value!r}") from None
        out[key] = value
    return out


def iter_feature_rows(rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Rows that computed something (steps with no tokens carry no cost information)."""
    for r in rows:
        if r["num_prefill_tokens"] + r["num_decode_seqs"] > 0:
            yield r
