"""The layering holds: dependencies point down only, and no import cycle hides behind a
function-level import (every ``import`` statement counts, wherever it is)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("platform_assets", "resources", "ingestion", "bench", "scripts")
# Each layer may import only from the layers after it: dependencies point down (README, Layout).
LAYERS = ("bench", "scripts", "platform_assets", "resources", "ingestion")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in known}
    return found


def project_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, known) - {name} for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted.

    Example:
        >>> find_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
        [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, set()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_find_cycles_sees_function_level_imports(tmp_path: Path) -> None:
    """The detector itself: a cycle closed by an import inside a function is found."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n")
    known = {"a", "b"}
    graph = {name: imports_of(tmp_path / f"{name}.py", known) for name in known}
    assert find_cycles(graph) == [["a", "b"]]


def test_no_import_cycle() -> None:
    assert find_cycles(project_graph()) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_dependencies_point_down(layer: str) -> None:
    allowed = set(LAYERS[LAYERS.index(layer) :])
    upward = {
        f"{source} -> {target}"
        for source, targets in project_graph().items()
        if source.split(".")[0] == layer
        for target in targets
        if target.split(".")[0] not in allowed
    }
    assert not upward, f"{layer} imports from a layer above it: {sorted(upward)}"


def test_engine_imports_no_dagster() -> None:
    offenders = []
    for path in (ROOT / "ingestion").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "dagster" for name in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
