"""Whole SmolLM2 fp32 decode steps of 1, 2, 4 and 8 sequences under CPU product plans, side by side.

Plans: 'vendor' (the rule issue 54 replaces: 1 row on x @ W_t, more on oneDNN-prepacked weights, as
on every AMD CPU), 'auto' (each row count's path timed on this host, product_paths.py) and any path
named with --paths. One engine; the plans swap between rounds, so the ratios hold on a busy machine.
Prints the median forward and step time of the steps that decode the whole batch, and each batch's
step over the 1-sequence step of the same plan. Also the start-up timing cost with an empty cache.

    taskset -c 1 python experiments/bench_cpu_product_paths.py [--batches 1 2 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import torch

from twinserve.backends.real import few_rows
from twinserve.backends.real import product_paths as pp
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.step_log import StepLog
from twinserve.core.sampling_params import SamplingParams

VENDOR = ("transposed",) + ("prepacked",) * pp.TIMED_ROWS


def decode_steps(engine: LLMEngine, log: StepLog, rng: random.Random, batch: int, prompt: int,
                 tokens: int) -> list[tuple[float, float]]:
    """(forward s, step s) of each step decoding all `batch` sequences together."""
    for _ in range(batch):
        ids = [rng.randint(2, engine.vocab_size - 1) for _ in range(prompt)]
        engine.add_request(f"r{rng.random()}", {"prompt_token_ids": ids},
                           SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0))
    first = len(log.records)
    while engine.has_unfinished_requests():
        engine.step()
    recs = [r for r in log.records[first:] if r.num_prefill_tokens == 0 and len(r.decode_context_lens) == batch]
    return [(r.forward_s, r.step_time_s) for r in recs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default="smollm2", help="catalog name or path of the model to time")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8], help="decode batch sizes (sequences)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, plans alternating, per batch size")
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens per sequence")
    p.add_argument("--tokens", type=int, default=12, help="output tokens per sequence")
    p.add_argument("--paths", nargs="*", default=[], choices=pp.PATHS, help="also these single-path plans")
    a = p.parse_args()
    torch.set_num_threads(1)
    engine = LLMEngine(EngineArgs(model=a.model, dtype="float32", max_num_seqs=64, max_num_batched_tokens=4096))
    plan = engine.worker.product_plan
    model = engine.worker.model
    built = few_rows.cache_dir() / "ext"
    with tempfile.TemporaryDirectory() as d:  # the start-up cost a host pays once: an empty plan cache
        if built.exists():  # the kernel's one-time build is not start-up timing: reuse it
            os.symlink(built, os.path.join(d, "ext"))
        os.environ["TWINSERVE_CACHE_DIR"] = d
        fresh = pp.resolve_plan(engine.args, model.config, torch.device("cpu"), torch.float32)
    plans = {"vendor": (VENDOR, VENDOR), "auto": (plan.projections, plan.head)}
    for path in a.paths:
        t = (path,) * pp.TIMED_ROWS + ("linear" if path == "blocked" else path,)
        plans[path] = (t, t)
    print(f"threads={torch.get_num_threads()} model={a.model} fp32, cpu {pp.describe_cpu()}, "
          f"torch {torch.__version__}, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"auto plan ({plan.source}): projections {pp.compact(plan.projections)}; head {pp.compact(plan.head)}")
    print(f"start-up timing with an empty plan cache: {fresh.timing_s:.1f} s, paths timed: "
          f"{', '.join(fresh.timings_ms.get('head', {}))}")
    log = StepLog(keep=True)
    engine.set_step_log(log)
    rng = random.Random(0)
    res: dict[str, dict[int, list[tuple[float, float]]]] = {n: {b: [] for b in a.batches} for n in plans}
    # Plans and batches alternate round by round; the least disturbed step (the minimum) is the figure
    # on a shared machine, the median beside it.
    model.set_product_plan(*plans["auto"])
    decode_steps(engine, log, rng, 2, a.prompt, 4)  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        for b in a.batches:
            for name, (proj, head) in plans.items():
                model.set_product_plan(proj, head)
                res[name][b] += decode_steps(engine, log, rng, b, a.prompt, a.tokens)
    print(f"{a.rounds} rounds in {time.perf_counter() - t0:.0f} s; load now {os.getloadavg()[0]:.1f}")
    print("plan | batch | steps | min forward ms | min step ms | min step / 1-seq | median step ms | median / 1-seq")
    for name in plans:
        one_min = min(s for _, s in res[name][a.batches[0]])
        one_med = statistics.median(s for _, s in res[name][a.batches[0]])
        for b in a.batches:
            steps = res[name][b]
            f, s = min(x for x, _ in steps), min(x for _, x in steps)
            med = statistics.median(x for _, x in steps)
            print(f"{name:10s} | {b:3d} | {len(steps):3d} | {f * 1e3:8.1f} | {s * 1e3:8.1f} | {s / one_min:5.2f}x | "
                  f"{med * 1e3:8.1f} | {med / one_med:5.2f}x", flush=True)
    engine.shutdown()


if __name__ == "__main__":
    main()
