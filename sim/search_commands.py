"""The commands that deploy a search's pick and check it: `vllm serve`, `twinserve serve` and
`vllm bench serve`, built only from the flags listed here.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import twinserve.backends.sim as backends_sim

from twinserve.sim.config import StudyConfig, replica_config

# The only vLLM flags this module writes. Source: vLLM's engine arguments
# (https://docs.vllm.ai/en/latest/models/engine_args.html, `vllm serve --help`) and
# `vllm bench serve` (https://docs.vllm.ai/en/latest/cli/bench/serve/).
VLLM_SERVE_FLAGS = frozenset({
    "--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
    "--quantization", "--kv-cache-dtype", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--dtype",
})
VLLM_BENCH_FLAGS = frozenset({
    "--model", "--dataset-name", "--random-input-len", "--random-output-len", "--num-prompts",
    "--request-rate", "--max-concurrency", "--seed",
})
# `twinserve serve --help` (backends/real/serving/flags.py and the scheduler knobs).
TWINSERVE_SERVE_FLAGS = frozenset({
    "--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
    "--quantization", "--enable-prefix-caching", "--no-enable-prefix-caching", "--dtype",
})


# The catalog's table of shipped configs names each one's Hugging Face source (the repo id
# `vllm serve` downloads); a row reads "| NAME.json | https://huggingface.co/ORG/REPO/blob/...".
_CATALOG_TABLE = Path(backends_sim.__file__).parent / "models" / "README.md"
_HF_ROW = re.compile(r"^\|\s*([^|\s]+)\.json\s*\|\s*https://huggingface\.co/([^/\s]+/[^/\s]+)/blob/",
                     re.MULTILINE)


@functools.lru_cache(maxsize=1)
def _hf_ids() -> dict[str, str]:
    try:
        return {m.group(1).lower(): m.group(2) for m in _HF_ROW.finditer(_CATALOG_TABLE.read_text())}
    except OSError:
        return {}


def hf_model_id(name: str) -> str:
    """The Hugging Face repo id of a catalog model ('Llama-3.1-70B' -> 'meta-llama/Llama-3.1-70B'),
    else the name as given (a path or an id already)."""
    return _hf_ids().get(name.lower(), name)


def _join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _engine_flags(cfg: StudyConfig, allowed: frozenset[str]) -> list[str]:
    e, s = cfg.engine, cfg.scheduler
    argv = ["--tensor-parallel-size", str(e.tensor_parallel_size),
            "--max-num-seqs", str(s.max_num_seqs),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens),
            "--max-model-len", str(s.max_model_len),
            "--dtype", e.dtype]
    if e.quantization != "none":
        argv += ["--quantization", e.quantization]
    if e.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", e.kv_cache_dtype]
    argv.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    out: list[str] = []
    i = 0
    while i < len(argv):  # keep a flag (and its value) only where that server has it
        flag = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if flag in allowed:
            out += argv[i:i + 2] if has_value else [flag]
        i += 2 if has_value else 1
    return out


def commands(cfg: StudyConfig, row: dict[str, Any], isl: int, osl: int, rate: float,
             num_prompts: int) -> dict[str, str]:
    """The serve and bench commands for one configuration, checked at `rate` per replica (req/s,
    or clients when the search's axis is concurrency)."""
    one = replica_config(cfg, 0) if cfg.cluster.num_replicas == 1 else cfg
    model = hf_model_id(row["model"])
    bench = ["vllm", "bench", "serve", "--model", model, "--dataset-name", "random",
             "--random-input-len", str(isl), "--random-output-len", str(osl),
             "--num-prompts", str(num_prompts), "--seed", str(cfg.run.seed)]
    # Closed loop: N clients, as the search ran them; open loop: Poisson arrivals at the rate.
    bench += (["--max-concurrency", str(int(rate))] if cfg.search.axis == "concurrency"
              else ["--request-rate", f"{rate:.3g}"])
    return {"vllm_serve": _join(["vllm", "serve", model] + _engine_flags(one, VLLM_SERVE_FLAGS)),
            "twinserve_serve": _join(["twinserve", "serve", model]
                                     + _engine_flags(one, TWINSERVE_SERVE_FLAGS)),
            "vllm_bench_serve": _join(bench)}


def workload_lengths(cfg: StudyConfig) -> tuple[int, int]:
    """Mean prompt and output tokens of the study's workload (the bench's random lengths).

    The workload alone, as build() makes it (replica 0's view), memoized by what it is drawn
    from: the screen asked this of every search object (rechecks and seeds are new ones) and
    built each whole study for it, ~0.3 CPU s of the main process per FP8 8x H200 search."""
    from twinserve.sim.build import build_workload, resolve_trace

    c = replica_config(cfg, 0)
    key = (repr(c.workload), c.run.seed, c.scheduler.max_model_len,
           c.scheduler.enable_prefix_caching, resolve_trace(c),
           "workload.trace_time_unit" in c.explicit)
    hit = _LENGTHS.get(key)
    if hit is None:
        items = list(build_workload(c).items())
        hit = ((round(sum(i.num_prompt_tokens for i in items) / len(items)),
                round(sum(i.num_output_tokens for i in items) / len(items))) if items else (0, 0))
        if len(_LENGTHS) >= 256:
            _LENGTHS.clear()
        _LENGTHS[key] = hit
    return hit


# workload_lengths' answers by what the workload is drawn from (a few per search).
_LENGTHS: dict[tuple[Any, ...], tuple[int, int]] = {}