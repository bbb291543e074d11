"""A test's HTTP server in a JVM of its own (the Iceberg REST catalog, the Schema Registry).

:class:`JvmServer` starts ``java`` with the options every such server shares (bounded heap, one
GC thread, C1 only, class data sharing), on a free loopback port, in an environment of its own
(``PATH``, ``JAVA_HOME`` and its own ``HOME``: no credential or setting of the caller's
environment leaks in), and waits until :meth:`JvmServer.serves` holds; a port taken between
choosing and binding it is retried on another. A context manager that always stops it (its own
process group, SIGTERM then SIGKILL). A subclass says how to start it (:meth:`JvmServer.main`)
and when it serves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar, Self

from resources.embedded import find_free_port
from resources.jvm import java_binary
from resources.process import ManagedProcess


class JvmServer(ManagedProcess):
    """One JVM server on a free loopback port (module docstring)."""

    name: ClassVar[str] = "the server"
    """How errors name it ("the Iceberg REST catalog")."""
    error: ClassVar[type[RuntimeError]] = RuntimeError
    """What :meth:`start` raises when it does not come up."""

    def __init__(
        self, log_path: Path, heap_mb: int, start_timeout_s: float, stop_timeout_s: float
    ) -> None:
        self.log_path = log_path
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port: int | None = None
        self.started_in_s: float | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` while it runs."""
        if self.port is None:
            raise self.error(f"{self.name} is not started")
        return f"http://127.0.0.1:{self.port}"

    def main(self, port: int) -> tuple[str, str, list[str], dict[str, str]]:
        """How to start it on ``port``: (main class, class path or runner jar, the arguments
        after the shared options, more environment variables)."""
        raise NotImplementedError

    def serves(self) -> bool:
        """Whether it answers its readiness request now."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """``PATH``, ``JAVA_HOME`` and a ``HOME`` of its own (next to its log)."""
        home = self.log_path.parent / f"{self.log_path.stem}-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        if "JAVA_HOME" in os.environ:
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        return env

    def start(self, attempts: int = 3) -> Self:
        """Start it and wait until it serves; retry on a port race."""
        started = time.monotonic()
        for _ in range(attempts):
            port = find_free_port()
            self.port = port
            main_class, path, arguments, variables = self.main(port)
            command = [
                java_binary(),
                f"-Xmx{self.heap_mb}m",
                "-Xms32m",
                "-XX:+UseSerialGC",  # one GC thread: these machines have 2 cores and many servers
                "-XX:TieredStopAtLevel=1",  # C1 only: a test server starts sooner, runs enough
                *self.class_sharing_options(main_class, path),
                "-Djava.awt.headless=true",
                *arguments,
            ]
            self.spawn(command, env=self.environment() | variables, cwd=self.log_path.parent)
            if self.wait_listening(port, self.start_timeout_s, interval_s=0.2, ready=self.serves):
                self.started_in_s = time.monotonic() - started
                return self
            self.stop()
        self.port = None
        raise self.error(f"{self.name} did not start; its log follows:\n{self.read_log()}")

    def stop(self) -> None:
        """Stop it (whatever it held in memory is gone with it)."""
        super().stop()
        self.port = None
