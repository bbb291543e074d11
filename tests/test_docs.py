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


def yaml_blocks(path: Path, first_line: str) -> list[str]:
    """The ```yaml blocks of a Markdown file whose first line starts with ``first_line``."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [block for block in blocks if block.startswith(first_line)]


PRODUCTION_MD = ROOT / "docs" / "production.md"


@pytest.mark.parametrize("block", yaml_blocks(PRODUCTION_MD, "# platform.yaml"))
def test_production_configurations_validate_and_build_resources(block: str) -> None:
    """Each configuration of docs/production.md validates as written and builds every
    resource; nothing connects, and the resources hold the secrets' references only."""
    import yaml

    from resources.config import PlatformConfig
    from resources.factory import build_resources

    config = PlatformConfig.model_validate(yaml.safe_load(block))
    resources = build_resources(config)
    assert set(resources) == {"kafka", "iceberg", "spark", "alerts"}
    assert "${" in str(resources["kafka"].model_dump()) + str(resources["iceberg"].model_dump())


def test_production_doc_has_its_examples() -> None:
    assert len(yaml_blocks(PRODUCTION_MD, "# platform.yaml")) >= 3
    (dagster_yaml,) = yaml_blocks(PRODUCTION_MD, "# dagster.yaml")
    assert "postgresql+psycopg2" in dagster_yaml


README = ROOT / "README.md"


@pytest.mark.parametrize("block", yaml_blocks(README, "# pipelines.yaml"))
def test_readme_pipeline_examples_validate_and_build_their_tables(
    block: str, tmp_path: Path
) -> None:
    from ingestion.spec.pipeline import load_pipeline_specs
    from ingestion.table.schema import build_schema

    path = tmp_path / "pipelines.yaml"
    path.write_text(block)
    for spec in load_pipeline_specs(path):
        schema = build_schema(spec)
        assert all(schema.find_field(field.name) for field in spec.schema_fields or [])


def test_readme_has_a_nested_pipeline_example() -> None:
    (block,) = yaml_blocks(README, "# pipelines.yaml: a nested pipeline")
    for kind in ("struct<", "list<", "map<"):
        assert kind in block
