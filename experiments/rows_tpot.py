"""The roofline's TPOT against aiconfigurator-core's measured rows (development models only).

Each row's TPOT is predicted as one decode step of the row's concurrency at the row's mean
context (ISL + OSL/2), with the row's GPU, precision and TP/attention-DP/EP/PP (disaggregated
rows: the decode worker's). Prefill interference is left out: a lower bound on TPOT in
aggregated rows. Prints median |error| per model x backend and overall. Held-out models are
never read. The CSV is read from the installed package, not copied.

    python experiments/rows_tpot.py [--variant N]...   # the steps in STEPS, each on top of the last
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path
from statistics import median

import pandas as pd

from twinserve.backends.sim.aic_models import resolve_row_model
from twinserve.backends.sim.capacity import kv_capacity
from twinserve.backends.sim.catalog import hardware_for_aic_system
from twinserve.backends.sim.cost_model import Efficiency
from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
from twinserve.backends.sim.cost_model import roofline_for
from twinserve.backends.sim.parallel import Parallelism
from twinserve.backends.sim.precision import Precision

DEV_MODELS = ("meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B", "openai/gpt-oss-120b", "deepseek-ai/DeepSeek-R1")
QUANT = {"fp8": ("fp8", "fp8"), "fp4": ("nvfp4", "fp8"), "int4": ("int4", "auto"), "bf16": ("none", "auto")}
ENGINE = {"trtllm": "cuda_graph_cpp", "vllm": "eager_python", "sglang": "eager_python"}  # step 0's


def silicon_rows() -> pd.DataFrame:
    """The installed package's silicon_sample.csv."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    return pd.read_csv(Path(spec.origin).parent / "systems" / "silicon_sample.csv")


def _i(v: float) -> int:
    return 1 if v is None or (isinstance(v, float) and math.isnan(v)) or v < 1 else int(v)


