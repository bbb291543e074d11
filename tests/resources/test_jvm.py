"""The JVM servers' class paths: each pom resolves once, then is served from the cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from resources.jvm import JVM_DIR, JvmSetupError, cache_dir, class_path, quarkus_runner


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


@pytest.mark.jvm  # runs java itself
def test_class_data_sharing_dumps_once_then_maps_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real JVM (Kafka's storage tool, which exits at once) dumps its classes at exit into
    a file of its own; published, the archive is what the next start maps: ``-Xshare:on``
    makes that start fail unless the archive maps."""
    import dataclasses
    import subprocess

    from resources.jvm import ClassDataSharing, java_binary

    cp = class_path("kafka")  # resolved in the real cache, before the cache is moved
    monkeypatch.setenv("PLATFORM_JVM_CACHE", str(tmp_path))
    main = "kafka.tools.StorageTool"

    def run(sharing: ClassDataSharing, *extra: str) -> subprocess.CompletedProcess[str]:
        command = [java_binary(), *sharing.options, *extra, "-cp", cp, main, "random-uuid"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    first = ClassDataSharing.for_server(main, cp)
    assert first.dump is not None
    assert first.archive is not None
    assert not first.archive.exists()
    assert run(first).returncode == 0
    assert first.dump.exists()  # written at exit, under its own name
    first.publish()
    assert first.archive.exists()
    assert not first.dump.exists()

    second = ClassDataSharing.for_server(main, cp)
    assert (second.archive, second.dump) == (first.archive, None)
    mapped = run(second, "-Xshare:on")
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    published = first.archive.stat().st_mtime_ns
    late = dataclasses.replace(first, dump=first.archive.with_suffix(".late.tmp"))
    assert late.dump is not None
    assert run(late).returncode == 0  # a second dump of the same server
    late.publish()
    assert first.archive.stat().st_mtime_ns == published  # the first one stays
    assert not late.dump.exists()
    assert ClassDataSharing.for_server("another.Main", cp).archive != first.archive


def test_an_archive_that_may_be_half_written_is_never_published(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A JVM killed while it dumped left a file that may be half written, and a file a JVM
    cannot map is no archive: both removed, never published; every dump has a name of its
    own."""
    from resources.jvm import ClassDataSharing

    monkeypatch.setenv("PLATFORM_JVM_CACHE", str(tmp_path))
    cp = str(tmp_path / "a.jar")
    (tmp_path / "a.jar").write_bytes(b"")
    killed = ClassDataSharing.for_server("some.Main", cp)
    assert killed.dump is not None
    assert killed.archive is not None
    killed.dump.write_bytes(b"half")
    killed.publish(complete=False)
    assert not killed.dump.exists()
    assert not killed.archive.exists()
    one, two = (ClassDataSharing.for_server("some.Main", cp) for _ in range(2))
    assert one.dump is not None
    assert two.dump is not None
    assert one.dump != two.dump
    one.dump.write_bytes(b"not an archive")
    one.publish()  # complete, but no JVM maps it
    assert not one.dump.exists()
    assert not killed.archive.exists()


def test_class_sharing_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``PLATFORM_JVM_CLASS_SHARING=off``, or a cache that cannot be written: no options, the
    server starts as without sharing, nothing is published."""
    from resources.jvm import ClassDataSharing

    monkeypatch.setenv("PLATFORM_JVM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PLATFORM_JVM_CLASS_SHARING", "off")
    off = ClassDataSharing.for_server("some.Main", "a.jar")
    assert off.options == []
    off.publish()
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv("PLATFORM_JVM_CLASS_SHARING")
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    assert ClassDataSharing.for_server("some.Main", "a.jar").options == []


def test_the_schema_registry_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's runner jar and its lib/ are in the cache (make test-jvm built them); a
    second call needs no Maven (PATH without mvn)."""
    runner = quarkus_runner("schema-registry")
    assert runner.name.endswith("-runner.jar")
    assert (runner.parent / "lib").is_dir()
    assert runner.parent.parent == cache_dir()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert quarkus_runner("schema-registry") == runner


def test_a_build_maven_refuses_says_why_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A pom Maven cannot read: the error names the pom and carries Maven's words; no build
    folder is left in the cache."""
    parts = tmp_path / "parts"
    (parts / "broken").mkdir(parents=True)
    (parts / "broken" / "pom.xml").write_text("<project><not-closed></project>")
    monkeypatch.setattr("resources.jvm.JVM_DIR", parts)
    monkeypatch.setenv("PLATFORM_JVM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(JvmSetupError, match=r"Maven could not build .*broken/pom.xml") as refused:
        quarkus_runner("broken")
    assert "Maven said:" in str(refused.value)
    assert not list((tmp_path / "cache").glob("broken-*"))
