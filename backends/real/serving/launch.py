"""`twinserve serve`: flags, engine construction, and uvicorn with a graceful shutdown."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import uvicorn

from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.serving.access_log import configure_access_logger
from twinserve.backends.real.serving.server import ServerConfig, build_app

logger = logging.getLogger("twinserve.serve")

# Where `serve` runs the engine core unless --engine-core-mode says otherwise (measured with
# experiments/bench_serving.py --engine-core-modes inproc process; see README).
# On the 2-core CPU machine (SmolLM2 fp32, 128 in / 64 out) the core's own process gave 1.18x
# the tokens/s at concurrency 1 and 0.97x at 8, TTFT 0.93x / 1.00x, within this VM's noise: the
# simpler in-process layout stays the default. Where the front end's work grows (many streams,
# long detokenization) or a GPU makes steps short, `--engine-core-mode process` takes it off the
# core's GIL.
SERVE_ENGINE_CORE_MODE = "inproc"


class GracefulServer(uvicorn.Server):
    """uvicorn that, on shutdown, lets in-flight requests run `grace_s` more seconds, then aborts them.

    Aborted requests end with finish_reason "abort" (streams still get their final chunk and
    [DONE]), so every connection closes by itself and nothing hangs.
    """

    def __init__(self, config: uvicorn.Config, grace_s: float) -> None:
        super().__init__(config)
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting, drain for grace_s, abort the rest, then run the app's shutdown."""
        serving = getattr(getattr(self.config.app, "state", None), "serving", None)
        handle = None
        if serving is not None:
            n = serving.async_engine.num_unfinished
            if n:
                logger.info("shutting down: %d requests in flight get %.1f s to finish, then are aborted",
                            n, self.grace_s)
            handle = asyncio.get_running_loop().call_later(self.grace_s, serving.async_engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            if handle is not None:
                handle.cancel()


# vLLM flags accepted with no effect here, and why (logged when given).
_NOTED_FLAGS = {
    "disable_log_requests": "--disable-log-requests: twinserve never logs request bodies; nothing to turn off",
    "trust_remote_code": "--trust-remote-code: twinserve runs its own model classes and never runs code "
                         "shipped with a model; ignored",
    "generation_config": "--generation-config: the model's generation_config.json defaults are not applied; "
                         "requests use OpenAI's defaults (set temperature etc. per request)",
}


def note_ignored_flags(ns: argparse.Namespace) -> list[str]:
    """Log one line per vLLM flag given that changes nothing here; the lines logged."""
    lines = [note for name, note in _NOTED_FLAGS.items() if getattr(ns, name, None) not in (None, False)]
    for line in lines:
        logger.warning("accepted for vLLM compatibility: %s", line)
    return lines


def load_chat_template(value: str | None) -> str | None:
    """--chat-template as Jinja text: a file's contents, or the value itself when it is a template."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if len(value) < 4096 and "\n" not in value and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidConfigError("chat_template", value, f"a readable UTF-8 file ({e})") from None
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise InvalidConfigError("chat_template", value, "a Jinja template file that exists, or an inline "
                                 "template (with {{ ... }} or {% ... %})")
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise InvalidConfigError("chat_template", value, f"a valid Jinja template (line {e.lineno}: "
                                 f"{e.message})") from None
    return text


def serve(ns: argparse.Namespace, engine_args: Any) -> int:
    """Load the model, start the server and block until it is stopped (SIGINT/SIGTERM)."""
    import torch

    chat_template = load_chat_template(getattr(ns, "chat_template", None))  # before the model loads
    note_ignored_flags(ns)

    from twinserve.backends.real.engine import LLMEngine

    if ns.threads:
        torch.set_num_threads(ns.threads)
    engine = LLMEngine(engine_args, default_core_mode=SERVE_ENGINE_CORE_MODE)
    names = ns.served_model_name or [ns.model]
    access_log = not getattr(ns, "disable_access_log", False)
    config = ServerConfig(names, ns.api_key, ns.max_queued_requests or None,
                          extra_model_names=[engine.model_name], access_log=access_log,
                          metrics_prefix=getattr(ns, "metrics_prefix", "twinserve"),
                          max_request_body_bytes=getattr(ns, "max_request_body_bytes", 32 * 1024 * 1024),
                          max_n=getattr(ns, "max_n", 128), chat_template=chat_template)
    configure_access_logger(access_log)
    app = build_app(engine, config)
    ucfg = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.uvicorn_log_level,
                          timeout_graceful_shutdown=int(ns.shutdown_grace) + 5, access_log=False)
    print(f"twinserve serve: {names[0]} on http://{ns.host}:{ns.port} "
          f"(torch threads {torch.get_num_threads()}, {engine.scheduler_config.num_blocks} KV blocks of "
          f"{engine.scheduler_config.block_size}, max_model_len {engine.max_model_len})", flush=True)
    GracefulServer(ucfg, ns.shutdown_grace).run()
    return 0
