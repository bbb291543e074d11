"""The lock (constraints.txt) and the ranges (pyproject.toml) agree: every direct dependency's
locked version is inside its range, and the environment the tests run in is the lock's (what
``make`` installed). A range moved past the lock, or a lock not regenerated, fails here."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += [line for line in extra if not line.startswith(project["name"])]
    return [Requirement(line) for line in lines]


def test_every_direct_dependency_is_locked_inside_its_range() -> None:
    pins = locked()
    for requirement in direct_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in constraints.txt: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt locks {requirement.name}=={pins[name]} outside {requirement}"
        )


def test_the_environment_is_the_lock() -> None:
    pins = locked()
    for requirement in direct_requirements():
        name = canonicalize_name(requirement.name)
        assert metadata.version(requirement.name) == pins[name], (
            f"{requirement.name} {metadata.version(requirement.name)} is installed, the lock "
            f"says {pins[name]}: reinstall with make (pip install -c constraints.txt)"
        )


def test_runtime_dependencies_are_ranges_not_pins() -> None:
    """An exact pin clashes with a team's own Dagster environment."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = [line for line in project["dependencies"] if "==" in line]
    assert pinned == []
