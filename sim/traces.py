"""Trace loaders: Azure LLM inference CSVs and plain prefill/decode-token CSVs, read lazily.

Row errors name file and line; over-long requests follow an explicit policy (clip, drop, fail)
and are counted, never silently.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from twinserve.core.errors import unreadable_text
from twinserve.sim.errors import TraceError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TOKENS_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
OVERLONG_POLICIES = ("clip", "drop", "fail")
# Units of a tokens trace's arrived_at column (workload.trace_time_unit), in seconds.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(slots=True)
class TraceRow:
    """One request from a trace: arrival offset in seconds (None if absent) and lengths."""

    arrival_time: float | None
    num_prompt_tokens: int
    num_output_tokens: int
    line: int
    request_id: str | None = None


@dataclass(slots=True)
class LengthStats:
    """What the over-long policy did, for the report."""

    policy: str = "clip"
    max_model_len: int = 0
    seen: int = 0
    clipped: int = 0
    dropped: int = 0
    followups: int = 0           # follow-up turns made
    followups_dropped: int = 0   # follow-up turns that outgrew max_model_len
    short: int = 0               # first-turn requests a trace could not give (allow_short_trace)
    notes: list[str] = field(default_factory=list)


def _int_cell(value: str | None, file: str, line: int, column: str, minimum: int) -> int:
    if value is None or value.strip() == "":
        raise TraceError(file, line, column, "missing value")
    try:
        v = int(value)
    except ValueError:
        try:
            f = float(value)
        except ValueError:
            raise TraceError(file, line, column, f"{value!r} is not an integer") from None
        if not f.is_integer():
            raise TraceError(file, line, column, f"{value!r} is not an integer") from None
        v = int(f)
    if v < minimum:
        raise TraceError(file, line, column, f"{v} is below the minimum {minimum}")
    return v


def _azure_seconds(value: str | None, file: str, line: int,
                   days: dict[str, int] | None = None) -> tuple[int, float]:
    """(day ordinal, seconds into the day); days caches ordinals by date text (one per trace)."""
    try:
        assert value is not None
        day, clock = value.strip().split(" ")
        ordinal = days.get(day) if days is not None else None
        if ordinal is None:
            ordinal = _dt.date.fromisoformat(day).toordinal()
            if days is not None:
                days[day] = ordinal
        h, m, s = clock.split(":")
        return ordinal, int(h) * 3600 + int(m) * 60 + float(s)
    except (AssertionError, ValueError):
        raise TraceError(file, line, "TIMESTAMP",
                         f"{value!r} is not a time like '2023-11-16 18:17:03.9799600'") from None


def _detect(header: list[str], file: str) -> str:
    cols = set(header)
    if set(AZURE_COLUMNS) <= cols:
        return "azure"
    if set(TOKENS_COLUMNS) <= cols:
        return "tokens"
    raise TraceError(file, 1, None,
                     f"unknown trace header {header}: expected columns {', '.join(AZURE_COLUMNS)} "
                     f"(Azure) or {', '.join(TOKENS_COLUMNS)}[, arrived_at]")


def read_trace(path: str | Path, limit: int | None = None, time_unit: str = "s") -> Iterator[TraceRow]:
    """Yield rows of an Azure or tokens CSV in file order; arrival offsets start at 0 and never decrease.

    time_unit: the unit of a tokens trace's arrived_at column ('s', 'ms', 'us'); offsets are seconds.
    """
    p = Path(path)
    file = str(p)
    try:
        fh = p.open(newline="", encoding="utf-8-sig")  # -sig: a spreadsheet's byte order mark is no header
    except FileNotFoundError:
        raise TraceError(file, 0, None, "trace file not found") from None
    except OSError as e:
        raise TraceError(file, 0, None, unreadable_text(file, e)[1]) from None
    with fh:
        # One generator, the rows' loop inside the try (no per-row cost): a text reader fails on bytes that
        # are not UTF-8 a chunk at a time, so the line is found again from the bytes.
        try:
            reader = csv.reader(fh)
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise TraceError(file, 1, None, "the trace is empty") from None
            idx: dict[str, int] = {}
            for i, name in enumerate(header):
                if name and name in idx:
                    raise TraceError(file, 1, name, f"the column is named twice (columns {idx[name] + 1} "
                                     f"and {i + 1}); name each column once")
                idx[name] = i
            kind = _detect(header, file)
            i_id = idx.get("request_id")
            seen_ids: dict[str, int] = {}
            origin: tuple[int, float] | None = None
            first_stamp: float | None = None
            previous = 0.0
            count = 0
            width = len(header)
            days: dict[str, int] = {}
            if kind == "azure":
                i_time, i_prompt, i_output = (idx[c] for c in AZURE_COLUMNS)
                if time_unit != "s":
                    raise TraceError(file, 1, "TIMESTAMP", f"workload.trace_time_unit = {time_unit!r} is for an "
                                     "arrived_at column; an Azure trace's TIMESTAMPs are clock times: leave it 's'")
            seconds = TIME_UNITS[time_unit]
            for row in reader:
                line = reader.line_num
                # A row of blank cells only: their concatenation is blank too.
                if not row or not "".join(row).strip():
                    continue
                if len(row) != width:
                    raise TraceError(file, line, None,
                                     f"expected {width} fields, found {len(row)}")
                if kind == "azure":
                    day, secs = _azure_seconds(row[i_time], file, line, days)
                    if origin is None:
                        origin = (day, secs)
                    arrival: float | None = (day - origin[0]) * 86400.0 + (secs - origin[1])
                    prompt = _int_cell(row[i_prompt], file, line, "ContextTokens", 1)
                    output = _int_cell(row[i_output], file, line, "GeneratedTokens", 1)
                else:
                    prompt = _int_cell(row[idx["num_prefill_tokens"]], file, line,
                                       "num_prefill_tokens", 1)
                    output = _int_cell(row[idx["num_decode_tokens"]], file, line,
                                       "num_decode_tokens", 1)
                    arrival = None
                    if "arrived_at" in idx:
                        cell = row[idx["arrived_at"]]
                        try:
                            stamp = float(cell)
                        except ValueError:
                            raise TraceError(file, line, "arrived_at",
                                             f"{cell!r} is not a number (of {time_unit})") from None
                        if not math.isfinite(stamp) or stamp < 0:
                            raise TraceError(file, line, "arrived_at", f"{cell!r} must be a finite number >= 0")
                        if first_stamp is None:
                            first_stamp = stamp
                        # Offsets from the first row, as for Azure timestamps.
                        arrival = (stamp - first_stamp) * seconds
                if arrival is not None:
                    if arrival < previous:
                        column = "TIMESTAMP" if kind == "azure" else "arrived_at"
                        raise TraceError(file, line, column, f"arrives {previous - arrival:g} s before the row above; "
                                         "sort the trace by arrival time")
                    previous = arrival
                rid = None
                if i_id is not None:
                    rid = row[i_id].strip()
                    if not rid:
                        raise TraceError(file, line, "request_id", "missing value")
                    if rid in seen_ids:
                        raise TraceError(file, line, "request_id", f"{rid!r} is already the id of "
                                         f"line {seen_ids[rid]}; request ids must be unique")
                    seen_ids[rid] = line
                yield TraceRow(arrival, prompt, output, line, rid)
                count += 1
                if limit is not None and count >= limit:
                    return
            if count == 0:
                raise TraceError(file, 1, None, "the trace has a header but no requests (workload.trace)")
        except UnicodeDecodeError as e:
            line, why = unreadable_text(file, e)
            raise TraceError(file, line or 0, None, why) from None


def fit_lengths(prompt: int, output: int, max_model_len: int, policy: str, stats: LengthStats,
                file: str = "<workload>", line: int = 0) -> tuple[int, int] | None:
    """Apply the over-long policy; (prompt, output), or None when the request is dropped."""
    stats.seen += 1
    if prompt + output <= max_model_len:
        return prompt, output
    if policy == "drop":
        stats.dropped += 1
        return None
    if policy == "fail":
        raise TraceError(file, line, None,
                         f"request needs {prompt}+{output} tokens but max_model_len is "
                         f"{max_model_len}; set workload.on_overlong to 'clip' or 'drop'")
    stats.clipped += 1
    prompt = min(prompt, max_model_len - 1)
    return prompt, min(output, max_model_len - prompt)
