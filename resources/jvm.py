"""Class paths of the platform's embedded JVM servers, resolved by Maven once.

Each server (the Kafka broker, MirrorMaker 2, the tests' Iceberg REST catalog) has a ``pom.xml``
under ``resources/jvm/<part>/`` that pins its artifacts. :func:`class_path` asks Maven for the
part's class path: the jars land in Maven's local repository (``~/.m2``, outside the checkout)
and the class path is remembered in the cache directory (``$PLATFORM_JVM_CACHE``, else
``~/.cache/kafka-iceberg-platform``) under the pom's hash, so a second start costs no Maven run
and an edited pom resolves again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

JVM_DIR = Path(__file__).resolve().parent / "jvm"
LOG4J2_CONFIG = JVM_DIR / "log4j2.properties"
MAVEN_HINT = "install Maven with: sudo apt-get install -y maven (Java 17+ is needed as well)"


class JvmSetupError(RuntimeError):
    """A JVM server's class path could not be resolved, or Java is missing."""


def cache_dir() -> Path:
    """Where resolved class paths are remembered."""
    configured = os.environ.get("PLATFORM_JVM_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kafka-iceberg-platform"


def java_binary() -> str:
    """The ``java`` to start servers with (``$JAVA_HOME/bin/java``, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise JvmSetupError(
            "java was not found; install it with: sudo apt-get install -y openjdk-17-jre-headless"
        )
    return found


def class_path(part: str) -> str:
    """The class path of ``resources/jvm/<part>/pom.xml``, resolving it with Maven if needed.

    Safe to call from several processes at once: each writes the cache file by rename.
    """
    pom = JVM_DIR / part / "pom.xml"
    if not pom.exists():
        raise JvmSetupError(f"no pom for the JVM part {part!r} at {pom}")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    cached = cache_dir() / f"{part}-{digest}.classpath"
    if cached.exists():
        entries = cached.read_text().strip()
        if entries and all(Path(jar).exists() for jar in entries.split(os.pathsep)):
            return entries
    cached.parent.mkdir(parents=True, exist_ok=True)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmSetupError(f"Maven (mvn) is needed to fetch the {part} jars once; {MAVEN_HINT}")
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    command = [
        mvn, "--batch-mode", "--quiet", "--file", str(pom),
        "dependency:build-classpath", f"-Dmdep.outputFile={partial}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not partial.exists():
        output = (result.stdout + result.stderr).strip()[-4_000:]
        raise JvmSetupError(
            f"Maven could not resolve {pom} (exit {result.returncode}); the machine must reach "
            f"Maven Central (or a mirror in ~/.m2/settings.xml). Maven said:\n{output}"
        )
    partial.replace(cached)
    return cached.read_text().strip()
