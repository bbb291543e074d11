"""Every documented example runs: the docstrings' examples, and the examples of the README and of
every page it links to (pipelines, configurations, Python, the scripts they run); every link
between the pages resolves, the README stays short, and no file cites a numbered issue."""

from __future__ import annotations

import doctest
import functools
import importlib
import pkgutil
import re
import subprocess
from pathlib import Path
from typing import Any

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


JVM_EXAMPLES = frozenset({"resources.embedded"})
"""Modules whose examples start a JVM (a broker): not run by ``make check``."""


@pytest.mark.parametrize(
    "module_name",
    [
        pytest.param(name, marks=[pytest.mark.jvm] if name in JVM_EXAMPLES else [])
        for name in iter_modules()
    ],
)
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


README = ROOT / "README.md"
README_MAX_LINES = 300
# The README and the pages of the documentation: every example of each runs here.
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md")
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # the target of a Markdown link or image


def test_readme_commands_exist() -> None:
    readme = README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", readme, flags=re.MULTILINE):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), f"make {target} missing"
    assert "make dev" in readme
    assert "make test" in readme
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens.

    Example:
        >>> github_anchor("Freshness: produce -> queryable")
        'freshness-produce---queryable'
        >>> github_anchor("The exactly-once audit's budget (`--full-audit`)")
        'the-exactly-once-audits-budget---full-audit'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a Markdown page's headings (outside code blocks), duplicates numbered."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(f"{anchor}-{count}" if count else anchor)
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading anchor, does not exist."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    return broken


def test_readme_is_short() -> None:
    """The README says what this is and how to start; the rest lives in the pages it links to."""
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    assert not broken_links(README)
    linked = {
        (ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(README.read_text())
    }
    assert set(PAGES) - {README} <= linked, "a page the README does not link to"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_page_links_resolve(page: Path) -> None:
    assert not broken_links(page)


def test_the_link_checker_flags_a_missing_file_and_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A: b\n[ok](#a-b) [no](#a) [gone](other.md) [web](https://x.org/#y)\n")
    assert broken_links(page) == ["#a: no such heading", "other.md: no such file"]


# A numbered issue of a tracker the reader of the repository cannot see; cite an R-number of
# docs/reliability.md or a page instead, or say what the behaviour is.
ISSUE_CITATION = re.compile(r"(?i)\bissues? #?\d+|\(#\d+\)")
CHECKED_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml")
CHECKED_FILES = (*(f"*{suffix}" for suffix in CHECKED_SUFFIXES), "Makefile")
# Used when git cannot list the files (for example an unpacked source archive).
CHECKED_FOLDERS = (
    "ingestion",
    "platform_assets",
    "resources",
    "tests",
    "bench",
    "scripts",
    "docs",
    "dbt",
)


def checked_files() -> list[Path]:
    """Every file of ``CHECKED_FILES`` git tracks (or would track: new, not ignored)."""
    command = ["git", "ls-files", "--cached", "--others", "--exclude-standard", *CHECKED_FILES]
    try:
        listed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        paths = {ROOT / name for name in listed.stdout.splitlines()}
    except (OSError, subprocess.CalledProcessError):
        paths = set()
    if not paths:
        paths = {ROOT / "Makefile", *(p for p in ROOT.iterdir() if p.suffix in CHECKED_SUFFIXES)}
        for folder in CHECKED_FOLDERS:
            paths.update(p for p in (ROOT / folder).rglob("*") if p.suffix in CHECKED_SUFFIXES)
    return sorted(p for p in paths if p.is_file())


def test_no_citation_of_an_issue_number() -> None:
    """Code, tests and docs cite R-numbers and pages, never a numbered issue: a reader of the
    repository cannot see the tracker. Binary files are the only ones left out."""
    assert all(ISSUE_CITATION.search(s) for s in ("see Issue" + " 28", "(" + "#31)"))
    cited = []
    for path in checked_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        cited += [
            f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), start=1)
            if ISSUE_CITATION.search(line)
        ]
    assert not cited, "cite an R-number of docs/reliability.md instead:\n" + "\n".join(cited)


FORMATTER_OFF = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def test_the_formatter_is_never_switched_off() -> None:
    """ruff's format holds for every line of Python: code too long for it wants a value object
    or a name, not a formatter comment (``fmt`` with ``skip`` or ``off``) that packs it."""
    assert FORMATTER_OFF.search("x = 1  # fmt" + ": skip")
    switched = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in checked_files()
        if path.suffix == ".py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if FORMATTER_OFF.search(line)
    ]
    assert not switched, "let ruff format it (make lint):\n" + "\n".join(switched)


