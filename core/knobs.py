"""Knobs that describe themselves: a dataclass field with its help, unit, range and choices beside it.

    watermark: float = knob(0.0, help="fraction of blocks kept free after an admission",
                            range=(0.0, 1.0), open="hi")

`knob(...)` returns a dataclasses.field whose metadata holds a Knob. `check_value` holds a value
to it and raises KnobError, which names the field, what is allowed and where the value came from
(a flag, a file and line, or `LLM(x=...)`). The flags, the TOML checks and the docs tables are
generated from the same Knob (core/knob_gen.py). Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Iterable, Mapping

from twinserve.core.errors import InvalidConfigError, short_repr

KNOB = "knob"  # the metadata key
SCALARS = ("bool", "int", "float", "str")


class KnobError(InvalidConfigError):
    """A knob's value is out of its range or not among its choices; names where it came from."""

    def __init__(self, field: str, value: object, allowed: str, where: str | None = None) -> None:
        super().__init__(field, value, allowed)
        self.allowed = allowed
        self.where = where
        prefix = f"{where}: " if where else ""
        self._keep_args(f"{prefix}config {field}={short_repr(value)} is invalid: allowed {allowed}",
                        field, value, allowed, where)


@dataclass(frozen=True, slots=True)
class Knob:
    """What a field means and which values it takes."""

    help: str
    unit: str = ""
    # (lo, hi), either None for no bound; `open` says which ends are excluded: "", "lo", "hi", "both".
    range: tuple[float | None, float | None] | None = None
    open: str = ""
    # Allowed values (a tuple, or a function returning one, so a registry can grow after import).
    choices: tuple[Any, ...] | Callable[[], Iterable[Any]] | None = None
    # Values allowed outside range/choices, with what they mean: {0: "none", -1: "the catalog's"}.
    special: Mapping[Any, str] = dataclasses.field(default_factory=dict)
    # Also allowed when this returns True (e.g. a hash function given as a callable in code).
    accepts: Callable[[Any], bool] | None = None
    # False: settable in code and TOML but not offered as a command-line flag.
    flag: bool = True
    # Text -> value for a kind that is not a scalar (e.g. JSON into a config object).
    parse: Callable[[str], Any] | None = None

    def choice_list(self) -> tuple[Any, ...] | None:
        """The choices, resolved now."""
        c = self.choices
        return tuple(c()) if callable(c) else c


