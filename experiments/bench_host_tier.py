"""Host-memory KV tier on the CPU engine: multi-turn sessions that overflow a small device pool.

SmolLM2-135M, fp32, greedy, EOS ignored. S sessions each start from their own long document
(random token ids, distinct per session) and take T turns; a turn re-sends the session's whole
context (document, earlier questions and answers) plus a short new question. Turns go round
robin over the sessions, one request at a time, so between two turns of a session the others
take the device pool (--device-blocks, about one session's context): without a tier every turn
recomputes its context; with --kv-offloading-size the evicted blocks are stored to host memory
and loaded back. Two engines built once and run alternately (--rounds), in turn first; TTFT p50
(over every turn; and over the later turns, which can reuse) per engine and their ratio.
Outputs must be token-identical (checked). Run pinned to one core:

    taskset -c 1 python experiments/bench_host_tier.py [--sessions 4] [--turns 4] [--doc-tokens 768]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from twinserve.backends.real import LLM, SamplingParams  # noqa: E402


def run_sessions(llm: LLM, docs: list[list[int]], questions: list[list[list[int]]], max_tokens: int
                 ) -> tuple[list[float], list[list[int]], int]:
    """Round-robin turns; (TTFT per turn in order, output ids per turn, host-tier hit tokens)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    contexts = [list(d) for d in docs]
    ttfts, outputs = [], []
    for t in range(len(questions[0])):
        for s, ctx in enumerate(contexts):
            ctx += questions[s][t]
            out = llm.generate([{"prompt_token_ids": list(ctx)}], params, use_tqdm=False)[0]
            ids = list(out.outputs[0].token_ids)
            ttfts.append(out.metrics.ttft)
            outputs.append(ids)
            ctx += ids
    return ttfts, outputs, llm.llm_engine.core.stats().external_hits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=4, help="sessions served round robin")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--doc-tokens", type=int, default=768, help="tokens of each session's document")
    p.add_argument("--question-tokens", type=int, default=32, help="new tokens per turn")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length")
    p.add_argument("--device-blocks", type=int, default=64, help="KV blocks of 16 tokens on the device")
    p.add_argument("--offload-gib", type=float, default=1.0, help="--kv-offloading-size of the tiered engine")
    p.add_argument("--rounds", type=int, default=2, help="alternate rounds of both engines")
    a = p.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    docs = [[rng.randrange(200, 40000) for _ in range(a.doc_tokens)] for _ in range(a.sessions)]
    questions = [[[rng.randrange(200, 40000) for _ in range(a.question_tokens)] for _ in range(a.turns)]
                 for _ in range(a.sessions)]
    max_len = a.doc_tokens + a.turns * (a.question_tokens + a.max_tokens) + 16
    common = dict(num_gpu_blocks_override=a.device_blocks, max_model_len=max_len, block_size=16,
                  enable_prefix_caching=True, engine_core_mode="inproc")
    engines = {"device only": LLM("smollm2", **common),
               "host tier": LLM("smollm2", kv_offloading_size=a.offload_gib, **common)}
    print(f"# {a.sessions} sessions x {a.turns} turns, document {a.doc_tokens} tokens, question "
          f"{a.question_tokens}, answer {a.max_tokens}; device pool {a.device_blocks} blocks of 16 "
          f"({a.device_blocks * 16} tokens); host tier {a.offload_gib} GiB; torch threads 1; "
          f"load {os.getloadavg()[0]:.1f}")
    results: dict[str, list[float]] = {k: [] for k in engines}
    later: dict[str, list[float]] = {k: [] for k in engines}
    outs: dict[str, list] = {}
    hits: dict[str, int] = {}
    for r in range(a.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            llm = engines[name]
            h0 = llm.llm_engine.core.stats().external_hits
            t0 = time.perf_counter()
            ttfts, o, h = run_sessions(llm, docs, questions, a.max_tokens)
            wall = time.perf_counter() - t0
            results[name] += ttfts
            later[name] += ttfts[a.sessions:]
            if name in outs:
                assert outs[name] == o, f"{name}: outputs changed between rounds"
            outs[name] = o
            hits[name] = h - h0
            print(f"round {r} {name}: wall {wall:.2f} s, TTFT p50 {statistics.median(ttfts) * 1e3:.0f} ms")
    assert outs["device only"] == outs["host tier"], "outputs differ with the host tier"
    print("outputs token-identical: yes")
    p50 = {k: statistics.median(v) for k, v in results.items()}
    p50_later = {k: statistics.median(v) for k, v in later.items()}
    for k in engines:
        print(f"{k}: TTFT p50 {p50[k] * 1e3:.0f} ms (all turns), {p50_later[k] * 1e3:.0f} ms (turns 2+); "
              f"host-tier hit tokens per round {hits[k]}")
    print(f"TTFT p50 ratio (device only / host tier): {p50['device only'] / p50['host tier']:.2f}x all turns, "
          f"{p50_later['device only'] / p50_later['host tier']:.2f}x turns 2+")


if __name__ == "__main__":
    main()