def fenced_blocks(path: Path, language: str, first_line: str = "") -> list[str]:
    """The fenced blocks of a Markdown file in ``language`` whose first line starts with
    ``first_line``."""
    pattern = rf"^```{language}\n(.*?)^```"
    blocks = re.findall(pattern, path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [block for block in blocks if block.startswith(first_line)]


def yaml_blocks(path: Path, first_line: str) -> list[str]:
    """The ```yaml blocks of a Markdown file whose first line starts with ``first_line``."""
    return fenced_blocks(path, "yaml", first_line)


def page_blocks(language: str, first_line: str = "") -> list[Any]:
    """Every such block of every page, as pytest parameters named by page and position."""
    return [
        pytest.param(block, id=f"{page_id}-{number}")
        for page, page_id in zip(PAGES, PAGE_IDS, strict=True)
        for number, block in enumerate(fenced_blocks(page, language, first_line), start=1)
    ]


PRODUCTION_MD = ROOT / "docs" / "production.md"


@pytest.mark.parametrize("block", page_blocks("yaml", "# platform.yaml"))
def test_production_configurations_validate_and_build_resources(block: str) -> None:
    """Each configuration of the pages validates as written and builds every resource; nothing
    connects, and the resources hold the secrets' references only."""
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


@pytest.mark.parametrize("block", page_blocks("yaml", "# pipelines.yaml"))
def test_pipeline_examples_validate_and_build_their_tables(block: str, tmp_path: Path) -> None:
    from ingestion.spec.pipeline import load_pipeline_specs
    from ingestion.table.schema import build_schema

    path = tmp_path / "pipelines.yaml"
    path.write_text(block)
    for spec in load_pipeline_specs(path):
        if spec.value_format == "avro" and spec.schema_fields is None:
            continue  # derived from the registry on the first run (test_run_upsert.py)
        schema = build_schema(spec)
        assert all(schema.find_field(field.name) for field in spec.schema_fields or [])


def test_readme_has_a_pipeline_example() -> None:
    assert yaml_blocks(README, "# pipelines.yaml")


def test_pipelines_doc_has_a_nested_pipeline_example() -> None:
    (block,) = yaml_blocks(ROOT / "docs" / "pipelines.md", "# pipelines.yaml: a nested pipeline")
    for kind in ("struct<", "list<", "map<"):
        assert kind in block


def seed_demo_table(state_dir: Path, rows: int) -> None:
    """The demo pipeline's table in the embedded catalog under ``state_dir``, with ``rows`` rows
    as the engine writes them (no broker: the examples only read the table)."""
    from datetime import UTC, datetime
    from decimal import Decimal

    import pyarrow as pa

    from ingestion.spec.pipeline import load_pipeline_specs
    from ingestion.table.schema import load_or_create_table
    from resources.iceberg import IcebergCatalogResource

    specs = load_pipeline_specs(ROOT / "platform_assets" / "pipelines.yaml")
    (spec,) = [s for s in specs if s.name == "orders"]
    table = load_or_create_table(
        IcebergCatalogResource(state_dir=str(state_dir)).load_catalog(), spec
    )
    now = datetime.now(UTC)
    records = [
        {
            "order_id": f"order-{n}",
            "status": ("paid", "shipped")[n % 2],
            "currency": "EUR",
            "amount": Decimal("12.50"),
            "items": 1,
            "created_at": now,
            "_kafka_topic": "orders",
            "_kafka_partition": n % 4,
            "_kafka_offset": n // 4,
            "_kafka_timestamp": now,
            "_kafka_key": f"order-{n}",
        }
        for n in range(rows)
    ]
    table.append(pa.Table.from_pylist(records, schema=table.schema().as_arrow()))


@pytest.mark.parametrize("block", page_blocks("python"))
def test_python_examples_run(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each Python example runs as written, as a script in the repository root of a `make dev`
    whose demo table holds a few rows (the embedded catalog, no PLATFORM_CONFIG)."""
    seed_demo_table(tmp_path / ".platform", rows=10)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLATFORM_CONFIG", raising=False)
    monkeypatch.delenv("PLATFORM_STATE_DIR", raising=False)
    exec(compile(block, "example.py", "exec"), {"__name__": "__main__"})
    out = capfd.readouterr().out
    assert "paid" in out
    assert "shipped" in out


def test_readme_queries_the_rows_with_duckdb() -> None:
    (block,) = fenced_blocks(README, "python")
    assert "to_duckdb" in block


# A script run by a page: a line of a code block (indented ones too), or an inline code span.
SCRIPT_COMMANDS = (
    re.compile(r"^\s*(?:\.venv/bin/)?python (\S+\.py)([^#`\n]*)", flags=re.MULTILINE),
    re.compile(r"`(?:\.venv/bin/)?python (\S+\.py)([^#`\n]*)`"),
)


def documented_scripts() -> list[Any]:
    """Every ``python path.py --options`` a page gives, as (script, arguments) parameters."""
    return [
        pytest.param(path, options.split(), id=f"{page_id}:{path}{options.rstrip()}")
        for page, page_id in zip(PAGES, PAGE_IDS, strict=True)
        for pattern in SCRIPT_COMMANDS
        for path, options in pattern.findall(page.read_text())
    ]


@pytest.mark.parametrize(("script", "arguments"), documented_scripts())
def test_documented_scripts_take_their_options(script: str, arguments: list[str]) -> None:
    """A documented benchmark or script exists and defines every option the page gives it (each
    is run at a small size by tests/bench/test_run.py and the scripts' own tests); or it is a page's
    own Python example, named on its first line (``# query.py: ...``)."""
    examples = {
        block.split(":")[0].removeprefix("# ")
        for page in PAGES
        for block in fenced_blocks(page, "python")
    }
    if script in examples and not arguments:
        return
    source = (ROOT / script).read_text()
    for option in (word for word in arguments if word.startswith("--")):
        assert f'"{option}"' in source, f"{script} defines no {option}"
