"""Imports run downhill: a module may import only from its own layer and the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Which twinserve subpackages each folder may import (its own included). The twin, the load
# generator and the CLI sit on top and may use everything.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "kernels": frozenset({"core", "kernels"}),
    "backends": frozenset({"core", "kernels", "backends"}),
    "sim": frozenset({"core", "backends.sim", "sim"}),
}
FOLDERS = ("core", "kernels", "backends", "sim", "twin", "bench", "twinserve")


def _targets(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import of twinserve.* in a module, function bodies included."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ValueError(f"line {node.lineno}: relative import (the house style is absolute)")
            if node.module == "twinserve":
                out += [(node.lineno, f"twinserve.{a.name}") for a in node.names]
            elif node.module:
                out.append((node.lineno, node.module))
    return [(line, m) for line, m in out if m == "twinserve" or m.startswith("twinserve.")]


def _permitted(folder: str, module: str) -> bool:
    allowed = ALLOWED.get(folder)
    if allowed is None:
        return True
    parts = module.split(".")[1:]
    if not parts:  # `import twinserve` reaches the top of the package
        return False
    return any(".".join(parts[: len(a.split("."))]) == a for a in allowed)


def violations(root: Path) -> list[str]:
    """Every import in root's package folders that runs up the layers, as 'file:line: module'."""
    found: list[str] = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            try:
                targets = _targets(ast.parse(path.read_text(), str(path)))
            except ValueError as e:
                found.append(f"{path.relative_to(root)}: {e}")
                continue
            found += [f"{path.relative_to(root)}:{line}: {module}" for line, module in targets
                      if not _permitted(folder, module)]
    return found


def test_the_package_imports_only_downhill() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize("folder,source,bad", [
    ("core", "from twinserve.backends.real.engine import LLMEngine\n", "twinserve.backends.real.engine"),
    ("kernels", "def f():\n    import twinserve.sim.world\n", "twinserve.sim.world"),
    ("backends", "from twinserve.sim import config\n", "twinserve.sim"),
    ("sim", "from twinserve.backends.real.engine import LLMEngine\n", "twinserve.backends.real.engine"),
    ("sim", "from twinserve import twin\n", "twinserve.twin"),
    ("core", "from .kv import x\n", "relative import"),
])
def test_a_planted_upward_import_is_found(tmp_path: Path, folder: str, source: str, bad: str) -> None:
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "planted.py").write_text(source)
    (tmp_path / "sim").mkdir(exist_ok=True)
    (tmp_path / "sim" / "fine.py").write_text("from twinserve.backends.sim.executor import SimExecutor\n"
                                              "from twinserve.core.errors import TwinserveError\n")
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "top.py").write_text("from twinserve.backends.real.engine import LLMEngine\n")
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(f"{folder}/planted.py") and bad in found[0]
