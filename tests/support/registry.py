"""The tests' Schema Registry: Apicurio Registry 2.4.2.Final in a JVM of its own, spoken to
through its Confluent-compatible API, as the platform speaks to a Schema Registry in production.

``EmbeddedSchemaRegistry`` runs the Quarkus runner jar that ``resources/jvm/schema-registry``
builds (``resources.jvm.quarkus_runner``, once per pom) on a free loopback port, with in-memory
H2 storage (each start is empty). Its :attr:`~EmbeddedSchemaRegistry.url` is what a pipeline's
``schema_registry_url`` (or ``schema_registry.url`` of the platform configuration) holds:
confluent-kafka's ``SchemaRegistryClient``, ``AvroSerializer`` and the engine use it unchanged.
One difference from Confluent's server shows in tests: registering an incompatible schema gives
HTTP 409 with ``error_code`` 0 (Confluent's server: 409 with ``error_code`` 409).

``make_registry`` is confluent-kafka's in-memory client, kept for one unit-level test only.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from resources.embedded import find_free_port
from resources.jvm import java_binary, quarkus_runner
from resources.process import ManagedProcess

MAIN_CLASS = "io.quarkus.runner.GeneratedMain"
"""The runner jar's ``Main-Class`` (names its class data sharing archive)."""
CCOMPAT_PATH = "/apis/ccompat/v7"
"""Apicurio's Confluent Schema Registry API (v7 of Confluent's REST API)."""


class SchemaRegistryStartError(RuntimeError):
    """The Schema Registry did not come up."""


class EmbeddedSchemaRegistry(ManagedProcess):
    """Apicurio Registry on a free loopback port; a context manager that always stops it (its
    own process group, SIGTERM then SIGKILL).

    Example:
        >>> with EmbeddedSchemaRegistry(tmp_dir / "registry.log") as registry:
        ...     SchemaRegistryClient({"url": registry.url}).get_subjects()
        []
    """

    def __init__(
        self,
        log_path: Path,
        heap_mb: int = 256,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.log_path = log_path
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port: int | None = None
        self.started_in_s: float | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (a ``SchemaRegistryClient``'s ``url``)."""
        if self.port is None:
            raise SchemaRegistryStartError("the Schema Registry is not started")
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def _environment(self) -> dict[str, str]:
        """Only what the JVM needs: the registry reads many settings from the environment
        (``HTTP_PORT``, ``LOG_LEVEL``, ``REGISTRY_DATASOURCE_URL``, ``AUTH_ENABLED``...), so
        none of the caller's leak in; ``HOME`` is its own folder."""
        home = self.log_path.parent / "schema-registry-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        if "JAVA_HOME" in os.environ:
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        return env

    def _serves(self) -> bool:
        """``GET /subjects`` of the Confluent API answers 200 with a JSON list."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as response:
                return response.status == 200 and isinstance(json.load(response), list)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def start(self, attempts: int = 3) -> Self:
        """Start the registry and wait until its Confluent API answers; retry on a port race."""
        runner = quarkus_runner("schema-registry")
        started = time.monotonic()
        for _ in range(attempts):
            port = find_free_port()
            self.port = port
            command = [
                java_binary(),
                f"-Xmx{self.heap_mb}m",
                "-Xms32m",
                "-XX:+UseSerialGC",  # one GC thread: these machines have 2 cores and many servers
                "-XX:TieredStopAtLevel=1",  # C1 only: a test registry starts sooner, runs enough
                *self.class_sharing_options(MAIN_CLASS, str(runner)),
                "-Djava.awt.headless=true",
                f"-Dquarkus.http.port={port}",
                "-Dquarkus.http.host=127.0.0.1",
                "-jar",
                str(runner),
            ]
            self.spawn(command, env=self._environment(), cwd=runner.parent)
            if self.wait_listening(port, self.start_timeout_s, interval_s=0.2, ready=self._serves):
                self.started_in_s = time.monotonic() - started
                return self
            self.stop()
        self.port = None
        raise SchemaRegistryStartError(
            f"the Schema Registry did not start; its log follows:\n{self.read_log()}"
        )

    def stop(self) -> None:
        """Stop the registry (its in-memory schemas are gone with it)."""
        super().stop()
        self.port = None


def make_registry() -> Any:
    """confluent-kafka's in-memory Schema Registry client, for the registry-outage unit test.

    A stand-in is used there, not :class:`EmbeddedSchemaRegistry`, because that test needs a
    registry that fails its first N calls and then recovers, which a real server cannot be made
    to do on cue (stopping it loses its in-memory schemas, and a restart takes seconds). Every
    test of end-to-end behaviour uses the real registry. The client lives at a private path in
    confluent-kafka 2.16 (``mock://`` URLs are not auto-mocked), and is per process.
    """
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
        MockSchemaRegistryClient,
    )

    return MockSchemaRegistryClient({"url": "mock://tests"})
