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


def _module_file(root: Path, module: str) -> Path | None:
    """The file a twinserve.* module name is, under root (None for something outside the package)."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    base = root / parts[0] if parts[0] in FOLDERS else None
    if base is None:
        return None
    rest = parts[1:]
    if parts[0] == "twinserve":  # the top-level package's own modules: twinserve.cli -> twinserve/cli.py
        base, rest = root / "twinserve", parts[1:]
    for candidate in (base.joinpath(*rest).with_suffix(".py") if rest else None,
                      base.joinpath(*rest, "__init__.py")):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def import_graph(root: Path) -> dict[str, set[str]]:
    """file -> the files it imports (function-level imports included), paths relative to root.

    `from twinserve.a import b` counts as importing a/b.py when that file exists, else a/__init__.py;
    imports under `if TYPE_CHECKING:` never run and do not count.
    """
    graph: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            edges: set[str] = set()
            typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                           and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                           for stmt in block.body for n in ast.walk(stmt)}
            for node in ast.walk(tree):
                if id(node) in typing_only:  # never run: annotations only
                    continue
                targets: list[Path | None] = []
                if isinstance(node, ast.Import):
                    targets = [_module_file(root, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    package = _module_file(root, node.module)
                    for a in node.names:  # a submodule by that name, else a name from the module
                        sub = _module_file(root, f"{node.module}.{a.name}")
                        targets.append(sub if sub is not None and sub != package else package)
                edges |= {str(t.relative_to(root)) for t in targets if t is not None and t != path}
            graph[str(path.relative_to(root))] = edges
    return graph


def import_loops(root: Path) -> list[list[str]]:
    """Every cycle of files that import each other (strongly connected components above one file)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm, iterative over each node's edges
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def test_no_two_files_import_each_other() -> None:
    assert import_loops(ROOT) == []


def test_a_planted_loop_is_found_even_behind_a_function_level_import(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text("from twinserve.core.b import g\n")
    (tmp_path / "core" / "b.py").write_text("def g():\n    from twinserve.core import a\n")
    (tmp_path / "core" / "c.py").write_text("from twinserve.core.a import x\n")  # imports into it, no loop
    (tmp_path / "core" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from twinserve.core.e import T\n")
    (tmp_path / "core" / "e.py").write_text("from twinserve.core.d import f\n")  # d -> e only for types
    assert import_loops(tmp_path) == [["core/a.py", "core/b.py"]]
