"""A stopped server's engine must be collectable: the suite starts hundreds (issue 53 item 16)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from .conftest import start_server


def test_a_stopped_server_leaves_no_engine_alive(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir)
    assert s.client().models.list().data  # the routes have been classified by FastAPI
    ref = weakref.ref(s.engine)
    s.stop()
    del s
    gc.collect()
    held = ref()
    assert held is None, f"the engine of a stopped server is still referenced by {len(gc.get_referrers(held))} objects"


def test_a_stopped_server_that_served_requests_leaves_nothing_alive(tiny_model_dir: Path, core_mode: str) -> None:
    """After streamed and logprob requests, in either core mode: engine, core client, worker and model go."""
    s = start_server(tiny_model_dir, engine_core_mode=core_mode)
    client = s.client()
    model = client.models.list().data[0].id
    list(client.completions.create(model=model, prompt="hello there", max_tokens=4, stream=True))
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                   logprobs=True, top_logprobs=2)
    client.close()
    engine = s.engine
    refs = {"engine": weakref.ref(engine), "core": weakref.ref(engine.core)}
    if engine.worker is not None:  # in-process worker: its runner and model too
        refs.update(worker=weakref.ref(engine.worker), runner=weakref.ref(engine.worker.runner),
                    model=weakref.ref(engine.worker.runner.model))
    del engine
    s.stop()
    del s
    gc.collect()
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert not alive, f"still referenced after the server stopped: {alive}"
