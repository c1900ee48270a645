"""From knob declarations (core/knobs.py): command-line flags and Markdown tables.

The TOML side (coercion with file:line:field errors) calls core.knobs.check_value from the
loader (sim/config.py), so a flag, a TOML field and `LLM(x=...)` give the same message.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Iterable, Mapping

from twinserve.core.errors import InvalidConfigError
from twinserve.core.knobs import allowed_text, check_value, kind_of, knob_of


class _KnobType:
    """argparse `type=`: text -> checked value, or the knob's own message naming the flag."""

    def __init__(self, f: dataclasses.Field, flag: str) -> None:
        self.f = f
        self.flag = flag
        self.__name__ = kind_of(f)[0]  # argparse names the type in some messages

    def __call__(self, text: str) -> Any:
        try:
            return check_value(self.f.name, text, self.f, where=f"flag {self.flag}", from_text=True)
        except InvalidConfigError as e:  # KnobError, or a parse error (e.g. JSON)
            raise argparse.ArgumentTypeError(str(e)) from None


def default_of(f: dataclasses.Field) -> Any:
    """The field's default (its factory called), or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def flag_name(name: str) -> str:
    """--long-name for a field name."""
    return "--" + name.replace("_", "-")


def flag_help(f: dataclasses.Field, default: Any) -> str:
    """The --help line: what it is, what it takes, its default."""
    k = knob_of(f)
    assert k is not None
    kind, optional = kind_of(f)
    text = f"{k.help}; {allowed_text(k, kind, optional)}"
    if kind != "bool":
        text += f" (default: {'none' if default is None else default})"
    return text.replace("%", "%%")


def add_knob_flags(parser: Any, cls: type, *, skip: Iterable[str] = (),
                   defaults: Mapping[str, Any] | None = None) -> list[str]:
    """Add one flag per knob field of cls (bools as --x/--no-x); returns the dests added."""
    skipped = set(skip)
    added = []
    for f in dataclasses.fields(cls):
        k = knob_of(f)
        if k is None or not k.flag or f.name in skipped:
            continue
        default = (defaults or {}).get(f.name, default_of(f))
        flag = flag_name(f.name)
        kind, _ = kind_of(f)
        if kind == "bool":
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=default, help=flag_help(f, default))
        else:
            choices = k.choice_list()
            metavar = "{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper()
            parser.add_argument(flag, dest=f.name, type=_KnobType(f, flag), default=default,
                                metavar=metavar, help=flag_help(f, default))
        added.append(f.name)
    return added


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def knob_table(cls: type, skip: Iterable[str] = ()) -> str:
    """A Markdown table of cls's knob fields: name, default, what it takes, meaning."""
    skipped = set(skip)
    rows = ["| knob | default | takes | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        k = knob_of(f)
        if k is None or f.name in skipped:
            continue
        kind, optional = kind_of(f)
        default = default_of(f)
        shown = "none" if default is None else (repr(default) if isinstance(default, str) else str(default))
        rows.append(f"| `{f.name}` | `{_cell(shown)}` | {_cell(allowed_text(k, kind, optional))} | {_cell(k.help)} |")
    return "\n".join(rows) + "\n"
