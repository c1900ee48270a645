"""Knobs describe themselves: every flag of every command has help, every setting is declared with its
knob, and docs/knobs.md is the table generated from those declarations."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from twinserve.backends.real.config import EngineArgs
from twinserve.cli import build_parser
from twinserve.core.knobs import knob_of
from twinserve.core.routing import ROUTERS, RouterConfig
from twinserve.core.spec_decode import SpeculativeConfig
from twinserve.knob_docs import knobs_markdown
from twinserve.sim.cli import build_parser as simulate_parser
from twinserve.sim.config import SECTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"
COMMANDS = ("serve", "generate", "calibrate", "fidelity", "route", "bench")


def bare_flags(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """'command --flag' for every argument of parser and its subcommands that has no help text."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += bare_flags(sub, f"{path} {name}")
        elif not action.help:
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_flag_of_every_command_has_help() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COMMANDS) <= set(subs.choices)
    assert bare_flags(parser, "twinserve") + bare_flags(simulate_parser(), "simulate") == []


def test_a_flag_without_help_is_found() -> None:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--fine", help="has some")
    sub = p.add_subparsers().add_parser("go", help="a command")
    sub.add_argument("--bare")
    assert bare_flags(p, "x") == ["x go --bare"]


@pytest.mark.parametrize("cls", [EngineArgs, RouterConfig, SpeculativeConfig, *SECTIONS.values(),
                                 *(e.options for e in ROUTERS.values() if e.options is not None)],
                         ids=lambda c: c.__name__)
def test_every_setting_is_declared_with_its_knob(cls: type) -> None:
    undeclared = [f.name for f in dataclasses.fields(cls) if knob_of(f) is None]
    assert undeclared == ([] if cls is not RouterConfig else ["options"])  # options: each router's own
    assert all(knob_of(f).help for f in dataclasses.fields(cls) if knob_of(f) is not None)


def test_docs_knobs_md_is_the_generated_table() -> None:
    assert DOC.read_text() == knobs_markdown(), \
        "regenerate: python -m twinserve.knob_docs > docs/knobs.md"


@pytest.mark.parametrize("argv", [["serve"], ["generate", "hi"], ["calibrate", "--out", "o"],
                                  ["fidelity", "--out", "o"]])
def test_every_command_that_loads_a_model_takes_it_as_model(argv: list[str]) -> None:
    from twinserve.backends.real.serving.flags import DEFAULT_MODEL, model_of

    assert model_of(build_parser().parse_args(argv + ["--model", "m"])) == "m"
    assert model_of(build_parser().parse_args(argv)) == DEFAULT_MODEL


def test_serve_also_takes_the_model_first_as_vllm_does_but_only_once() -> None:
    from twinserve.backends.real.serving.flags import model_of
    from twinserve.core.errors import InvalidConfigError

    assert model_of(build_parser().parse_args(["serve", "m"])) == "m"
    assert model_of(build_parser().parse_args(["serve", "m", "--model", "m"])) == "m"
    with pytest.raises(InvalidConfigError, match="model"):
        model_of(build_parser().parse_args(["serve", "a", "--model", "b"]))
