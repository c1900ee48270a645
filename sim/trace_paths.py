"""Where a study's trace lives: the builtin traces shipped with twinserve, or a path."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
BUILTIN_TRACES = {"azure_conv": DATA_DIR / "azure_conv_excerpt.csv"}


class UnknownBuiltinTrace(ValueError):
    """A 'builtin:NAME' that names no shipped trace."""


def trace_path(trace: str, source: str = "") -> str:
    """The trace's path: 'builtin:NAME', or a path (relative to the study file `source` when given)."""
    if not trace:
        return ""
    if trace.startswith("builtin:"):
        name = trace.split(":", 1)[1]
        if name not in BUILTIN_TRACES:
            raise UnknownBuiltinTrace(f"unknown builtin trace {name!r}; known: "
                                      + ", ".join(f"builtin:{n}" for n in BUILTIN_TRACES))
        return str(BUILTIN_TRACES[name])
    p = Path(trace)
    if not p.is_absolute() and source and not p.exists():
        alt = Path(source).parent / p
        if alt.exists():
            return str(alt)
    return str(p)
