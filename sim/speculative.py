"""The study's [speculative] table: drafts per step and the acceptance model the simulator draws from.

    [speculative]
    method = "ngram"                 # "" (off), "ngram" or "draft_model"
    draft_model = ""                 # method draft_model: the draft, named as [engine] model is (a
                                     # catalog name, a config.json or HF folder, a [model] table's name),
                                     # or "mtp": the target's own multi-token-prediction layer
    num_speculative_tokens = 4
    acceptance_rates = [0.8, 0.6, 0.5, 0.4]   # P(position i accepted | all before it were);
                                              # one rate per position: at least k of them
    # or: acceptance_from = "run/steps.csv"   # a real run's step log (draft/accepted columns)
    acceptance_spread = 0.0          # per-request lognormal sigma on the rates
    disable_by_batch_size = 0        # no drafts while this many requests run (0: never off)
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from twinserve.core.knobs import knob, same_knob
from twinserve.core.spec_decode import MAX_SPECULATIVE_TOKENS, SPEC_METHODS, SpeculativeConfig

from twinserve.sim.errors import ConfigError

SIM_SPEC_METHODS = ("", *SPEC_METHODS)  # "" = off


@dataclass(slots=True)
class SpeculativeSection:
    """Speculative decoding in the simulator: the same scheduler fields plus an acceptance model."""

    method: str = knob("", help="how drafts are proposed", choices=SPEC_METHODS, special={"": "off"})
    # Not "model": a bare `model` in sweeps and replica overrides means [engine] model.
    draft_model: str = knob("", help="method draft_model: the draft, named as [engine] model is, or \"mtp\" "
                                     "(the target's own multi-token-prediction layer)")
    num_speculative_tokens: int = same_knob(SpeculativeConfig, "num_speculative_tokens")
    acceptance_rates: list = knob(default_factory=list,
                                  help="P(position i accepted | all before it were); one rate per "
                                       "drafted position, at least num_speculative_tokens (more are unused)",
                                  flag=False)
    acceptance_from: str = knob("", help="a real run's step log to take the acceptance rates from")
    acceptance_spread: float = knob(0.0, help="per-request lognormal sigma on the acceptance rates",
                                    range=(0.0, None))
    disable_by_batch_size: int = same_knob(SpeculativeConfig, "disable_by_batch_size")

    @property
    def enabled(self) -> bool:
        """True when the study speculates."""
        return bool(self.method)

    def to_core(self) -> SpeculativeConfig:
        """The scheduler's SpeculativeConfig."""
        return SpeculativeConfig(method=self.method, num_speculative_tokens=self.num_speculative_tokens,
                                 model=self.draft_model or None, disable_by_batch_size=self.disable_by_batch_size)

    def describe(self) -> str:
        """One line for the run summary: whether speculation was on, and with what."""
        if not self.enabled:
            return "speculative decoding: off"
        draft = f" (draft {self.draft_model})" if self.method == "draft_model" else ""
        source = (f"acceptance rates {[float(r) for r in self.acceptance_rates][:self.num_speculative_tokens]}"
                  if self.acceptance_rates else f"acceptance from {self.acceptance_from}")
        off = f", off at {self.disable_by_batch_size} running" if self.disable_by_batch_size else ""
        return (f"speculative decoding: {self.method}{draft}, k = {self.num_speculative_tokens}, {source}"
                f"{off}")

    def rates(self, source: str | None = None) -> list[float]:
        """The per-position acceptance rates, from the table or from a step log."""
        if self.acceptance_rates:
            short = _too_few_rates(self.acceptance_rates, self.num_speculative_tokens)
            if short:  # a sweep over k, or rates set in code: checked again where they are used
                raise ConfigError("speculative.acceptance_rates", short)
            return [float(r) for r in self.acceptance_rates]
        path = Path(self.acceptance_from)
        if not path.is_absolute() and source and not path.exists():
            path = Path(source).parent / path
        return rates_from_step_log(path, self.num_speculative_tokens)


