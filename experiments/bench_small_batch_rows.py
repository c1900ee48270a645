"""The transposed weight copies' row limit: whole SmolLM2 decode steps at two limits, side by side.

CPU fp32 products of at most `small_batch_rows` rows run as x @ W_t (a transposed copy of
each weight), the others as F.linear; which is faster depends on the rows and on the CPU
(llama.SMALL_BATCH_ROWS). For each batch size this runs the same decode workload with the
limit at --baseline (4, the rule measured on an AVX2 EPYC) and at --rows (default: this CPU's,
llama.default_small_batch_rows()), alternating, and prints the median forward time of the
steps that decode the whole batch and the baseline's time over the other's (1 thread).

    python experiments/bench_small_batch_rows.py [--batches 1 2 4 5 8 16 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random

import torch

from bench_pad_rows import alternating, decode_median  # this folder: a script's own is on sys.path

import twinserve.backends.real.models.llama as llama
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.step_log import StepLog


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=200, help="prompt tokens per sequence")
    p.add_argument("--baseline", type=int, default=llama.SMALL_BATCH_ROWS)
    p.add_argument("--rows", type=int, default=None, help="default: this CPU's (llama.default_small_batch_rows)")
    a = p.parse_args()
    rows = llama.default_small_batch_rows() if a.rows is None else a.rows
    torch.set_num_threads(1)
    engine = LLMEngine(EngineArgs(model=a.model, dtype="float32", max_num_seqs=64,
                                  max_num_batched_tokens=4096, small_batch_rows=rows))
    model = engine.worker.model
    rng = random.Random(0)
    log = StepLog(keep=True)
    engine.set_step_log(log)

    def decode_forward(batch: int, limit: int) -> float:
        model.set_small_batch_rows(limit)
        return decode_median(engine, log, rng, batch, a.prompt)

    decode_forward(4, rows)  # warm-up
    print(f"threads={torch.get_num_threads()} model={a.model} fp32, cpu {torch.backends.cpu.get_cpu_capability()}: "
          f"copies up to {a.baseline} rows (baseline) against up to {rows}")
    for b, t_base, t_other in alternating(decode_forward, a.batches, a.rounds, a.baseline, rows):
        print(f"batch {b:3d}: decode forward {t_base * 1e3:7.1f} ms up to {a.baseline}, "
              f"{t_other * 1e3:7.1f} ms up to {rows}: {t_base / t_other:.2f}x", flush=True)
    engine.shutdown()


if __name__ == "__main__":
    main()
