"""Offline throughput: twinserve vs transformers' generate on SmolLM2-135M-Instruct, same prompts.

64 chat prompts (prompt lengths 16-512, output lengths 16-256, fixed seed), greedy, EOS ignored.
transformers runs in left-padded batches of 8, each generating its batch's longest output; its
throughput counts only the tokens that were asked for. Also decode tok/s at batch 1 for both.
Every engine is built once; they alternate (see main) because this VM's speed drifts.
Run: python experiments/bench_offline.py [--num-prompts 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from twinserve.backends.real import LLM, SamplingParams  # noqa: E402
from twinserve.backends.real.step_log import StepLog  # noqa: E402

TEXT = ("The history of computing is a story of abstraction layered upon abstraction. Early machines were "
        "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. Operating "
        "systems shared one processor among many users, and virtual memory let each program pretend it owned "
        "the whole address space. Paging, in particular, split memory into fixed-size blocks so that a "
        "program's pages could live anywhere in physical memory. Decades later the same idea returned in "
        "language model serving, where the key and value cache of each request is split into blocks. ")


def make_workload(tok, n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """n chat prompts of exact token lengths in [16, 512] and output lengths in [16, 256]."""
    rng = random.Random(seed)
    filler = tok(TEXT * 8)["input_ids"]
    system = [{"role": "system", "content": "Be brief."}]
    empty = tok.apply_chat_template(system + [{"role": "user", "content": ""}], add_generation_prompt=True)
    empty = list(empty["input_ids"] if hasattr(empty, "keys") else empty)
    marker = tok.apply_chat_template(system + [{"role": "user", "content": "X"}], add_generation_prompt=True)
    marker = list(marker["input_ids"] if hasattr(marker, "keys") else marker)
    cut = next(i for i in range(len(empty)) if empty[i] != marker[i])
    head, tail = empty[:cut], empty[cut:]
    prompts, outs = [], []
    for _ in range(n):
        length = max(rng.randint(16, 512), len(empty) + 1)
        start = rng.randrange(0, len(filler) - 512)
        prompts.append(head + filler[start:start + length - len(empty)] + tail)
        outs.append(rng.randint(16, 256))
    return prompts, outs


def bench_twinserve(llm: LLM, prompts: list[list[int]], outs: list[int]) -> tuple[float, int]:
    """Wall seconds and output tokens for the whole workload in one generate call."""
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    t = time.perf_counter()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t
    return dt, sum(len(r.outputs[0].token_ids) for r in res)


def bench_hf(hf, prompts: list[list[int]], outs: list[int], batch: int = 8) -> tuple[float, int, int]:
    """Wall seconds, requested tokens, generated tokens (padding included) in padded batches."""
    t = time.perf_counter()
    generated = 0
    for i in range(0, len(prompts), batch):
        ps, os_ = prompts[i:i + batch], outs[i:i + batch]
        width = max(len(p) for p in ps)
        ids = torch.full((len(ps), width), 2, dtype=torch.long)
        mask = torch.zeros((len(ps), width), dtype=torch.long)
        for j, p in enumerate(ps):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        with torch.inference_mode():
            g = hf.generate(ids, attention_mask=mask, max_new_tokens=max(os_), do_sample=False, pad_token_id=2)
        generated += (g.shape[1] - width) * len(ps)
    return time.perf_counter() - t, sum(outs), generated


def decode_rate_twinserve(llm: LLM, prompt: list[int], n: int) -> float:
    """Batch-1 decode tok/s: (time for n+1 tokens - time for 1 token) / n."""
    def run(k: int) -> float:
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=k, ignore_eos=True),
                     use_tqdm=False)
        return time.perf_counter() - t
    run(4)
    return n / (run(n + 1) - run(1))


def decode_rate_hf(hf, prompt: list[int], n: int) -> float:
    """Same measurement for transformers' generate."""
    ids = torch.tensor([prompt])

    def run(k: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                        do_sample=False, pad_token_id=2)
        return time.perf_counter() - t
    run(4)
    return n / (run(n + 1) - run(1))