def coerce_speculative(name: str, value: Any, bad: Callable[[str], ConfigError]) -> Any:
    """Check one [speculative] field (the scalar ones are checked by their knob declarations)."""
    if name == "acceptance_rates":
        if not isinstance(value, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0 for v in value):
            raise bad(f"{value!r} must be a list of probabilities in [0, 1], e.g. [0.8, 0.6, 0.5, 0.4]")
        if len(value) > MAX_SPECULATIVE_TOKENS:
            raise bad(f"{len(value)} rates: at most {MAX_SPECULATIVE_TOKENS}")
        return [float(v) for v in value]
    return value


def check_speculative(spec: SpeculativeSection, error: Callable[[str, str], ConfigError]) -> None:
    """Cross-field checks: a speculating study needs exactly one acceptance model."""
    if not spec.enabled:
        return
    if spec.method == "draft_model" and not spec.draft_model:
        raise error("draft_model", "method 'draft_model' needs the draft: draft_model = a catalog name, a "
                    "config.json or HF folder, or a [model] table's name")
    if bool(spec.acceptance_rates) == bool(spec.acceptance_from):
        raise error("acceptance_rates", "give acceptance_rates = [...] or acceptance_from = "
                    "\"steps.csv\" (one of them) when method is set")
    # More rates than k are fine (a sweep over k keeps one list): positions past k never run.
    short = _too_few_rates(spec.acceptance_rates, spec.num_speculative_tokens)
    if short:
        raise error("acceptance_rates", short)


def _too_few_rates(rates: list, k: int) -> str:
    """Why a rates list shorter than k is refused ("" when it covers k, or when rates come from a log)."""
    if not rates or len(rates) >= k:
        return ""
    return (f"{len(rates)} rate(s) for num_speculative_tokens = {k}: give one rate per drafted position (at "
            f"least {k}; e.g. {[float(rates[-1])] * k} for the same rate at every position)")


def rates_from_step_log(path: Path, k: int) -> list[float]:
    """Per-position rates from a real run's step log (CSV or JSONL with draft/accepted columns).

    The log has per-step totals only: one rate a is solved so E = a (1 - a^k) / (1 - a) matches
    the run (the i.i.d. model of Leviathan et al. 2023).
    """
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError("speculative.acceptance_from", f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError("speculative.acceptance_from", "not a text file: give the CSV or JSON-lines "
                          "step log of a run", str(path)) from None
    drafts = accepted = spec_reqs = 0
    for line, r in _step_log_rows(path, text):
        nd = _count(r, "num_draft_tokens", path, line)
        if nd:
            drafts += nd
            accepted += _count(r, "num_accepted_tokens", path, line)
            spec_reqs += _count(r, "num_spec_reqs", path, line)
    if not drafts or not spec_reqs:
        raise ConfigError("speculative.acceptance_from", f"{path} records no verified drafts "
                          "(columns num_draft_tokens, num_accepted_tokens, num_spec_reqs)")
    mean_k = drafts / spec_reqs
    target = accepted / spec_reqs
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        e = sum(a ** (i + 1) for i in range(max(1, round(mean_k))))
        lo, hi = (a, hi) if e < target else (lo, a)
    return [round((lo + hi) / 2, 6)] * k


def _bad_log(path: Path, line: int, message: str) -> ConfigError:
    return ConfigError("speculative.acceptance_from", message, str(path), line)


def _step_log_rows(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line, record) of a CSV or JSON-lines step log; a record that is not an object is refused."""
    if path.suffix == ".jsonl":
        for line, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                r = json.loads(raw)
            except json.JSONDecodeError as e:
                raise _bad_log(path, line, f"not a JSON object ({e.msg}); is the step log cut short?") from None
            if not isinstance(r, dict):
                raise _bad_log(path, line, f"a step record is a JSON object, not {type(r).__name__}")
            yield line, r
    else:
        reader = csv.DictReader(text.splitlines())
        for r in reader:
            yield reader.line_num, r


def _count(r: dict, column: str, path: Path, line: int) -> int:
    """A step's count column: an integer >= 0 (missing or blank is 0)."""
    value = r.get(column)
    if value is None or value == "":
        return 0
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError):
        f = math.nan
    if not (math.isfinite(f) and f >= 0 and f.is_integer()):
        raise _bad_log(path, line, f"column {column!r} is {value!r}: a step's count, an integer >= 0")
    return int(f)
