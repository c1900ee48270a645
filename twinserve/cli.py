"""The `twinserve` command: the engine's subcommands, plus those the twin registers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from twinserve.backends.real.serving.flags import add_model_arg
from twinserve.commands import _SUBCOMMANDS, add_engine_args, engine_args_from, subcommand
from twinserve.twin import cli as _twin_cli  # noqa: F401  (registers calibrate, fidelity)


@subcommand("generate", "generate text for one or more prompts with the real engine")
def _generate_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    add_model_arg(p)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap each prompt as a user message through the chat template")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt at most")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this much probability mass")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    p.add_argument("--sampling-seed", type=int, default=None, help="seed of sampling (default: none)")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_engine_args(p)
    p.set_defaults(func=_generate)


def _generate(ns: argparse.Namespace) -> int:
    import torch

    from twinserve.backends.real.llm import LLM
    from twinserve.core.sampling_params import SamplingParams

    if ns.threads:
        torch.set_num_threads(ns.threads)
    from twinserve.backends.real.engine import LLMEngine

    llm = LLM.from_engine(LLMEngine(engine_args_from(ns)))
    sp = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p,
                        top_k=ns.top_k, seed=ns.sampling_seed, stop=ns.stop)
    if ns.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in ns.prompts], sp, use_tqdm=False)
    else:
        outs = llm.generate(ns.prompts, sp, use_tqdm=False)
    for prompt, out in zip(ns.prompts, outs):
        c = out.outputs[0]
        if ns.json:
            m = out.metrics
            print(json.dumps({"prompt": prompt, "text": c.text, "token_ids": c.token_ids,
                              "finish_reason": c.finish_reason,
                              "ttft_s": m.ttft if m else None, "e2e_s": m.e2e_latency if m else None}))
        else:
            print(c.text)
    llm.llm_engine.shutdown()
    return 0


@subcommand("serve", "serve a model over an OpenAI-compatible HTTP API")
def _serve_parser(p: argparse.ArgumentParser) -> None:
    from twinserve.backends.real.serving.flags import add_serve_args

    add_serve_args(p)
    add_engine_args(p)
    p.set_defaults(func=_serve)


def _serve(ns: argparse.Namespace) -> int:
    from twinserve.backends.real.serving.launch import serve

    args = engine_args_from(ns)  # sets ns.model from the positional or --model
    return serve(ns, args)


@subcommand("bench", "benchmark a running server over HTTP (like `vllm bench serve`)")
def _bench_parser(p: argparse.ArgumentParser) -> None:
    from twinserve.backends.real.serving.flags import add_bench_args

    add_bench_args(p)
    p.set_defaults(func=_bench)


def _bench(ns: argparse.Namespace) -> int:
    from twinserve.bench.cli import run_bench

    return run_bench(ns)


@subcommand("route", "an OpenAI-compatible proxy routing over several `twinserve serve` replicas")
def _route_parser(p: argparse.ArgumentParser) -> None:
    from twinserve.core.knob_gen import add_knob_flags
    from twinserve.core.routing import ROUTERS, RouterConfig

    p.add_argument("--replica", action="append", required=True, metavar="URL",
                   help="base URL of a replica, e.g. http://127.0.0.1:8001 (repeatable)")
    add_knob_flags(p, RouterConfig)
    # Before --router was named as the study names it; --policy is the queue order in `serve`.
    p.add_argument("--policy", dest="router", type=_deprecated("--policy", "--router"), default=argparse.SUPPRESS,
                   help="deprecated alias of --router")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--prefix-chunk-chars", type=int, default=64,
                   help="prefix_affinity: characters per prefix chunk (the proxy has no tokenizer; about "
                        "16 tokens)")
    for entry in dict.fromkeys(e.options for e in ROUTERS.values() if e.options is not None):
        # A router's options; in the proxy a prefix block is one chunk of --prefix-chunk-chars.
        add_knob_flags(p, entry, skip=("prefix_blocks",))
    prefix = ROUTERS["prefix_affinity"].options.__dataclass_fields__["prefix_blocks"]
    p.add_argument("--prefix-chunks", "--prefix-blocks", dest="prefix_blocks", type=int, metavar="N",
                   default=prefix.default,
                   help="prefix_affinity: leading chunks of --prefix-chunk-chars characters that name a "
                        f"prompt's prefix (default: {prefix.default}; --prefix-blocks is its old name)")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between health checks")
    p.add_argument("--max-request-body-bytes", type=int, default=32 * 1024 * 1024,
                   help="bodies above this are refused with 413 before they are forwarded (as serve's)")
    p.add_argument("--uvicorn-log-level", default="info", help="uvicorn's log level")
    p.set_defaults(func=_route)


def _deprecated(old: str, new: str) -> Any:
    """argparse type= that warns once that `old` is now `new`."""
    def convert(text: str) -> str:
        print(f"twinserve route: warning: {old} is deprecated; use {new}", file=sys.stderr)
        return text
    return convert


def _route(ns: argparse.Namespace) -> int:
    from twinserve.backends.real.serving.route_proxy import ProxyConfig, run_proxy
    from twinserve.core.routing import RouterConfig, router_option_fields

    router = RouterConfig(ns.router, {name: getattr(ns, name) for name in router_option_fields()
                                      if hasattr(ns, name)})
    router.build()  # an unknown name or a bad option fails here, before the server starts
    cfg = ProxyConfig(ns.replica, router, ns.prefix_chunk_chars, ns.health_interval,
                      max_request_body_bytes=ns.max_request_body_bytes)
    return run_proxy(cfg, ns.host, ns.port, ns.uvicorn_log_level)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="twinserve", description="twinserve: LLM serving engine")
    subs = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure) in _SUBCOMMANDS.items():
        configure(subs.add_parser(name, help=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `twinserve` console script."""
    from twinserve.core.errors import TwinserveError

    ns = build_parser().parse_args(argv)
    try:
        return int(ns.func(ns) or 0)
    except TwinserveError as e:
        print(f"twinserve {ns.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