def json_object(name: str, spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """A setting given as a dict or its JSON text (vLLM's JSON flags), as a dict; else a named error."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise InvalidConfigError(name, spec, f"a JSON object ({e.msg})") from None
    if not isinstance(spec, Mapping):
        raise InvalidConfigError(name, spec, "a JSON object / dict")
    return dict(spec)


def knob(default: Any = MISSING, *, help: str, unit: str = "",
         range: tuple[float | None, float | None] | None = None, open: str = "",
         choices: tuple[Any, ...] | Callable[[], Iterable[Any]] | None = None,
         special: Mapping[Any, str] | None = None, accepts: Callable[[Any], bool] | None = None,
         flag: bool = True, parse: Callable[[str], Any] | None = None, default_factory: Any = MISSING, kw_only: Any = MISSING) -> Any:
    """A dataclasses.field carrying its Knob (help, unit, range or choices) in its metadata."""
    if open not in ("", "lo", "hi", "both"):
        raise ValueError(f"knob open={open!r}: one of '', 'lo', 'hi', 'both'")
    meta = {KNOB: Knob(help, unit, range, open, choices, dict(special or {}), accepts, flag, parse)}
    kwargs: dict[str, Any] = {"metadata": meta}
    if default_factory is not MISSING:
        kwargs["default_factory"] = default_factory
    else:
        kwargs["default"] = default
    if kw_only is not MISSING:
        kwargs["kw_only"] = kw_only
    return dataclasses.field(**kwargs)


def knob_of(f: dataclasses.Field) -> Knob | None:
    """The field's Knob, or None for a field declared without one."""
    return f.metadata.get(KNOB)


def kind_of(f: dataclasses.Field) -> tuple[str, bool]:
    """(base type name, optional) from the annotation: 'int | None' -> ('int', True)."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in t.split("|")]
    optional = "None" in parts
    base = [p for p in parts if p != "None"]
    return (base[0] if base else "None"), optional


def _num(x: float) -> str:
    if isinstance(x, int) or (x.is_integer() and abs(x) < 1e6):
        return str(int(x))
    return f"{x:g}"


def allowed_text(k: Knob, kind: str, optional: bool = False) -> str:
    """What the knob takes, in words: 'an integer in [1, 2147483647] (tokens)', 'one of a, b'."""
    choices = k.choice_list()
    item = kind.startswith("tuple")
    base = "int" if item else kind
    if choices is not None:
        text = "one of " + ", ".join(repr(c) if isinstance(c, str) else str(c) for c in choices)
    elif base == "bool":
        text = "true or false"
    elif base in ("int", "float"):
        noun = "an integer" if base == "int" else "a number"
        lo, hi = k.range or (None, None)
        if lo is not None and hi is not None:
            text = (f"{noun} in {'(' if k.open in ('lo', 'both') else '['}{_num(lo)}, "
                    f"{_num(hi)}{')' if k.open in ('hi', 'both') else ']'}")
        elif lo is not None:
            text = f"{noun} {'>' if k.open in ('lo', 'both') else '>='} {_num(lo)}"
        elif hi is not None:
            text = f"{noun} {'<' if k.open in ('hi', 'both') else '<='} {_num(hi)}"
        else:
            text = noun
        if item:
            text = f"a list of integers, each {text.split(' ', 2)[2]}"
    elif k.parse is not None:
        text = "a JSON object"
    elif base == "str":
        text = "a string"
    else:
        text = f"a {kind}"
    if k.unit:
        text += f" ({k.unit})"
    for value, meaning in k.special.items():
        if value is None:
            text += f", or none ({meaning})"
            continue
        inside = isinstance(value, (int, float)) and k.range is not None and _in_range(k, value)
        text += f"; {short_repr(value)} = {meaning}" if inside else f", or {short_repr(value)} ({meaning})"
    if optional and None not in k.special:
        text += ", or none"
    return text


def parse_text(text: str, kind: str) -> Any:
    """A value of `kind` from command-line or --set text (ValueError if it is not one)."""
    s = text.strip()
    if kind == "bool":
        low = s.lower()
        if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{text!r} is not true/false")
        return low in ("true", "1", "yes", "on")
    if kind == "int":
        return int(s)
    if kind == "float":
        return float(s)
    if kind.startswith("tuple"):
        body = s.strip("[]()")
        return tuple(int(x) for x in body.split(",") if x.strip())
    return text


def _in_range(k: Knob, value: float) -> bool:
    lo, hi = k.range or (None, None)
    if lo is not None and (value <= lo if k.open in ("lo", "both") else value < lo):
        return False
    if hi is not None and (value >= hi if k.open in ("hi", "both") else value > hi):
        return False
    return True


def _is_special(k: Knob, value: Any) -> bool:
    return not isinstance(value, bool) and any(
        value == s and type(value) is not bool for s in k.special)


def check_value(name: str, value: Any, f: dataclasses.Field, where: str | None = None,
                from_text: bool = False) -> Any:
    """The value, checked against f's Knob (parsed first when from_text); KnobError if it does not fit."""
    k = knob_of(f)
    if k is None:
        return value
    kind, optional = kind_of(f)
    allowed = allowed_text(k, kind, optional)

    def bad() -> KnobError:
        return KnobError(name, value, allowed, where)

    if from_text and isinstance(value, str):
        if optional and value.strip().lower() in ("none", "null"):
            return None
        if k.parse is not None:
            return k.parse(value)
        if kind != "str":
            try:
                value = parse_text(value, kind)
            except (ValueError, OverflowError):
                raise bad() from None
    if value is None:
        if optional or None in k.special:
            return None
        raise bad()
    if k.accepts is not None and k.accepts(value):
        return value
    if _is_special(k, value):
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad()
    elif kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
            raise bad()
        if kind == "float":
            try:
                as_float = float(value)
            except OverflowError:
                raise bad() from None
            if math.isnan(as_float):
                raise bad()
        if not _in_range(k, value):
            raise bad()
    elif kind == "str":
        if not isinstance(value, str):
            raise bad()
    elif kind.startswith("tuple"):
        if not isinstance(value, (tuple, list)) or any(
                isinstance(x, bool) or not isinstance(x, int) or not _in_range(k, x) for x in value):
            raise bad()
        value = tuple(value)
    choices = k.choice_list()
    if choices is not None and value not in choices:
        raise bad()
    return value


def check_fields(obj: Any, where: Callable[[str], str | None] = lambda name: None,
                 skip: Iterable[str] = (), prefix: str = "") -> None:
    """check_value for every knob field of a dataclass instance (values set in code included).

    prefix names the fields in errors as part of a larger setting ('speculative_config.').
    """
    skipped = set(skip)
    for f in dataclasses.fields(obj):
        if f.name not in skipped and knob_of(f) is not None:
            setattr(obj, f.name, check_value(prefix + f.name, getattr(obj, f.name), f, where(f.name)))


def same_knob(cls: type, name: str, default: Any = MISSING) -> Any:
    """A field declared as cls's field `name` is (its knob and default), for a section that mirrors it."""
    f = cls.__dataclass_fields__[name]
    return dataclasses.field(default=f.default if default is MISSING else default, metadata=f.metadata)
