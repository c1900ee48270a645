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
