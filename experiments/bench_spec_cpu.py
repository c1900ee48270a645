"""Speculative decoding on the CPU: SmolLM2-135M-Instruct, one thread, n-gram drafts, an edit workload.

Each prompt asks the model to copy a passage from experiments/data/spec_edit_text.txt (written for
this benchmark) with one word replaced, so the output repeats the prompt and prompt lookup drafts
well. Greedy, EOS ignored, fixed output length. Two engines built once (plain, and ngram with
disable_by_batch_size) and run alternately, in turn first, because this machine's speed drifts:

- batch 1: the prompts one at a time; output tok/s of each engine and their ratio;
- batch 16: 16 prompts at once (speculation switched off from --disable running requests).

Outputs must be token-identical (checked). Then the simulator, given the acceptance measured here
(with --step-log, read from the speculative engine's step log as a study's acceptance_from; else
the per-position counters) and each --profile, predicts both speedups for the same prompts, so
the prediction and the measurement are ratios of one run. Run pinned to one core, e.g.

    taskset -c 1 python experiments/bench_spec_cpu.py [--k 4] [--max-tokens 96] [--rounds 2] \
        --profile P.json --step-log spec_steps.csv

--method draft_model drafts with --draft (default: SmolLM2 itself, the only model with its
tokenizer at hand: every draft is accepted and the draft costs what the target does, so the
ratio measures the draft-model path's overhead, not a speedup); no simulator prediction then
(a fitted CPU profile prices only the target).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from twinserve.backends.real import LLM, SamplingParams  # noqa: E402

TEXT = (Path(__file__).parent / "data" / "spec_edit_text.txt").read_text()
EDITS = [("river", "stream"), ("miller", "baker"), ("mill", "workshop"), ("village", "town"),
         ("wheel", "drum"), ("sluice", "gate"), ("garden", "yard"), ("water", "current")]


def prompts_for(tok, n: int) -> list[list[int]]:
    """n chat prompts: copy a passage (a paragraph's first 4-6 sentences) with one word replaced."""
    paragraphs = [[s.strip() + "." for s in p.split(".") if s.strip()] for p in TEXT.split("\n") if p.strip()]
    out = []
    for i in range(n):
        sentences = paragraphs[i % len(paragraphs)]
        passage = " ".join(sentences[:4 + i % 3])
        old, new = EDITS[i % len(EDITS)]
        msg = (f"Copy the following text exactly, word for word, but replace every '{old}' with '{new}'.\n\n"
               f"{passage}")
        ids = tok.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def measured_rates(llm: LLM, k: int) -> list[float]:
    """P(position i accepted | all before it were), from the scheduler's per-position counters."""
    s = llm.llm_engine.core.stats()
    per_pos = list(s.spec_accepted_per_pos) + [0] * k
    rates, reached = [], s.spec_num_drafts
    for i in range(k):
        rates.append(per_pos[i] / reached if reached else 0.0)
        reached = per_pos[i]
    return rates


def predict(rates: list[float], k: int, disable: int, batch: int, prompt_lens: list[int], out_len: int,
            profile: str) -> float:
    """The simulator's speedup (plain time / speculative time) for these prompts, `batch` at a time."""
    import tempfile

    from twinserve.sim.build import simulate
    from twinserve.sim.config import StudyConfig

    cfg = StudyConfig()
    cfg.engine.model, cfg.engine.cost_model = "SmolLM2-135M", "fitted"
    cfg.engine.profile, cfg.engine.num_gpu_blocks = profile, 1456
    s, w = cfg.scheduler, cfg.workload
    # As the engines here: no prefix caching, one budget of 2048 tokens.
    s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len = batch, 2048, 2048
    s.enable_prefix_caching = False
    # The prompts' own lengths, all there at once (batch 1 runs them in turn, as the benchmark does).
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                + "".join(f"0,{n},{out_len}\n" for n in prompt_lens))
    w.num_requests, w.arrival, w.trace = len(prompt_lens), "trace", f.name
    w.prompt_dist = w.output_dist = "trace"
    try:
        plain = simulate(cfg)[1].end_time
        spec = dataclasses.replace(cfg)
        spec.speculative = dataclasses.replace(cfg.speculative, method="ngram", num_speculative_tokens=k,
                                               acceptance_rates=[max(0.0, min(1.0, r)) for r in rates],
                                               disable_by_batch_size=disable)
        return plain / simulate(spec)[1].end_time
    finally:
        os.unlink(f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch1-prompts", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--disable", type=int, default=4, help="disable_by_batch_size")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--method", choices=("ngram", "draft_model"), default="ngram")
    ap.add_argument("--draft", default="smollm2", help="the draft model of --method draft_model")
    ap.add_argument("--profile", nargs="+", default=["builtin:smollm2-135m-cpu-1t"],
                    help="the simulator's step profile(s), each predicting both speedups (one calibrated on "
                         "this machine: twinserve calibrate --speculative-config ..., so verify steps are "
                         "priced from measurements)")
    ap.add_argument("--step-log", default=None, metavar="CSV",
                    help="the speculative engine's step log; the simulator's acceptance is read from it "
                         "(acceptance_from) rather than from the per-position counters")
    ap.add_argument("--json", default=None, help="also write the measured figures here")
    ap.add_argument("--from-json", default=None, help="measure nothing: predict the figures of an earlier "
                    "--json run with --profile")
    args = ap.parse_args()
    if args.from_json:
        report(json.loads(Path(args.from_json).read_text()), args.profile)
        return
    torch.set_num_threads(args.threads)
    common = dict(dtype="float32", max_model_len=2048, max_num_seqs=args.batch, max_num_batched_tokens=2048,
                  enable_prefix_caching=False)
    spec_cfg = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
                "disable_by_batch_size": args.disable}
    if args.method == "draft_model":
        spec_cfg = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k,
                    "disable_by_batch_size": args.disable}
    plain = LLM("smollm2", **common)
    spec = LLM("smollm2", **common, speculative_config=spec_cfg,
               **({"step_log_path": args.step_log} if args.step_log else {}))
    tok = plain.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    one = prompts_for(tok, args.batch1_prompts)
    many = prompts_for(tok, args.batch)
    print(f"SmolLM2-135M-Instruct fp32, torch threads {torch.get_num_threads()}, affinity "
          f"{sorted(os.sched_getaffinity(0))}, {os.cpu_count()} CPUs seen, load average {os.getloadavg()[0]:.1f}")
    how = f"draft_model {args.draft}" if args.method == "draft_model" else f"ngram prompt_lookup_max={args.lookup_max}"
    print(f"{how} k={args.k} disable_by_batch_size={args.disable}; "
          f"{args.max_tokens} output tokens per request; prompts {min(map(len, many))}-{max(map(len, many))} tokens")
    times = {("b1", "plain"): 0.0, ("b1", "spec"): 0.0, ("bN", "plain"): 0.0, ("bN", "spec"): 0.0}
    # Each round's speedup per shape, so the spread from this machine's drift shows.
    per_round: dict[str, list[float]] = {"b1": [], "bN": []}
    identical = True
    for r in range(args.rounds):
        for shape, prompts, alone in (("b1", one, True), ("bN", many, False)):
            if not prompts:
                continue
            before = (times[(shape, "plain")], times[(shape, "spec")])
            outs = {}
            # Odd rounds run speculation first, so drift within a round hits both alike.
            order = (("plain", plain), ("spec", spec))
            for name, llm in (order if r % 2 == 0 else order[::-1]):
                if alone:
                    runs = [timed(llm, [p], params) for p in prompts]
                    times[(shape, name)] += sum(t for t, _ in runs)
                    outs[name] = [o.outputs[0].token_ids for _, r in runs for o in r]
                else:
                    t, r = timed(llm, prompts, params)
                    times[(shape, name)] += t
                    outs[name] = [o.outputs[0].token_ids for o in r]
            identical &= outs["plain"] == outs["spec"]
            per_round[shape].append((times[(shape, "plain")] - before[0]) / (times[(shape, "spec")] - before[1]))
    counters = measured_rates(spec, args.k)
    n1, nN = args.rounds * len(one) * args.max_tokens, args.rounds * len(many) * args.max_tokens
    s = spec.llm_engine.core.stats()
    print(f"greedy outputs identical: {identical}; acceptance {s.spec_num_accepted_tokens}/"
          f"{s.spec_num_draft_tokens} draft tokens over {s.spec_num_drafts} drafts; "
          f"per-position rates {[round(r, 3) for r in counters]}")
    rates = counters
    if args.step_log:
        from twinserve.sim.speculative import rates_from_step_log

        spec.llm_engine.step_log.close()
        rates = rates_from_step_log(Path(args.step_log), args.k)
    figures = {"method": args.method, "identical": identical, "rates": rates, "per_position": counters, "k": args.k,
               "disable": args.disable, "max_tokens": args.max_tokens, "acceptance_from": args.step_log,
               "load_average": os.getloadavg()[0]}
    for shape, n, batch, prompts in (("b1", n1, 1, one), ("bN", nN, args.batch, many)):
        if prompts:
            tp, ts = n / times[(shape, "plain")], n / times[(shape, "spec")]
            figures[f"batch{batch}"] = {"batch": batch, "plain_tok_s": tp, "spec_tok_s": ts, "measured": ts / tp,
                                        "per_round": per_round[shape], "prompt_lens": [len(p) for p in prompts]}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    report(figures, args.profile)


