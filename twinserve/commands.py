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


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool) -> None:
    flag = "--" + name.replace("_", "-")
    parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=default)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """vLLM-named engine flags (--max-num-seqs, --block-size, ...), generated from EngineArgs.

    EngineArgs takes every scheduler knob from the core's SchedulerConfig, and the knobs that
    name a policy offer the core's registries as choices (SCHEDULER_CHOICES).
    """
    from twinserve.backends.real.config import EngineArgs
    from twinserve.core.sched.config import SCHEDULER_CHOICES

    defaults = EngineArgs()
    for f in fields(EngineArgs):
        if f.name == "model":
            continue
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            _bool_flag(parser, f.name, default)
            continue
        kind = {int: int, float: float}.get(type(default), str)
        if "int" in str(f.type) and default is None:
            kind = int
        elif "float" in str(f.type) and default is None:
            kind = float
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=default,
                            choices=SCHEDULER_CHOICES.get(f.name))


def engine_args_from(ns: argparse.Namespace, model: str) -> Any:
    """EngineArgs from parsed flags."""
    from twinserve.backends.real.config import EngineArgs

    return EngineArgs(model=model, **{f.name: getattr(ns, f.name) for f in fields(EngineArgs)
                                      if f.name != "model" and hasattr(ns, f.name)})


