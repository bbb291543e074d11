"""Class paths of the platform's embedded JVM servers, resolved by Maven once.

Each server (the Kafka broker, MirrorMaker 2, the tests' Iceberg REST catalog) has a ``pom.xml``
under ``resources/jvm/<part>/`` that pins its artifacts. :func:`class_path` asks Maven for the
part's class path: the jars land in Maven's local repository (``~/.m2``, outside the checkout)
and the class path is remembered in the cache directory (``$PLATFORM_JVM_CACHE``, else
``~/.cache/kafka-iceberg-platform``) under the pom's hash, so a second start costs no Maven run
and an edited pom resolves again.

A part that is a Quarkus application (the tests' Schema Registry) is built instead:
:func:`quarkus_runner` runs ``mvn package`` once on a copy of the part's folder in the cache
directory, under the pom's hash, and returns the runner jar (its ``lib/`` beside it).

:class:`ClassDataSharing` shortens each start by mapping the classes a server loaded on an
earlier start from a class data sharing archive (the JDK's AppCDS: ``-XX:ArchiveClassesAtExit``
writes it when the first JVM of that main class and class path exits, ``-XX:SharedArchiveFile``
maps it afterwards). Measured with ``tests/support/mirror_maker.py`` on 2 idle cores: a
MirrorMaker 2 start 5.0 s -> 3.6 s. The JVM checks the archive against its own build and the
class path; one that does not match is ignored (the start is then as slow as without one).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

JVM_DIR = Path(__file__).resolve().parent / "jvm"
LOG4J2_CONFIG = JVM_DIR / "log4j2.properties"
MAVEN_HINT = "install Maven with: sudo apt-get install -y maven (Java 17+ is needed as well)"


DUMP_GRACE_S = 30.0
"""How long a running JVM that dumps its class data sharing archive at exit may take to stop
(its stop timeout first, then up to this while it is not stopped by a signal)."""
DUMP_MIN_FREE_BYTES = 512 * 2**20
"""No dump with less free space in the cache: an archive is 20-50 MB."""
ARCHIVE_KEEP_S = 7 * 86_400
"""An archive not used for a week (another class path, an old ``java``) is removed."""
DUMP_KEEP_S = 3_600
"""A dump not published within an hour was left by a process that died."""


class JvmSetupError(RuntimeError):
    """A JVM server's class path could not be resolved (or its build failed), or Java is
    missing."""


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
        mvn,
        "--batch-mode",
        "--quiet",
        "--file",
        str(pom),
        "dependency:build-classpath",
        f"-Dmdep.outputFile={partial}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not partial.exists():
        output = (result.stdout + result.stderr).strip()[-4_000:]
        raise JvmSetupError(
            f"Maven could not resolve {pom} (exit {result.returncode}); the machine must reach "
            f"Maven Central (or a mirror in ~/.m2/settings.xml). Maven said:\n{output}"
        )
    partial.replace(cached)
    return cached.read_text().strip()


BUILD_KEEP_S = 3_600
"""A build folder not renamed into place within an hour was left by a process that died."""


def quarkus_runner(part: str) -> Path:
    """The runner jar of the Quarkus application ``resources/jvm/<part>/pom.xml`` builds,
    building it with Maven if needed (its dependencies in ``lib/`` beside it).

    The part's folder is copied into the cache directory and built there, so the checkout stays
    clean; the runner jar and ``lib/`` are kept in ``<part>-<pom hash>/`` (an edited pom builds
    again). Safe to call from several processes at once: each builds in a folder of its own and
    renames it into place; the first rename wins, the others use it.
    """
    folder = JVM_DIR / part
    pom = folder / "pom.xml"
    if not pom.exists():
        raise JvmSetupError(f"no pom for the JVM part {part!r} at {pom}")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    built = cache_dir() / f"{part}-{digest}"
    runner = _runner_jar(built)
    if runner is not None:
        return runner
    cache_dir().mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(part)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmSetupError(f"Maven (mvn) is needed to build the {part} server once; {MAVEN_HINT}")
    work = cache_dir() / f"{part}-{digest}.{os.getpid()}.{uuid.uuid4().hex[:8]}.build"
    try:
        shutil.copytree(folder, work / "src")
        command = [
            mvn,
            "-B",
            "-q",
            "--file",
            str(work / "src" / "pom.xml"),
            "-DskipTests",
            "package",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        target = work / "src" / "target"
        jars = sorted(target.glob("*-runner.jar"))
        if result.returncode != 0 or len(jars) != 1 or not (target / "lib").is_dir():
            output = (result.stdout + result.stderr).strip()[-4_000:]
            raise JvmSetupError(
                f"Maven could not build {pom} (exit {result.returncode}); the machine must reach "
                f"Maven Central (or a mirror in ~/.m2/settings.xml). Maven said:\n{output}"
            )
        done = work / "done"
        done.mkdir()
        jars[0].rename(done / jars[0].name)
        (target / "lib").rename(done / "lib")
        with contextlib.suppress(OSError):  # another process renamed its build first: use it
            done.rename(built)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runner = _runner_jar(built)
    if runner is None:
        raise JvmSetupError(f"the {part} build left no runner jar in {built}")
    return runner


def _runner_jar(built: Path) -> Path | None:
    """The runner jar of a finished build folder, else None."""
    jars = sorted(built.glob("*-runner.jar"))
    return jars[0] if len(jars) == 1 and (built / "lib").is_dir() else None


def _remove_stale_builds(part: str) -> None:
    """Remove build folders of ``part`` left by processes that died while building, and
    builds of another pom whose runner jar was not used for :data:`ARCHIVE_KEEP_S`."""
    now = time.time()
    for path in cache_dir().glob(f"{part}-*.build"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > BUILD_KEEP_S:
                shutil.rmtree(path)
    for path in cache_dir().glob(f"{part}-" + "[0-9a-f]" * 16):
        with contextlib.suppress(OSError):
            used = max((jar.stat().st_atime for jar in path.glob("*-runner.jar")), default=0.0)
            if now - max(used, path.stat().st_mtime) > ARCHIVE_KEEP_S:
                shutil.rmtree(path)


@dataclass(frozen=True)
class ClassDataSharing:
    """The class data sharing archive of one JVM server: ``main`` started on ``cp``.

    :attr:`options` go on the ``java`` command line. Without an archive yet, the JVM dumps one
    when it exits cleanly into a file of its own (a unique name), which :meth:`publish` checks
    and renames into place once the JVM is gone: JVMs started at the same time never write one
    file, and an archive is published only after a JVM mapped it (``-Xshare:on``), so a
    half-written or foreign file is never used by a server start.
    """

    archive: Path | None  # None: no sharing (turned off, the cache not writable, disk short)
    dump: Path | None
    main: str = ""
    cp: str = ""

    @classmethod
    def for_server(cls, main: str, cp: str) -> ClassDataSharing:
        """The archive of ``main`` on ``cp`` with this ``java``: a new ``java`` build, main
        class, class path or jar (its size and time) gets an archive of its own, and older
        archives of ``main`` are removed after :data:`ARCHIVE_KEEP_S`.
        ``PLATFORM_JVM_CLASS_SHARING=off`` turns sharing off; so does a cache directory that
        cannot be written or has less than :data:`DUMP_MIN_FREE_BYTES` free (a dump that
        cannot be written makes the JVM exit with 1): the server then starts without it."""
        off = cls(None, None, main, cp)
        if os.environ.get("PLATFORM_JVM_CLASS_SHARING", "on").lower() in ("off", "0", "false"):
            return off
        try:
            java = Path(java_binary()).resolve()
            jars = [Path(entry) for entry in cp.split(os.pathsep) if entry]
            stamps = [f"{jar}:{st.st_size}:{st.st_mtime_ns}" for jar in jars if (st := jar.stat())]
            identity = "\n".join([f"{java}:{java.stat().st_mtime_ns}", main, *stamps])
            digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
            name = main.rsplit(".", 1)[-1]
            folder = cache_dir() / "cds"
            archive = folder / f"{name}-{digest}.jsa"
            if archive.exists():
                return cls(archive, None, main, cp)
            folder.mkdir(parents=True, exist_ok=True)
            _remove_stale(folder, name)
            if not os.access(folder, os.W_OK):
                return off
            if shutil.disk_usage(folder).free < DUMP_MIN_FREE_BYTES:
                return off
        except OSError:
            return off
        dump = archive.with_suffix(f".{uuid.uuid4().hex}.tmp")
        return cls(archive, dump, main, cp)

    @property
    def options(self) -> list[str]:
        """``java`` options: map the archive, or dump one at exit; CDS's own warnings (classes
        it cannot archive) stay out of the server's log."""
        quiet = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
        if self.archive is None:
            return []
        if self.dump is None:
            return [f"-XX:SharedArchiveFile={self.archive}", *quiet]
        return [f"-XX:ArchiveClassesAtExit={self.dump}", *quiet]

    def publish(self, complete: bool = True) -> None:
        """After the JVM exited: its dumped archive becomes the archive once a JVM maps it
        (the first one wins); one that may be incomplete (the JVM was killed or failed) or
        does not map is removed."""
        if self.archive is None or self.dump is None or not self.dump.exists():
            return
        try:
            if complete and not self.archive.exists() and self._maps(self.dump):
                with self.dump.open("rb") as written:
                    os.fsync(written.fileno())  # on disk before its name says "complete"
                self.dump.replace(self.archive)
        except OSError:
            pass
        finally:
            self.dump.unlink(missing_ok=True)

    def _maps(self, archive: Path) -> bool:
        """A JVM on the same class path starts with ``archive`` mapped (``-Xshare:on`` fails
        the start otherwise; a truncated archive crashes it)."""
        command = [
            java_binary(),
            "-Xshare:on",
            f"-XX:SharedArchiveFile={archive}",
            "-Xlog:disable",
            "-cp",
            self.cp,
            "-version",
        ]
        try:
            checked = subprocess.run(command, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return checked.returncode == 0


def _remove_stale(folder: Path, name: str) -> None:
    """Remove ``name``'s archives unused for :data:`ARCHIVE_KEEP_S` (another class path or
    ``java`` build) and dumps left by a process that died before publishing one."""
    now = time.time()
    for path in [*folder.glob(f"{name}-*.jsa"), *folder.glob(f"{name}-*.tmp")]:
        with contextlib.suppress(OSError):
            stat = path.stat()
            keep = ARCHIVE_KEEP_S if path.suffix == ".jsa" else DUMP_KEEP_S
            if now - max(stat.st_atime, stat.st_mtime) > keep:
                path.unlink()
