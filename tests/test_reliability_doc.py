"""docs/reliability.md defines every scenario id and rule the repository cites (pure, no broker).

Code, tests and docs cite scenarios as R1..R57 and the design rules as "rule N". Each citation in
a tracked .py or .md file must resolve to a heading of docs/reliability.md; the page must define
exactly R1..R57 (in their groups A-N) and rules 1..7; every test it names must exist.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
# Used when git cannot list the files (for example an unpacked source archive).
FOLDERS = ("ingestion", "platform_assets", "resources", "tests", "bench", "scripts", "docs")

SCENARIO = re.compile(r"\bR(\d+)\b")
RULE = re.compile(r"\b[Rr]ules? (\d+)\b")
SCENARIO_HEADING = re.compile(r"^### R(\d+) — \S")
RULE_HEADING = re.compile(r"^### Rule (\d+) — \S")
GROUP_HEADING = re.compile(r"^## ([A-N])\. \S")
TEST_REFERENCE = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")
# Design notes that live outside this repository: a reader cannot follow a citation of them.
OUTSIDE_NOTES = re.compile(r"\b(?:ARCHITECTURE|RELIABILITY)\.md\b")
GROUPS = {
    "A": list(range(1, 12)),
    "B": list(range(12, 22)),
    "C": list(range(22, 27)),
    "D": list(range(27, 33)),
    "E": list(range(33, 37)),
    "F": list(range(37, 40)),
    "G": list(range(40, 48)),
    "H": [48],
    "I": [49, 50, 51],
    "J": [52],
    "K": [53],
    "L": [54, 55],
    "M": [56],
    "N": [57],
}


@cache
def repository_files() -> tuple[Path, ...]:
    """Every .py and .md file git tracks (or would track: new, not ignored)."""
    command = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.md"]
    try:
        listed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        names = listed.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = []
    paths = {ROOT / name for name in names}
    if not paths:
        paths = {ROOT / "README.md"}
        for folder in FOLDERS:
            paths.update(p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md"})
    return tuple(sorted(p for p in paths if p.is_file()))


def doc_lines() -> list[str]:
    return DOC.read_text(encoding="utf-8").splitlines()


def headings(pattern: re.Pattern[str]) -> list[int]:
    """The numbers of the doc's headings that match ``pattern``, in page order."""
    return [int(m.group(1)) for line in doc_lines() if (m := pattern.match(line))]


def scenario_sections() -> dict[int, str]:
    """Scenario id -> the text of its section (heading up to the next heading)."""
    sections: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in doc_lines():
        if line.startswith("#"):
            match = SCENARIO_HEADING.match(line)
            current = sections.setdefault(int(match.group(1)), []) if match else None
        if current is not None:
            current.append(line)
    return {number: "\n".join(lines) for number, lines in sections.items()}


def undefined_citations(text: str, where: str, scenarios: set[int], rules: set[int]) -> list[str]:
    """Citations in ``text`` that the doc does not define, as 'where:line: R99'."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found += [
            f"{where}:{number}: R{m.group(1)}"
            for m in SCENARIO.finditer(line)
            if int(m.group(1)) not in scenarios
        ]
        found += [
            f"{where}:{number}: {m.group(0)}"
            for m in RULE.finditer(line)
            if int(m.group(1)) not in rules
        ]
    return found


@cache
def module_functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_doc_defines_exactly_the_scenarios_and_rules() -> None:
    assert headings(SCENARIO_HEADING) == list(range(1, 58)), "### R1 … ### R57, once each, in order"
    assert headings(RULE_HEADING) == list(range(1, 8)), "### Rule 1 … ### Rule 7, once each"


def test_scenarios_stay_in_their_groups() -> None:
    groups: dict[str, list[int]] = {}
    group: str | None = None
    for line in doc_lines():
        if line.startswith("## "):
            match = GROUP_HEADING.match(line)
            group = match.group(1) if match else None
        elif (scenario := SCENARIO_HEADING.match(line)) is not None:
            assert group is not None, f"{line!r} is outside the groups A-M"
            groups.setdefault(group, []).append(int(scenario.group(1)))
    assert groups == GROUPS


def test_every_cited_scenario_and_rule_is_defined() -> None:
    scenarios, rules = set(headings(SCENARIO_HEADING)), set(headings(RULE_HEADING))
    files = repository_files()
    assert DOC in files
    assert ROOT / "ingestion" / "pipeline" / "commit.py" in files  # the listing found the code
    undefined = [
        citation
        for path in files
        if path != Path(__file__).resolve()  # its own self-check below cites bogus ids on purpose
        for citation in undefined_citations(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), scenarios, rules
        )
    ]
    assert not undefined, "cited but not defined in docs/reliability.md:\n" + "\n".join(undefined)


def test_the_checker_flags_what_the_doc_does_not_define() -> None:
    text = "ok: R1, R39, rule 7\nbad: R40 and R99 break rule 8\nnot a citation: R2D2, CR1"
    assert undefined_citations(text, "x.py", set(range(1, 40)), set(range(1, 8))) == [
        "x.py:2: R40",
        "x.py:2: R99",
        "x.py:2: rule 8",
    ]


def test_tests_named_in_the_doc_exist() -> None:
    references = TEST_REFERENCE.findall(DOC.read_text(encoding="utf-8"))
    assert len(references) > 39, "the parser finds the doc's `tests/…py::test_…` references"
    missing = [
        f"{file}::{name}"
        for file, name in references
        if not (ROOT / file).is_file() or name not in module_functions(ROOT / file)
    ]
    assert not missing, "named in docs/reliability.md but not defined:\n" + "\n".join(missing)


def test_xfail_tests_are_marked_as_needing_a_real_kafka() -> None:
    unmarked = []
    for number, section in scenario_sections().items():
        for file, name in TEST_REFERENCE.findall(section):
            path = ROOT / file
            function = module_functions(path).get(name) if path.is_file() else None
            if function is None:
                continue  # reported by test_tests_named_in_the_doc_exist
            xfail = any("xfail" in ast.unparse(d) for d in function.decorator_list)
            if xfail and "real Kafka" not in section:
                unmarked.append(f"R{number}: {file}::{name}")
    assert not unmarked, "xfail tests whose scenario does not say 'real Kafka':\n" + "\n".join(
        unmarked
    )


def test_no_citation_of_design_notes_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in repository_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if OUTSIDE_NOTES.search(line)
    ]
    assert not cited, "cite docs/reliability.md instead:\n" + "\n".join(cited)