def report(figures: dict, profiles: list[str]) -> None:
    """Measured speedups, and each profile's prediction from the measured acceptance, as ratios."""
    rates = figures["rates"]
    print(f"simulator's acceptance: " + (f"acceptance_from {figures['acceptance_from']} -> {rates[0]:.3f} at every "
          "position" if figures.get("acceptance_from") else f"per-position counters {rates}"))
    for key in sorted((k for k in figures if k.startswith("batch") and k[5:].isdigit()), key=lambda k: int(k[5:])):
        fig = figures[key]
        measured, method = fig["measured"], figures.get("method", "ngram")
        print(f"batch {fig['batch']:>2}: plain {fig['plain_tok_s']:6.1f} tok/s, {method} {fig['spec_tok_s']:6.1f} "
              f"tok/s, speedup {measured:.2f}x; per round {[round(x, 2) for x in fig['per_round']]}")
        if method != "ngram":
            print("  no simulator prediction (a fitted CPU profile prices only the target)")
            continue
        for prof in profiles:
            pred = predict(rates, figures["k"], figures["disable"], fig["batch"], fig["prompt_lens"],
                           figures["max_tokens"], prof)
            print(f"  simulator with {prof}: {pred:.2f}x ({(pred / measured - 1) * 100:+.1f}% of measured)")


if __name__ == "__main__":
    main()
