"""Padding CPU fp32 products to 16 rows: whole SmolLM2 decode steps, padded vs not, side by side.

MKL's sgemm picks its kernel by the number of rows; on this project's VM 16 rows ran in
about half the time of 12-15. For each batch size this runs the same decode workload with
`PAD_ROWS` on and off, alternating, and prints the median forward time of the steps that
decode the whole batch, and the ratio (1 thread).

    python experiments/bench_pad_rows.py [--batches 6 8 9 12 13 15 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable, Iterator, Sequence

import torch

import twinserve.backends.real.models.llama as llama
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.step_log import StepLog
from twinserve.core.sampling_params import SamplingParams


def decode_median(engine: LLMEngine, log: StepLog, rng: random.Random, batch: int, prompt: int) -> float:
    """Decode `batch` random prompts of `prompt` tokens together (8 tokens each): the median
    forward time of the steps that decode the whole batch (log: the engine's kept step log)."""
    for _ in range(batch):
        ids = [rng.randint(2, engine.vocab_size - 1) for _ in range(prompt)]
        engine.add_request(f"r{rng.random()}", {"prompt_token_ids": ids},
                           SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0))
    first = len(log.records)
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(r.forward_s for r in log.records[first:]
                             if r.num_prefill_tokens == 0 and r.num_decode_seqs == batch)


def alternating(measure: Callable[[int, int], float], batches: Sequence[int], rounds: int, first: int,
                second: int) -> Iterator[tuple[int, float, float]]:
    """(batch, median of measure(batch, first), median of measure(batch, second)) per batch, the
    two settings alternating round by round."""
    for b in batches:
        one, two = [], []
        for _ in range(rounds):
            one.append(measure(b, first))
            two.append(measure(b, second))
        yield b, statistics.median(one), statistics.median(two)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batches", nargs="+", type=int, default=[6, 8, 9, 12, 13, 15, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens per sequence")
    a = p.parse_args()
    torch.set_num_threads(1)
    # The transposed copies up to SMALL_BATCH_ROWS (4) rows, as on the CPUs the padding was
    # measured on: with the copies up to 64 rows (AVX-512) no product of 9-15 rows is padded.
    engine = LLMEngine(EngineArgs(model=a.model, dtype="float32", max_num_seqs=64,
                                  max_num_batched_tokens=4096, small_batch_rows=llama.SMALL_BATCH_ROWS))
    rng = random.Random(0)
    log = StepLog(keep=True)
    engine.set_step_log(log)
    pad = llama.PAD_ROWS

    def decode_forward(batch: int, rows: int) -> float:
        llama.PAD_ROWS = rows
        return decode_median(engine, log, rng, batch, a.prompt)

    decode_forward(4, pad)  # warm-up
    print(f"threads={torch.get_num_threads()} model={a.model} fp32, PAD_ROWS={pad} from "
          f"{llama.PAD_MIN_ROWS} rows")
    for b, t_on, t_off in alternating(decode_forward, a.batches, a.rounds, pad, 0):
        print(f"batch {b:3d}: decode forward {t_on * 1e3:7.1f} ms with the padding rule, "
              f"{t_off * 1e3:7.1f} ms without: {t_off / t_on:.2f}x", flush=True)
    llama.PAD_ROWS = pad
    engine.shutdown()


if __name__ == "__main__":
    main()