PATHS = ("transposed", "prepacked", "linear", "blocked")


def main() -> None:
    """Run both engines and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-rounds", type=int, default=3, help="batch-1 decode rounds, engines alternating")
    ap.add_argument("--kv-cache-memory-gb", type=float, default=3.0)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--tensor-parallel-size", type=int, nargs="+", default=[1],
                    help="one or more TP sizes, run side by side (threads is per rank); more than one skips HF")
    ap.add_argument("--engine-core-mode", default="inproc")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="twinserve weight/KV dtypes to run, in this order (fp32 is the default; bf16 uses "
                         "AMX/AVX512-BF16 where the CPU has them, through prepacked weights; "
                         "'bfloat16:plain' runs bf16 without prepacking, for the comparison; "
                         "'bfloat16:int8' adds int8 weight copies for 1-row steps, --quantization int8; "
                         "'bfloat16:int4' int4 projections and an int8 LM head, --quantization int4; "
                         "'float32:prepacked' (or transposed, linear, blocked) pins the few-row product path)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    if len(a.tensor_parallel_size) > 1:
        compare_tp(a, threads)
        return
    engines: dict[str, LLM] = {}
    for spec in a.dtypes.split(","):
        dtype, _, variant = spec.partition(":")
        if variant not in ("", "plain", "int8", "int4", *PATHS):
            ap.error(f"--dtypes: unknown variant {variant!r} in {spec!r} (':plain', ':int8', ':int4' or a "
                     f"product path: {', '.join(PATHS)})")
        # 'float32:prepacked' etc. pin every few-row product to one path (issue 54: against the timed 'auto').
        paths = {"cpu_product_paths": variant} if variant in PATHS else {}
        llm = LLM("smollm2", max_model_len=1024, kv_cache_memory_gb=a.kv_cache_memory_gb, seed=a.seed, dtype=dtype,
                  tensor_parallel_size=a.tensor_parallel_size[0], engine_core_mode=a.engine_core_mode,
                  prepack_weights=variant != "plain", quantization=variant if variant in ("int8", "int4") else None,
                  **paths)
        engine = llm.llm_engine
        print(f"twinserve {spec}: KV cache {engine.kv_bytes_per_token} bytes/token (largest rank), "
              f"{engine.scheduler_config.num_blocks} blocks x {engine.scheduler_config.block_size} tokens; "
              f"RSS after building: {rss_mib():.0f} MiB")
        engines[spec] = llm
    prompts, outs = make_workload(next(iter(engines.values())).get_tokenizer(), a.num_prompts, a.seed)
    print(f"workload: {len(prompts)} prompts, prompt tokens {sum(map(len, prompts))} "
          f"(min {min(map(len, prompts))}, max {max(map(len, prompts))}), output tokens {sum(outs)} "
          f"(min {min(outs)}, max {max(outs)}); threads={threads}")
    hf = None
    if not a.skip_hf:
        from transformers import AutoModelForCausalLM

        from twinserve.backends.real.models.registry import resolve_model

        hf = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2").path), dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
    # This VM's speed drifts by up to 2x from minute to minute, so the engines alternate: twinserve's
    # mixed batch runs before and after transformers' (the mean is reported), and batch-1 decode
    # alternates over rounds (the median of the per-round ratios is reported).
    mixed: dict[str, list[float]] = {spec: [] for spec in engines}
    hf_rate = None
    for rnd in range(2 if hf is not None else 1):
        for spec, llm in engines.items():
            llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=4),
                         use_tqdm=False)
            steps0 = llm.llm_engine.core.num_steps
            ts_dt, ts_tok = bench_twinserve(llm, prompts, outs)
            mixed[spec].append(ts_tok / ts_dt)
            print(f"twinserve {spec:15s} mixed batch: {ts_tok} tokens in {ts_dt:.1f} s = {ts_tok / ts_dt:.1f} output "
                  f"tok/s (threads={threads}, steps={llm.llm_engine.core.num_steps - steps0})", flush=True)
        if hf is not None and rnd == 0:
            hf_dt, hf_tok, hf_gen = bench_hf(hf, prompts, outs)
            hf_rate = hf_tok / hf_dt
            print(f"transformers  mixed batch (padded batches of 8): {hf_tok} requested tokens ({hf_gen} generated) "
                  f"in {hf_dt:.1f} s = {hf_rate:.1f} output tok/s (threads={threads})", flush=True)
    decode: dict[str, list[float]] = {spec: [] for spec in engines}
    hf_dec: list[float] = []
    for rnd in range(a.decode_rounds):
        if hf is not None:
            hf_dec.append(decode_rate_hf(hf, prompts[0][:32], a.decode_tokens))
        for spec, llm in engines.items():
            decode[spec].append(decode_rate_twinserve(llm, prompts[0][:32], a.decode_tokens))
        parts = ([f"transformers {hf_dec[-1]:.1f}"] if hf_dec else []) + [
            f"twinserve {spec} {decode[spec][-1]:.1f}" for spec in engines]
        print(f"batch-1 decode round {rnd + 1}: {', '.join(parts)} tok/s", flush=True)
    for spec in engines:
        rate = statistics.mean(mixed[spec])
        line = (f"twinserve {spec:15s} mixed batch {rate:.1f} tok/s (mean of {len(mixed[spec])}), "
                f"batch-1 decode {statistics.median(decode[spec]):.1f} tok/s (median of {len(decode[spec])})")
        if hf_rate is not None:
            dec_ratio = statistics.median(x / y for x, y in zip(decode[spec], hf_dec))
            line += (f"; vs transformers fp32: mixed batch {rate / hf_rate:.2f}x, batch-1 decode {dec_ratio:.2f}x "
                     "(median of the per-round ratios)")
        print(line + f" (threads={threads})")
    print(f"peak RSS (every engine in this process): {rss_mib():.0f} MiB")


def rss_mib() -> float:
    """Peak resident memory of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compare_tp(a: argparse.Namespace, threads: int) -> None:
    """The same workload at each TP size in turn: throughput, ratio to the first, communication share."""
    rows = []
    for tp in a.tensor_parallel_size:
        llm = LLM("smollm2", max_model_len=1024, kv_cache_memory_gb=a.kv_cache_memory_gb, seed=a.seed,
                  tensor_parallel_size=tp, engine_core_mode="inproc")
        engine = llm.llm_engine
        engine.set_step_log(StepLog(keep=True))
        prompts, outs = make_workload(llm.get_tokenizer(), a.num_prompts, a.seed)
        llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=4),
                     use_tqdm=False)
        n0 = len(engine.step_log.records)
        dt, tok = bench_twinserve(llm, prompts, outs)
        recs = engine.step_log.records[n0:]
        step_s = sum(r.step_time_s for r in recs)
        comm_s = sum(r.extra.get("comm_time_s", 0.0) for r in recs)
        dec = [r for r in recs if not r.prefill_chunks]
        dec_share = (sum(r.extra.get("comm_time_s", 0.0) for r in dec)
                     / max(1e-9, sum(r.step_time_s for r in dec)))
        rows.append((tp, tok / dt, len(recs), step_s, comm_s, dec_share, engine.scheduler_config.num_blocks))
        engine.shutdown()
    print(f"workload: {a.num_prompts} prompts, in-process engine core, {threads} torch thread(s) per rank")
    print(f"{'TP':>3} {'out tok/s':>10} {'vs TP ' + str(rows[0][0]):>9} {'steps':>6} {'step s':>10} "
          f"{'comm s':>8} {'comm share':>10} {'decode-step share':>17} {'KV blocks':>9}")
    for tp, rate, n, step_s, comm_s, dshare, blocks in rows:
        print(f"{tp:>3} {rate:>10.1f} {rate / rows[0][1]:>9.2f} {n:>6} {step_s:>10.1f} {comm_s:>8.1f} "
              f"{comm_s / max(step_s, 1e-9):>10.1%} {dshare:>17.1%} {blocks:>9}")


if __name__ == "__main__":
    main()
