"""The layering holds: dependencies point down only, and no import cycle hides behind a
function-level import (every ``import`` statement counts, wherever it is); disaster recovery is
reached only through its seam; and every module has a test home in the mirrored test tree."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def imports_with_level(path: Path) -> list[tuple[str, bool]]:
    """Every ``import``/``from`` of ``path`` as (module, at module level), relative ones
    skipped (the project uses none)."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    top |= {  # imports under a module-level ``if TYPE_CHECKING:`` or ``try:`` count as top too
        id(child)
        for node in tree.body
        if isinstance(node, ast.If | ast.Try)
        for child in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def is_dr(module: str) -> bool:
    return module.startswith(("ingestion.dr.", "platform_assets.dr.")) or module in {
        "ingestion.dr",
        "platform_assets.dr",
    }


def test_disaster_recovery_is_reached_only_through_its_seam() -> None:
    """Disaster recovery is an add-on (docs/architecture.md): outside ``ingestion/dr/`` the
    engine reaches it only through ``ingestion/replicas.py``; outside ``platform_assets/dr/``
    the Dagster side imports no ``ingestion.dr`` module and loads ``platform_assets.dr`` only
    on demand (inside a function, for a pipeline with replicas), never at import."""
    offenders = []
    for package in ("ingestion", "platform_assets", "resources"):
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(("ingestion/dr/", "platform_assets/dr/")):
                continue
            for module, top_level in imports_with_level(path):
                if not is_dr(module) or relative == "ingestion/replicas.py":
                    continue
                if module.startswith("platform_assets.dr") and not top_level:
                    continue  # the Dagster add-on, loaded when a pipeline has replicas
                offenders.append(f"{relative} imports {module}")
    assert offenders == []


NO_REPLICAS = """
import json, sys
from ingestion.audit.oracle import audit_pipeline
from ingestion.pipeline.run import run_pipeline
from ingestion.spec.pipeline import parse_pipeline_spec
import platform_assets.definitions  # the code location, as dagster loads it
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

spec = parse_pipeline_spec(json.loads(sys.argv[1]))
kafka = KafkaResource(bootstrap_servers=sys.argv[2])
iceberg = IcebergCatalogResource(state_dir=sys.argv[3])
catalog = iceberg.load_catalog()
config = kafka.client_config()
report = run_pipeline(spec, config, catalog, None, cluster_id="test")
state = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
audit = audit_pipeline(spec, catalog, config, full=True)
assert audit is not None and audit.full is not None and audit.full.ok, audit
loaded = sorted(m for m in sys.modules if m.startswith(("ingestion.dr", "platform_assets.dr")))
print(json.dumps({"records": report.records, "dr_modules": loaded}))
"""


@pytest.mark.integration
def test_a_pipeline_without_replicas_loads_no_disaster_recovery_module(
    new_pipeline: Any, broker: Any, tmp_path: Path
) -> None:
    """In a fresh interpreter: load the code location, run a pipeline without replicas
    (``run_pipeline``), read its state as the sensors and the CLI do and audit it in full;
    not one ``ingestion.dr`` or ``platform_assets.dr`` module is loaded."""
    _, spec = new_pipeline("nodr", produce=5)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_REPLICAS,
            spec.model_dump_json(by_alias=True, exclude_none=True),
            broker.bootstrap_servers,
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"records": 5, "dr_modules": []}


def test_the_seam_loads_disaster_recovery_for_a_pipeline_with_replicas() -> None:
    """The other side of the seam: a pipeline with replicas gets the add-on."""
    from ingestion.replicas import replica_support
    from tests.support.pipelines import make_spec

    spec = make_spec("orders", "withdr", replicas=[{"name": "dr", "source_alias": "primary"}])
    support = replica_support(spec)
    assert support is not None
    assert support.name_families(spec) == [frozenset({"orders", "primary.orders"})]


def has_code(path: Path) -> bool:
    """Whether ``path`` holds more than a docstring (an ``__init__.py`` without code is no
    module to test)."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def test_has_code_tells_a_docstring_from_code(tmp_path: Path) -> None:
    """The exclusion itself: empty and docstring-only files have no code, anything else has."""
    cases = {"": False, '"""Doc."""\n': False, "X = 1\n": True, '"""Doc."""\nimport os\n': True}
    for number, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"m{number}.py"
        path.write_text(text)
        assert has_code(path) is expected, text


def test_every_module_has_a_test_home() -> None:
    """Every module with code under ingestion/, platform_assets/ and resources/ is imported
    (``import x``, ``from x import ...`` or ``from package import x``) by a test file in its
    mirrored test directory: ``ingestion/formats/headers.py`` by one in ``tests/ingestion/formats/``
    (docs/architecture.md: tests mirror the tree). ``__init__.py`` files without code are
    exempt."""
    modules = {
        module_name(path): path
        for package in ("ingestion", "platform_assets", "resources")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py" or has_code(path)
    }
    known = set(modules)
    imported_in: dict[Path, set[str]] = {}
    for test_file in (ROOT / "tests").rglob("*.py"):
        imported_in.setdefault(test_file.parent, set()).update(imports_of(test_file, known))
    offenders = []
    for name, path in sorted(modules.items()):
        home = ROOT / "tests" / path.parent.relative_to(ROOT)
        if name not in imported_in.get(home, set()):
            elsewhere = sorted(
                str(directory.relative_to(ROOT))
                for directory, names in imported_in.items()
                if name in names
            )
            where = f"imported only in {elsewhere}" if elsewhere else "imported by no test"
            offenders.append(f"{name}: no test in {home.relative_to(ROOT)}/ imports it ({where})")
    assert not offenders, "modules without a test home:\n" + "\n".join(offenders)
