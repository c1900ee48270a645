"""How each measured row was run and counted, and the closed loop that runs and counts the same.

Most rows of aiconfigurator-core's silicon_sample.csv are SemiAnalysis InferenceX (InferenceMAX)
runs (`source_file=2026-04-06.csv`, `2026-03-25.csv`, `db-dump/...`: config_id and
workflow_run_id are InferenceX's). Its benchmark is vLLM's `benchmark_serving.py` (the
kimbochen/bench_serving fork): `--dataset-name random --random-range-ratio 0.8 --num-prompts
$((CONC * 10)) --max-concurrency $CONC --request-rate inf --ignore-eos` (InferenceX's
benchmarks/*.sh). That fork draws each prompt and output length as
`np.random.randint(int(L * ratio), L + 1)`: uniform on [0.8 L, L], not vLLM's later [L(1-r),
L(1+r)]. Its metrics are the means over every completed request, the first (cold) wave
included; one single-prompt test request before the run is not counted. aiconfigurator's own
cohort script (ai-dynamo/aisimulate) takes `silicon_ttft_ms = metrics["mean_ttft"] * 1000` and
`silicon_tpot_ms = metrics["mean_tpot"] * 1000` from it, and replays the same workload
(`request_count = concurrency * 10`, `random_range_ratio = 0.8`).

The rest are aiconfigurator's gap-analysis CSVs (`source_file=/Users/.../aic-auto-gap-analysis/`):
their harness is not published with the package; they run the same counts here at exact ISL/OSL,
which the development rows (Qwen3-32B's are nearly all of them) chose: with SGLang's lock step,
the 57 development gap rows' median |TPOT error| 17.4% -> 11.7% and |TTFT error| 36.9% -> 22.3%
against lengths on [0.8 L, L] (docs/validate-accuracy.md; no held-out row was looked at
to choose). One gap-analysis file is InferenceX's own runs reprinted (INFERENCEX_GAP_FILES): its rows
are InferenceX rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

INFERENCEX = "inferencex"
AIC_GAP = "aic_gap"

# `simulate validate --window`; benchmark-full runs all 10 N requests of every row, benchmark estimates
# rows of many clients from their first waves (sim/validate_estimate.py).
WINDOWS = ("benchmark", "benchmark-full", "steady")
# Chosen on the development rows (docs/validate-accuracy.md): the benchmark's own count.
DEFAULT_WINDOW = "benchmark"

_INFERENCEX_PREFIXES = ("source_file=2026-", "db-dump/")
# Gap-analysis files whose every row is an InferenceX run, printed to 0.01 ms: each of kimi-k2.5-gap-analysis.csv's
# 47 rows (vLLM aggregated, B200 / H200) has the measured TTFT and TPOT, rounded, of an InferenceX dump record at its
# backend, system, precision, ISL, OSL and clients (the 2026-03-24 B200 INT4 v0.15.1 run, the 2026-03-27 H200 INT4
# v0.16.0 and B200 FP4 v0.17.0 runs; its "tp4 ep4" rows are config 635's, written there TP 4 x attention DP 4, EP 16):
# InferenceX's benchmark and launch scripts, not aiconfigurator's harness (docs/validate-accuracy.md, kimiaudit).
INFERENCEX_GAP_FILES = ("kimi-k2.5-gap-analysis.csv",)


@dataclass(slots=True, frozen=True)
class RunDesign:
    """A closed loop's request count, what its means count, and how lengths are drawn."""

    name: str
    requests_per_client: int  # requests sent = this x N (the benchmark's num_prompts / max_concurrency)
    warmup_waves: int         # client waves left out of the means at the start
    length_low: float         # ISL and OSL drawn uniform on [floor(low x L), L]; 1.0 = exactly L

    def lengths(self, length: int) -> tuple[int, int]:
        """(lowest, highest) length drawn for a row's nominal ISL or OSL."""
        return max(1, int(length * self.length_low)), int(length)


# InferenceX: 10 N requests (CONC * 10), every one counted, lengths on [0.8 L, L] (module docstring).
BENCHMARK = RunDesign("benchmark", requests_per_client=10, warmup_waves=0, length_low=0.8)
# The gap-analysis rows: the same counts at exact lengths (module docstring).
GAP_BENCHMARK = RunDesign("benchmark", requests_per_client=10, warmup_waves=0, length_low=1.0)
# The window before this module: the cold wave left out, one wave measured, fixed lengths.
STEADY = RunDesign("steady", requests_per_client=0, warmup_waves=1, length_low=1.0)


def harness(row: pd.Series) -> str:
    """INFERENCEX or AIC_GAP, from the row's silicon_data_source."""
    src = str(row.get("silicon_data_source", ""))
    if src.startswith(_INFERENCEX_PREFIXES):
        return INFERENCEX
    name = src.split(";", 1)[0].removeprefix("source_file=").rsplit("/", 1)[-1]
    return INFERENCEX if name in INFERENCEX_GAP_FILES else AIC_GAP


def run_design(row: pd.Series, window: str = DEFAULT_WINDOW) -> RunDesign:
    """The closed loop a row runs under `--window`: the benchmark's design or the steady window."""
    if window not in WINDOWS:
        raise ValueError(f"window {window!r}: choose one of {', '.join(WINDOWS)}")
    if window not in ("benchmark", "benchmark-full"):
        return STEADY
    return GAP_BENCHMARK if harness(row) == AIC_GAP else BENCHMARK
