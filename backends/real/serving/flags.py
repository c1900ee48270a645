"""Command-line flags of `twinserve serve` and `twinserve bench` (argparse only: cheap to import)."""

from __future__ import annotations

import argparse


DEFAULT_MODEL = "smollm2"
MODEL_HELP = "the model: an HF folder, a .gguf file or a short name"


def add_model_arg(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    """--model, as every command that loads a model takes it (serve also takes it first, as vLLM)."""
    if positional:
        parser.add_argument("model_arg", nargs="?", default=None, metavar="model",
                            help=f"{MODEL_HELP} (as --model; default {DEFAULT_MODEL})")
    parser.add_argument("--model", default=None, help=f"{MODEL_HELP} (default {DEFAULT_MODEL})")


def model_of(ns: argparse.Namespace) -> str:
    """The model the command line names (positional or --model), set back on ns.model."""
    pos, flag = getattr(ns, "model_arg", None), getattr(ns, "model", None)
    if pos is not None and flag is not None and pos != flag:
        from twinserve.core.errors import InvalidConfigError

        raise InvalidConfigError("model", f"{pos} and --model {flag}", "one model, given once")
    ns.model = pos or flag or DEFAULT_MODEL
    return ns.model


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Flags of `twinserve serve` beyond the engine's (which the caller adds, named as vLLM names them)."""
    add_model_arg(p, positional=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>' on /v1 routes")
    p.add_argument("--served-model-name", action="append", default=None,
                   help="name(s) clients use for the model (default: the model argument)")
    p.add_argument("--max-queued-requests", type=int, default=1024,
                   help="requests waiting beyond this are refused with 429 (0 = no bound)")
    p.add_argument("--shutdown-grace", type=float, default=5.0,
                   help="seconds in-flight requests may run after SIGINT/SIGTERM before they are aborted")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--uvicorn-log-level", default="warning", help="uvicorn's log level")
    p.add_argument("--disable-access-log", "--disable-uvicorn-access-log", dest="disable_access_log",
                   action="store_true", help="no per-request access-log line (on by default)")
    p.add_argument("--max-request-body-bytes", type=int, default=32 * 1024 * 1024,
                   help="request bodies above this are refused with 413 (default 32 MiB)")
    p.add_argument("--max-n", type=int, default=128, help="largest n (parallel samples) a request may ask for")
    p.add_argument("--metrics-prefix", default="twinserve", choices=["twinserve", "vllm"],
                   help="Prometheus name prefix on /metrics: 'vllm' makes vLLM's Grafana dashboards match")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, as a file path or inline, replacing the tokenizer's")
    # vLLM flags that change nothing here: accepted so vLLM command lines run, each noted in the log.
    p.add_argument("--disable-log-requests", action="store_true",
                   help="accepted for vLLM compatibility (request bodies are never logged)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM compatibility (no model code is ever downloaded or run)")
    p.add_argument("--generation-config", default=None,
                   help="accepted for vLLM compatibility (the model's generation_config.json defaults are "
                        "not applied: requests use OpenAI's defaults)")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """Flags of `twinserve bench`, named as `vllm bench serve` names them where it has one."""
    p.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1", help="server address (with --port, when no --base-url)")
    p.add_argument("--port", type=int, default=8000, help="server port")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions"],
                   help="the API route requests go to")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer <key>'")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of inter-arrival times: 1 = Poisson, < 1 burstier, > 1 steadier")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most; with --request-rate inf (the default): N "
                        "closed-loop clients, each sending when its last request finished")
    p.add_argument("--think-time-s", type=float, default=0.0,
                   help="closed loop: seconds a client waits after a reply before its next request")
    p.add_argument("--warmup-requests", "--warmup-request-count", dest="warmup_requests", type=int,
                   default=0, help="closed loop: requests sent first and left out of the figures "
                   "(the simulator's [workload] warmup_requests)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths and token ids")
    p.add_argument("--dataset-name", default="random", choices=["random", "shared-prefix", "trace"],
                   help="where prompts and lengths come from")
    p.add_argument("--random-input-len", type=int, default=128, help="prompt tokens (random, shared-prefix)")
    p.add_argument("--random-output-len", type=int, default=64, help="output tokens (random, shared-prefix)")
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]; 0 = fixed")
    p.add_argument("--num-system-prompts", type=int, default=4, help="shared-prefix: distinct prefixes")
    p.add_argument("--system-prompt-len", type=int, default=64, help="shared-prefix: tokens per prefix")
    p.add_argument("--system-prompt-zipf", type=float, default=0.0,
                   help="shared-prefix: popularity, weight of prefix i is 1/(i+1)^zipf (0 = even)")
    p.add_argument("--trace", default="builtin:azure_conv", help="trace: CSV path or builtin:azure_conv")
    p.add_argument("--trace-arrivals", action="store_true",
                   help="trace: replay its timestamps instead of --request-rate")
    p.add_argument("--trace-time-scale", type=float, default=1.0,
                   help="trace: timestamps are multiplied by this")
    p.add_argument("--trace-time-unit", choices=["s", "ms", "us"], default=None,
                   help="trace: unit of its arrived_at column (default s, and arrivals slower than "
                        "1 request/min are refused as a likely ms column)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="clip workload lengths to this (default: the server's)")
    p.add_argument("--vocab-size", type=int, default=None, help="prompt token ids are drawn below this "
                   "(default: the server's, from /v1/models)")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly the workload's output length (default on)")
    p.add_argument("--goodput", nargs="*", default=[], metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:2000 tpot:100 (ms; default the simulator's)")
    p.add_argument("--result-dir", default=None,
                   help="write requests.csv (the simulator's per-request schema) and summary.json here")
    p.add_argument("--label", default=None, help="a name for this run in the summary")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request fails")
