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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from resources.jvm import quarkus_runner
from tests.support.jvm_server import JvmServer

MAIN_CLASS = "io.quarkus.runner.GeneratedMain"
"""The runner jar's ``Main-Class`` (names its class data sharing archive)."""
CCOMPAT_PATH = "/apis/ccompat/v7"
"""Apicurio's Confluent Schema Registry API (v7 of Confluent's REST API)."""


class SchemaRegistryStartError(RuntimeError):
    """The Schema Registry did not come up."""


class EmbeddedSchemaRegistry(JvmServer):
    """Apicurio Registry on a free loopback port; a context manager that always stops it
    (:class:`~tests.support.jvm_server.JvmServer`).

    Example:
        >>> with EmbeddedSchemaRegistry(tmp_dir / "registry.log") as registry:
        ...     SchemaRegistryClient({"url": registry.url}).get_subjects()
        []
    """

    name = "the Schema Registry"
    error = SchemaRegistryStartError

    def __init__(
        self,
        log_path: Path,
        heap_mb: int = 256,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(log_path, heap_mb, start_timeout_s, stop_timeout_s)

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (a ``SchemaRegistryClient``'s ``url``)."""
        return f"{self.base_url}{CCOMPAT_PATH}"

    def main(self, port: int) -> tuple[str, str, list[str], dict[str, str]]:
        """The runner jar (built once), on ``port``. No variables: the registry reads many
        settings from the environment (``HTTP_PORT``, ``LOG_LEVEL``,
        ``REGISTRY_DATASOURCE_URL``, ``AUTH_ENABLED``...), and none of the caller's leak in."""
        runner = str(quarkus_runner("schema-registry"))
        arguments = [f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1", "-jar", runner]
        return MAIN_CLASS, runner, arguments, {}

    def serves(self) -> bool:
        """``GET /subjects`` of the Confluent API answers 200 with a JSON list."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as response:
                return response.status == 200 and isinstance(json.load(response), list)
        except (OSError, urllib.error.URLError, ValueError):
            return False


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
