"""The registry of `twinserve` subcommands and the engine flags they share.

A module adds a subcommand with `@subcommand("name", "help")` on a function that configures its
parser; `twinserve.cli` imports those modules and builds the parser from the registry.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, Callable

_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def subcommand(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]],
                                                  Callable[[argparse.ArgumentParser], None]]:
    """Register a function that configures the parser of subcommand `name`."""
    def register(fn: Callable[[argparse.ArgumentParser], None]) -> Callable[[argparse.ArgumentParser], None]:
        _SUBCOMMANDS[name] = (help, fn)
        return fn
    return register


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """vLLM-named engine flags (--max-num-seqs, --block-size, ...), generated from EngineArgs' knobs.

    EngineArgs takes every scheduler knob from the core's SchedulerConfig; each flag's help, range
    and choices come from the field's declaration (core/knobs.py).
    """
    from twinserve.backends.real.config import EngineArgs
    from twinserve.core.knob_gen import add_knob_flags

    add_knob_flags(parser.add_argument_group("engine"), EngineArgs)


def engine_args_from(ns: argparse.Namespace, model: str | None = None) -> Any:
    """EngineArgs from parsed flags (the model from the command line unless given)."""
    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.serving.flags import model_of

    model = model_of(ns) if model is None else model
    return EngineArgs(model=model, **{f.name: getattr(ns, f.name) for f in fields(EngineArgs)
                                      if f.name != "model" and hasattr(ns, f.name)})



