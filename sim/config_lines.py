"""Where a study field is set: the file's text, the line of a key in a table, an error pointing there."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from twinserve.sim.errors import ConfigError

if TYPE_CHECKING:
    from twinserve.sim.config import StudyConfig


def source_text(cfg: "StudyConfig") -> str:
    """The study file's text, or "" when the config came from no readable file."""
    if cfg.source:
        try:
            return Path(cfg.source).read_text()
        except OSError:
            pass
    return ""


def field_error(cfg: "StudyConfig", field: str, msg: str) -> "ConfigError":
    """A ConfigError for `section.key`, at its line in the study file when there is one."""
    text = source_text(cfg)
    section, key = field.split(".", 1)
    return ConfigError(field, msg, cfg.source, find_line(text, section, key) if text else None)


def find_line(text: str, section: str | None, key: str | None) -> int | None:
    """The 1-based line where key is set inside [section] (or where the table starts)."""
    current = None
    table_line = None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("[") and not line.startswith("[["):
            current = line.strip("[] ").strip()
            if current == section:
                table_line = i
            continue
        if key is not None and current == section and "=" in line:
            name = line.split("=", 1)[0].strip().strip('"\'')
            if name == key:
                return i
    return table_line


def replica_line(text: str, index: int, key: str | None = None) -> int | None:
    """The line of entry `index` of cluster.replicas (inline or [[cluster.replicas]] tables)."""
    lines = text.splitlines()
    start = find_line(text, "cluster", "replicas")
    if start is not None and lines[start - 1].split("=", 1)[0].strip() == "replicas":
        seen = -1
        for n in range(start - 1, len(lines)):
            body = lines[n].split("#", 1)[0]
            if n > start - 1 and body.strip().startswith("["):
                break
            seen += body.count("{")
            if seen >= index:
                return n + 1
        return start
    count = -1
    for n, raw in enumerate(lines):
        if raw.strip().replace(" ", "") == "[[cluster.replicas]]":
            count += 1
            if count == index:
                for m in range(n + 1, len(lines)):
                    if lines[m].strip().startswith("["):
                        break
                    if key and lines[m].split("=", 1)[0].strip().strip("\"'") == key:
                        return m + 1
                return n + 1
    return start
