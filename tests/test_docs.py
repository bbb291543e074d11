"""Every example in a docstring runs, and the README names the commands that exist."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ingestion", "resources", "platform_assets")


def iter_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{package}.")]
    return sorted(names)


@pytest.mark.parametrize("module_name", iter_modules())
def test_docstring_examples(
    module_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # examples use repository-relative paths
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, module_name, extraglobs={"tmp_dir": tmp_path}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"


def test_readme_commands_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", readme, flags=re.MULTILINE):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), f"make {target} missing"
    assert "make dev" in readme
    assert "make test" in readme
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown file."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("block", python_blocks(ROOT / "docs" / "production.md"))
def test_production_examples_build_their_resources(block: str) -> None:
    """Each production example builds its resource as written (field names, engine-owned
    properties refused); nothing connects, secrets stay unresolved EnvVars."""
    from dagster import ConfigurableResource, EnvVar

    from resources.iceberg import IcebergCatalogResource
    from resources.kafka import KafkaResource
    from resources.spark import SparkResource

    namespace = {
        "EnvVar": EnvVar,
        "KafkaResource": KafkaResource,
        "SparkResource": SparkResource,
        "IcebergCatalogResource": IcebergCatalogResource,
    }
    resource = eval(compile(block, "production.md", "eval"), namespace)  # our own docs
    assert isinstance(resource, ConfigurableResource)