def predict(row: pd.Series, engine: dict[str, str], eff_over: dict[str, float]) -> float:
    """Predicted TPOT (ms) of one row; ValueError/KeyError when it cannot be expressed."""
    model = resolve_row_model(row.model_path)
    # No precision given (366 rows): the checkpoint as published, 16-bit for these model ids.
    q, kv = QUANT[row.precision if isinstance(row.precision, str) else "bf16"]
    model = model.with_precision(Precision(quantization=q, kv_cache_dtype=kv))
    hw = hardware_for_aic_system(row.system)
    p = "decode_" if row["mode"] == "disagg" else ""
    if math.isnan(row[p + "batch_size"]):  # disaggregated rows that do not say their decode workers
        raise ValueError("decode workers unknown")
    dp = _i(row[p + "attention_dp_size"])
    par = Parallelism(_i(row[p + "tp_size"]), dp, _i(row[p + "moe_ep_size"]) if model.is_moe else 1,
                      _i(row[p + "pp_size"]))
    batch = _i(row[p + "batch_size"]) * dp  # batch_size is per attention-DP rank
    prof = ENGINE_PROFILES[engine[row.backend]]
    eff = Efficiency.for_hardware(hw, step_overhead_s=prof.step_overhead_s,
                                  per_seq_overhead_s=prof.per_seq_overhead_s, **eff_over)
    cost = roofline_for(model, hw, par, eff)
    ctx = int(row.isl + row.osl / 2)
    # No more sequences run than the KV pool holds at their mean length (the rest wait).
    cap = kv_capacity(model, hw, par.tensor_parallel_size, 64, 0.9, 8192, max(batch, 256), parallel=par)
    batch = max(1, min(batch, cap.num_blocks * 64 // ctx))
    if not MIXED or row["mode"] == "disagg":
        return cost.step_time(0, 0, 0, 0.0, batch, batch * ctx) * 1e3
    # Closed loop, steady state: every OSL decode steps, each of the batch's requests also has
    # ISL tokens prefilled, in chunks of CHUNK tokens riding on a decode step; a mean step is a
    # decode step plus that share of a chunk's extra time.
    decode = cost.step_time(0, 0, 0, 0.0, batch, batch * ctx)
    chunk = min(CHUNK, batch * row.isl)
    seqs = max(1.0, chunk / row.isl)
    mixed = cost.step_time(chunk, seqs, 0, chunk * row.isl / 2, batch, batch * ctx)
    share = batch * row.isl / chunk / row.osl
    return (decode + share * (mixed - decode)) * 1e3


CHUNK = 8192  # tokens a step takes (TensorRT-LLM's max_num_tokens and vLLM's max_num_batched_tokens default)

MIXED = False


# The roofline's changes in turn, each on top of the ones before (the last is the code as it is).
NCCL_2023 = {"allreduce_latency_s": 35e-6, "allreduce_hop_s": 4e-6}
STEPS = {
    "0 before: NCCL all-reduce, decode step only, vLLM/SGLang eager_python": (False, {}, NCCL_2023),
    "1 + the closed loop's prefill chunks in the mean step": (True, {}, NCCL_2023),
    "2 + 2025 one-shot all-reduce (18 us + 1 us a hop)": (True, {}, {}),
    "3 + vLLM/SGLang as cuda_graph_python (0.8 ms a step)": (True, {"vllm": "cuda_graph_python",
                                                                    "sglang": "cuda_graph_python"}, {}),
}
VARIANTS = {k.split(" ", 1)[0]: v for k, v in STEPS.items()}
# Layouts the roofline expressed before this work: no MLA, no expert/attention-DP/pipeline split.
OLD_LAYOUT = ("meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B", "openai/gpt-oss-120b")


def run(variant: str, rows: pd.DataFrame) -> None:
    """Print the error table of one variant."""
    global MIXED
    MIXED, engine_over, eff_over = VARIANTS[variant]
    engine = dict(ENGINE, **engine_over)
    errs: dict[tuple[str, str], list[float]] = {}
    by_tp: dict[int, list[float]] = {}
    old: list[float] = []
    skipped = 0
    for _, row in rows.iterrows():
        try:
            got = predict(row, engine, eff_over)
        except (ValueError, KeyError):
            skipped += 1
            continue
        key = (row.model_path.rsplit("/", 1)[-1], row.backend)
        errs.setdefault(key, []).append(got / row.silicon_tpot_ms - 1.0)
        if row.model_path == DENSE_H200[0] and row.system == DENSE_H200[1] and row.precision == "fp8":
            by_tp.setdefault(_i(row.tp_size), []).append(got / row.silicon_tpot_ms - 1.0)
        if row.model_path in OLD_LAYOUT and max(_i(row[c]) for c in LAYOUT) == 1 and row["mode"] == "agg":
            old.append(got / row.silicon_tpot_ms - 1.0)
    allerr = [e for v in errs.values() for e in v]
    name = next(k for k in STEPS if k.startswith(variant + " "))
    print(f"\n## {name}: {len(allerr)} rows priced, {skipped} not expressible")
    print("| model | backend | rows | median error | median abs error | within 20% |")
    print("|---|---|---|---|---|---|")
    for (m, b), v in sorted(errs.items()):
        print(f"| {m} | {b} | {len(v)} | {median(v):+.1%} | {median(abs(e) for e in v):.1%} | "
              f"{sum(abs(e) <= 0.2 for e in v) / len(v):.0%} |")
    print(f"| all | all | {len(allerr)} | {median(allerr):+.1%} | {median(abs(e) for e in allerr):.1%} | "
          f"{sum(abs(e) <= 0.2 for e in allerr) / len(allerr):.0%} |")
    print(f"| expressible before (no MLA, EP, DP, PP) | all | {len(old)} | {median(old):+.1%} | "
          f"{median(abs(e) for e in old):.1%} | {sum(abs(e) <= 0.2 for e in old) / len(old):.0%} |")

    print("Llama-3.1-70B FP8 on H200 by TP, median error: " + ", ".join(
        f"TP {tp} {median(v):+.0%} ({len(v)})" for tp, v in sorted(by_tp.items())))


DENSE_H200 = ("meta-llama/Llama-3.1-70B", "h200_sxm")
LAYOUT = ("attention_dp_size", "moe_ep_size", "pp_size")


def main() -> None:
    """Parse --variant and print each variant's table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    args = ap.parse_args()
    df = silicon_rows()
    rows = df[df.model_path.isin(DEV_MODELS) & df.silicon_tpot_ms.notna()]
    for v in args.variant or list(VARIANTS):
        run(v, rows)


if __name__ == "__main__":
    main()
