"""Builds the engine core and its executor: the same code in this process or in the core's own."""

from __future__ import annotations

import dataclasses
from typing import Any

from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.config import EngineArgs
from twinserve.core.kv.model_kv import with_model_kv
from twinserve.backends.real.core_client import kv_group_windows, scheduler_config_for
from twinserve.backends.real.executor import InProcessExecutor
from twinserve.backends.real.models.architectures import CausalLM
from twinserve.backends.real.models.registry import ModelSource
from twinserve.backends.real.worker import Worker


def build_engine_core(args: EngineArgs, max_model_len: int, eos_ids: list[int],
                      model: CausalLM | None = None, source: ModelSource | None = None
                      ) -> tuple[EngineCore, Any, int]:
    """(EngineCore, executor, KV bytes per token): workers built, KV sized by the smallest one."""
    backend = args.resolve_executor_backend()
    if backend == "mp":
        if model is not None:
            raise InvalidConfigError("distributed_executor_backend", "mp",
                                     "'uni' for an engine built around an in-memory model")
        from twinserve.backends.real.mp_executor import MultiprocExecutor

        executor: Any = MultiprocExecutor(args, max_model_len, eos_ids, source)
        kv_bytes = executor.kv_bytes_per_token
    else:
        worker = Worker(args, max_model_len, eos_ids, model=model, source=source)
        executor = InProcessExecutor([worker])
        kv_bytes = worker.kv_bytes_per_token
    try:
        num_blocks = executor.initialize_kv_cache()
        sched = scheduler_config_for(args, max_model_len, num_blocks)
        cfg = model.config if model is not None else (worker.model.config if backend != "mp" else None)
        if cfg is None and source is not None:
            from twinserve.backends.real.models.loader import peek_model_config

            cfg = peek_model_config(source)
        sched = with_model_kv(sched, kv_group_windows(cfg))
        num_host, host_page = executor.host_tier() if args.kv_offloading_size else (0, 0)
        if num_host:
            sched = dataclasses.replace(sched, kv_offloading_blocks=num_host)
        core = EngineCore(sched, executor, speculative_config=args.speculative_config)
        core.host_page_bytes = host_page  # bytes moved per block, for the metrics
    except BaseException:
        executor.shutdown()
        raise
    return core, executor, kv_bytes
