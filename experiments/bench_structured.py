"""Structured output's cost: decode tok/s with a JSON-schema constraint against without, same prompts.

Both arms generate exactly --max-tokens tokens per sequence: the unconstrained arm with ignore_eos,
the constrained arm with a schema whose shortest valid output is longer than --max-tokens (an
array with minItems), so batch shapes and context lengths match step for step and the only
difference is the grammar bitmask (fill + apply + advance). Arms alternate, --repeats times each;
the best run of each is compared. The step log's extra["grammar_mask_s"] gives the mask's share.

    python experiments/bench_structured.py --batch 1 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {"cities": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
    "required": ["cities"],
    "additionalProperties": False,
}
TOPICS = ["European capitals", "rivers of Asia", "famous painters", "board games", "programming languages",
          "mountain ranges", "jazz musicians", "breakfast foods"]


def run_arm(llm, prompts: list[str], params) -> tuple[float, int, float, float]:
    """(seconds, output tokens, summed step time, summed grammar mask time) of one generate call."""
    log = llm.llm_engine.step_log
    first = len(log.records)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    recs = log.records[first:]
    return (dt, sum(len(o.outputs[0].token_ids) for o in outs), sum(r.step_time_s for r in recs),
            sum(r.extra.get("grammar_mask_s", 0.0) for r in recs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    import torch

    from twinserve.backends.real import LLM, SamplingParams
    from twinserve.backends.real.step_log import StepLog
    from twinserve.core.structured_output import StructuredOutputSpec

    torch.set_num_threads(a.threads)
    llm = LLM(a.model, dtype="float32", max_model_len=1024, max_num_seqs=max(a.batch),
              max_num_batched_tokens=2048, kv_cache_memory_gb=0.5)
    llm.llm_engine.set_step_log(StepLog(keep=True))  # phase timing on in both arms alike
    compiler = llm.llm_engine.grammar_compiler
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputSpec("json", json.dumps(SCHEMA), "bench"))
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(StructuredOutputSpec("json", json.dumps(SCHEMA), "bench"))
    warm = time.perf_counter() - t0
    print(f"torch threads {torch.get_num_threads()}; schema compile: cold {cold * 1e3:.1f} ms, "
          f"cached {warm * 1e6:.0f} us")
    print("| batch | tok/s free | tok/s JSON schema | ratio | slower | mask ms/step | mask share of step |")
    print("|---|---|---|---|---|---|---|")
    for b in a.batch:
        prompts = [f"List {TOPICS[i % len(TOPICS)]} as JSON." for i in range(b)]
        prompts = [llm.llm_engine.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
        free = SamplingParams(max_tokens=a.max_tokens, temperature=0, ignore_eos=True)
        spec = StructuredOutputSpec("json", json.dumps(SCHEMA), "bench")
        constrained = SamplingParams(max_tokens=a.max_tokens, temperature=0, structured_output=spec)
        run_arm(llm, prompts[:1], free)  # warm-up
        free_runs, json_runs = [], []
        for _ in range(a.repeats):
            free_runs.append(run_arm(llm, prompts, free))
            json_runs.append(run_arm(llm, prompts, constrained))
        assert all(r[1] == b * a.max_tokens for r in free_runs + json_runs), "arms must emit equal tokens"
        best_free = min(free_runs, key=lambda r: r[0])
        best_json = min(json_runs, key=lambda r: r[0])
        tps_free = best_free[1] / best_free[0]
        tps_json = best_json[1] / best_json[0]
        steps = a.max_tokens
        mask_ms = statistics.mean(r[3] for r in json_runs) / steps * 1e3
        share = statistics.mean(r[3] / r[2] for r in json_runs if r[2] > 0)
        print(f"| {b} | {tps_free:.1f} | {tps_json:.1f} | {tps_json / tps_free:.3f} | "
              f"{(1 - tps_json / tps_free) * 100:.1f}% | {mask_ms:.2f} | {share * 100:.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
