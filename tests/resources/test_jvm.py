"""The JVM servers' class paths: each pom resolves once, then is served from the cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from resources.jvm import JVM_DIR, JvmSetupError, cache_dir, class_path


def test_unknown_part_is_refused() -> None:
    with pytest.raises(JvmSetupError, match="no pom for the JVM part 'nope'"):
        class_path("nope")


def test_cache_dir_is_configurable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PLATFORM_JVM_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


@pytest.mark.parametrize("part", sorted(p.name for p in JVM_DIR.iterdir() if p.is_dir()))
def test_every_version_is_pinned_with_a_reason(part: str) -> None:
    """Each ``<version>`` of a pom, or the property it names, follows a comment (why that one)."""
    pom = (JVM_DIR / part / "pom.xml").read_text()
    body = pom.split("<dependencies>", 1)[1]
    for dependency in re.findall(r"<dependency>.*?</dependency>", body, flags=re.DOTALL):
        assert re.search(r"<version>[^<]+</version>", dependency), dependency
    assert pom.count("<!--") >= 2  # the file's purpose, and at least one pin's reason


def test_rest_catalog_class_path_resolves_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The REST catalog's jars: Iceberg's server fixture, S3FileIO, the JDBC driver; a second
    call needs no Maven (PATH without mvn)."""
    entries = class_path("rest-catalog").split(os.pathsep)
    names = {Path(entry).name for entry in entries}
    assert "iceberg-open-api-1.11.0-test-fixtures.jar" in names
    assert "iceberg-core-1.11.0-tests.jar" in names
    assert {"iceberg-aws-1.11.0.jar", "iceberg-aws-bundle-1.11.0.jar"} <= names
    assert any(name.startswith("postgresql-42.") for name in names)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert class_path("rest-catalog").split(os.pathsep) == entries
