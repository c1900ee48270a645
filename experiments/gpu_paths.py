#!/usr/bin/env python
"""The CUDA paths gpu_check.py does not reach: sliding windows under CUDA graphs, several KV groups,
speculative drafts and the host KV tier's pinned, asynchronous copies.

Each section builds a tiny random-weight model with transformers' own classes (the test suite's
tests/real/arch_helpers.py), runs the engine on the device and judges it against what cannot be
wrong: transformers in fp32 read teacher-forced (the regret of gpu_check.py: 0 where the engine
took the reference's argmax, large for a kernel that reads the wrong KV), the same engine without
the feature (drafts and the tier must not change greedy tokens), and the engine's own counters
(graph replays, prefix hits, accepted drafts, host-tier hits and bytes). Bounded by --budget-s.

    python experiments/gpu_paths.py [--sections window_graphs,groups,drafts,tier] [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import (REPO_ROOT, ROWS, Deadline, _regret, ensure_twinserve_importable, print_table,  # noqa: E402
                       report, run_section)

WINDOW = 24  # off the 16-token block edge: a window that starts mid-block
BLOCK = 16


def _prompts(n: int, seed: int, lo: int, hi: int, shared: int = 0) -> list[list[int]]:
    """n random prompts of lo..hi ids from the tiny tokenizer's 300, the first `shared` ids common."""
    rng = random.Random(seed)
    head = [rng.randrange(3, 290) for _ in range(shared)]
    return [head + [rng.randrange(3, 290) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def _gen(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    from twinserve.core.sampling_params import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _judge(section: str, label: str, folder: Path, prompts, outs, tol: float) -> None:
    """Teacher-forced regret of the engine's tokens against transformers fp32 on CPU."""
    import torch
    from tests.real.arch_helpers import hf_model

    with torch.no_grad():
        worst, agree, n = _regret(hf_model(folder), prompts, outs)
    report(section, f"{label} vs transformers fp32, teacher-forced", "PASS" if worst <= tol else "FAIL",
           f"{agree:.1%} of {n} tokens are fp32's argmax; worst regret {worst:.3f} std (tol {tol})")


def _same(section: str, label: str, got, want) -> None:
    diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    report(section, label, "FAIL" if diff or len(got) != len(want) else "PASS",
           f"prompts {diff} differ" if diff else f"{len(got)} prompts token-identical")


def _graph_run(section: str, ctx: "Ctx", llm, case: str, detail: str, prompts) -> list[list[int]]:
    """Report the capture, then generate with graphs and report the replays it made."""
    graphs = llm.llm_engine.worker.runner.graphs
    report(section, case, "PASS" if graphs is not None and graphs.graphs else "FAIL" if ctx.cuda else "INFO",
           f"{len(graphs.graphs) if graphs else 0} buckets{detail}")
    before = graphs.replays if graphs is not None else 0
    out = _gen(llm, prompts, ctx.n)
    if graphs is not None:
        report(section, "decode steps replayed", "PASS" if graphs.replays > before else "FAIL",
               f"{graphs.replays - before} replays")
    return out


def _eager_run(section: str, ctx: "Ctx", llm, prompts, with_graphs) -> list[list[int]]:
    """The same prompts with graphs off; the tokens compared with the graphs' (INFO: near ties may flip)."""
    runner = llm.llm_engine.worker.runner
    graphs, runner.graphs = runner.graphs, None
    eager = _gen(llm, prompts, ctx.n)
    runner.graphs = graphs
    diff = [i for i, (a, b) in enumerate(zip(with_graphs, eager)) if a != b]
    report(section, "greedy tokens graphs vs eager", "INFO", f"prompts {diff} differ" if diff else "all equal")
    return eager


class Ctx:
    """What every section shares: the device, the scratch folder, the budget."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.device = "cpu" if args.cpu_smoke else "cuda"
        self.cuda = self.device == "cuda" and torch.cuda.is_available()
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu_paths_"))
        self.deadline = Deadline(args.budget_s - 10)
        self.n = 6 if args.cpu_smoke else 40
        self.keep: list = []

    def llm(self, folder: Path, **kw):
        from twinserve.backends.real.llm import LLM

        common = dict(dtype="float32", block_size=BLOCK, max_model_len=256, max_num_seqs=8,
                      attention_backend="triton", device=self.device, engine_core_mode="inproc",
                      num_gpu_blocks_override=256)  # a fixed pool: engines of earlier sections hold memory
        if self.args.memory_utilization:  # size the pool from free memory instead (engines kept alive)
            common.pop("num_gpu_blocks_override")
            common["gpu_memory_utilization"] = self.args.memory_utilization
        common.update(kw)
        llm = LLM(str(folder), **common)
        if self.args.memory_utilization:
            self.keep.append(llm)  # engines stay alive: each later pool is sized next to the earlier ones
        return llm


def section_window_graphs(ctx: Ctx) -> None:
    """One sliding-window group (a Mistral): graphs are captured over the windowed kernel."""
    from tests.real.arch_helpers import make_arch_dir

    folder = make_arch_dir(ctx.tmp / "mistral", "MistralForCausalLM", window=WINDOW)
    llm = ctx.llm(folder)
    prompts = _prompts(6, seed=1, lo=20, hi=120)
    with_graphs = _graph_run("window_graphs", ctx, llm, "decode graphs captured with a sliding window",
                             f", window {WINDOW}, block {BLOCK}", prompts)
    eager = _eager_run("window_graphs", ctx, llm, prompts, with_graphs)
    _judge("window_graphs", "graphs", folder, prompts, with_graphs, ctx.args.regret_tol)
    _judge("window_graphs", "eager", folder, prompts, eager, ctx.args.regret_tol)


def section_groups(ctx: Ctx) -> None:
    """A Gemma 3 (5 sliding : 1 full layers): six KV groups over one pool, each with its own tables in
    the captured graphs; prefix hits in every group."""
    from tests.real.arch_helpers import make_arch_dir

    folder = make_arch_dir(ctx.tmp / "gemma3", "Gemma3ForCausalLM", gemma_layers=6, window=WINDOW)
    llm = ctx.llm(folder, enable_prefix_caching=True)
    groups = llm.llm_engine.worker.runner.kv_groups
    report("groups", "KV groups", "PASS" if len(groups) > 1 and any(g.window for g in groups) else "FAIL",
           f"{len(groups)} groups, windows {[g.window for g in groups]}")
    prompts = _prompts(6, seed=2, lo=10, hi=90, shared=3 * BLOCK + 5)
    first = _graph_run("groups", ctx, llm, "decode graphs captured over every group's tables", "", prompts)
    hits0 = llm.llm_engine.core.stats().prefix_hits
    again = _gen(llm, prompts, ctx.n)
    hits = llm.llm_engine.core.stats().prefix_hits - hits0
    report("groups", "prefix hits on the second pass", "PASS" if hits > 0 else "FAIL", f"{hits} hit tokens")
    _same("groups", "greedy tokens, prefix-cached pass vs first", again, first)
    eager = _eager_run("groups", ctx, llm, prompts, first)
    _judge("groups", "KV groups (graphs)", folder, prompts, first, ctx.args.regret_tol)
    _judge("groups", "KV groups (eager)", folder, prompts, eager, ctx.args.regret_tol)


def section_drafts(ctx: Ctx) -> None:
    """Speculative decoding on the device: a draft model (the target itself) and n-gram drafts."""
    from tests.real.conftest import make_tiny_model_dir

    folder = make_tiny_model_dir(ctx.tmp / "llama")
    prompts = _prompts(4, seed=3, lo=8, hi=40)
    prompts += [p * 3 for p in _prompts(2, seed=4, lo=6, hi=10)]  # repeats give n-gram drafts
    plain = ctx.llm(folder)
    want = _gen(plain, prompts, ctx.n)
    _judge("drafts", "plain", folder, prompts, want, ctx.args.regret_tol)
    del plain
    for label, spec in (("draft_model (the target)", {"method": "draft_model", "model": str(folder),
                                                      "num_speculative_tokens": 4}),
                        ("ngram", {"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_max": 4, "prompt_lookup_min": 1})):
        llm = ctx.llm(folder, speculative_config=spec)
        t0 = time.perf_counter()
        got = _gen(llm, prompts, ctx.n)
        s = llm.llm_engine.core.stats()
        rate = s.spec_num_accepted_tokens / max(s.spec_num_draft_tokens, 1)
        _same("drafts", f"{label}: greedy tokens vs no drafts", got, want)
        status = ("PASS" if rate > 0.99 else "FAIL") if label.startswith("draft_model") else \
            ("PASS" if s.spec_num_draft_tokens > 0 else "FAIL")  # a random model's n-grams rarely agree
        report("drafts", f"{label}: accepted drafts", status,
               f"{s.spec_num_accepted_tokens}/{s.spec_num_draft_tokens} ({rate:.0%}) in "
               f"{time.perf_counter() - t0:.1f}s")
        del llm


def section_tier(ctx: Ctx) -> None:
    """The host KV tier: round-robin sessions overflow a small device pool; evicted blocks come back."""
    from tests.real.conftest import make_tiny_model_dir
    from twinserve.core.sampling_params import SamplingParams

    folder = make_tiny_model_dir(ctx.tmp / "llama_tier")
    docs = _prompts(4, seed=5, lo=150, hi=151)
    common = dict(num_gpu_blocks_override=24, enable_prefix_caching=True)
    results = {}
    for label, kw in (("device only", {}), ("host tier", {"kv_offloading_size": 0.01})):
        llm = ctx.llm(folder, **common, **kw)
        ctxs, outs = [list(d) for d in docs], []
        sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        for turn in range(3):
            for s, c in enumerate(ctxs):
                c += _prompts(1, seed=100 * turn + s, lo=8, hi=9)[0]
                ids = list(llm.generate([{"prompt_token_ids": list(c)}], sp, use_tqdm=False)[0].outputs[0].token_ids)
                outs.append(ids)
                c += ids
        st = llm.llm_engine.core.stats()
        results[label] = (outs, st)
        if kw:
            tier = llm.llm_engine.worker.runner.host_kv
            pinned = tier is not None and all(t.is_pinned() for t in tier.host_tensors) if ctx.cuda else None
            report("tier", "host-tier hits and copies",
                   "PASS" if st.external_hits > 0 and st.offload_bytes_loaded > 0 else "FAIL",
                   f"{st.external_hits} hit tokens of {st.external_queries} looked up; stored "
                   f"{st.offload_bytes_stored / 1e6:.2f} MB, loaded {st.offload_bytes_loaded / 1e6:.2f} MB; "
                   f"host tensors pinned: {pinned}")
        del llm
    _same("tier", "greedy tokens, tier vs device only", results["host tier"][0], results["device only"][0])


SECTIONS = {"window_graphs": section_window_graphs, "groups": section_groups, "drafts": section_drafts,
            "tier": section_tier}


def main(argv: list[str] | None = None) -> int:
    """Entry point; 0 when every check passes, 1 on a failure, 2 without CUDA (unless --cpu-smoke)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {sorted(SECTIONS)}")
    p.add_argument("--budget-s", type=float, default=150.0, help="wall-clock budget; sections past it are skipped")
    p.add_argument("--regret-tol", type=float, default=0.25, help="worst teacher-forced regret passed (std)")
    p.add_argument("--memory-utilization", type=float, default=None,
                   help="size each engine's KV pool from free memory at this share instead of a fixed pool")
    p.add_argument("--cpu-smoke", action="store_true", help="run on CPU under the Triton interpreter "
                   "with few tokens: checks this script, not the GPU")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_paths: CUDA is not available; use --cpu-smoke to exercise the script", file=sys.stderr)
        return 2
    ensure_twinserve_importable()
    sys.path.append(str(REPO_ROOT))  # tests.real.arch_helpers, after the mapped twinserve package
    ctx = Ctx(args)
    for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
        if name not in SECTIONS:
            report(name, "section", "ERROR", f"unknown section; choose from {sorted(SECTIONS)}")
        elif ctx.deadline.left() < 10:
            report(name, "section", "SKIP", "out of time budget")
        else:
            run_section(name, lambda n=name: SECTIONS[n](ctx))
            gc.collect()  # the section's engines go before the next one sizes its pool
            if ctx.cuda:
                torch.cuda.empty_cache()
    print_table()
    return 1 if any(r[2] in ("FAIL", "ERROR") for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
