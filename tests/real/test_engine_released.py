"""A dropped LLM frees its weights at once, without waiting for a full garbage collection.

A cycle (the worker's runner held a bound method of the worker) kept every dropped engine's model
until CPython's next full collection, which large tensors never trigger: tests/real/test_smollm2.py
reached 8.3 GB of RSS with nine SmolLM2 engines alive (issue 53 item 16).
"""

from __future__ import annotations

import gc
import weakref

from twinserve.backends.real import SamplingParams


def test_a_dropped_llm_frees_worker_and_model_without_a_collection(make_llm) -> None:
    llm = make_llm()
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3), use_tqdm=False)
    worker = llm.llm_engine.worker
    refs = [weakref.ref(o) for o in (llm.llm_engine, worker, worker.runner, worker.model)]
    del llm, worker
    gc.disable()  # only reference counting may free them
    try:
        alive = [type(r()).__name__ for r in refs if r() is not None]
    finally:
        gc.enable()
    assert not alive, f"still alive without a collection: {alive}"
