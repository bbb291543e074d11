"""Apache Iceberg's reference REST catalog server for the tests, in a JVM of its own.

``org.apache.iceberg.rest.RESTCatalogServer`` (the server of the ``apache/iceberg-rest-fixture``
image; jars from ``resources/jvm/rest-catalog/pom.xml``) serves the Iceberg REST API in front of
any Java catalog. It reads its configuration from the environment only: each ``CATALOG_*``
variable becomes a catalog property (``CATALOG_`` dropped, ``__`` -> ``-``, ``_`` -> ``.``,
lower-cased: ``CATALOG_S3_ACCESS__KEY__ID`` -> ``s3.access-key-id``), ``rest.port`` among them;
without ``catalog-impl`` it is a JDBC catalog on ``uri``. The tests give it a JDBC catalog on
their PostgreSQL and ``S3FileIO`` on their S3 API server, as a deployment's catalog service would
have. Its log (warnings only, ``resources/jvm/log4j2.properties``) goes to one file; the
server's INFO line that prints every catalog property, passwords included, is not logged.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from resources.embedded import find_free_port
from resources.jvm import LOG4J2_CONFIG, class_path, java_binary
from resources.process import ManagedProcess

MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"


class RestCatalogStartError(RuntimeError):
    """The REST catalog server did not come up."""


def environment_name(key: str) -> str:
    """The ``CATALOG_*`` variable RESTCatalogServer reads catalog property ``key`` from.

    Example:
        >>> environment_name("s3.access-key-id"), environment_name("catalog-impl")
        ('CATALOG_S3_ACCESS__KEY__ID', 'CATALOG_CATALOG__IMPL')
    """
    if "_" in key or key != key.lower():
        raise ValueError(f"catalog property {key!r} cannot be spelt as a CATALOG_* variable")
    return "CATALOG_" + key.replace("-", "__").replace(".", "_").upper()


class RestCatalogServer(ManagedProcess):
    """``RESTCatalogServer`` on a free loopback port with ``catalog_properties``; a context
    manager that always stops it (its own process group, SIGTERM then SIGKILL).

    Example:
        >>> with RestCatalogServer(tmp_dir / "rest.log", {"warehouse": "s3://lake/w"}) as rest:
        ...     rest.uri.startswith("http://127.0.0.1:")
        True
    """

    def __init__(
        self,
        log_path: Path,
        catalog_properties: dict[str, str],
        heap_mb: int = 256,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self.log_path = log_path
        self.catalog_properties = dict(catalog_properties)
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port: int | None = None
        self.started_in_s: float | None = None

    @property
    def uri(self) -> str:
        """The catalog's base URI (pyiceberg's ``uri`` of a ``type: rest`` catalog)."""
        if self.port is None:
            raise RestCatalogStartError("the REST catalog server is not started")
        return f"http://127.0.0.1:{self.port}"

    def _environment(self, port: int) -> dict[str, str]:
        """Only what the JVM needs and the catalog's variables: no credentials of the caller's
        environment (AWS_*, other CATALOG_*) leak into the server, and ``HOME`` is its own
        folder, so no ``~/.aws`` profile is read."""
        home = self.log_path.parent / "rest-catalog-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        if "JAVA_HOME" in os.environ:
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        properties = {**self.catalog_properties, "rest.port": str(port)}
        env |= {environment_name(key): value for key, value in properties.items()}
        return env

    def _serves(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/config", timeout=5) as r:
                return r.status == 200 and "defaults" in json.load(r)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def start(self, attempts: int = 3) -> Self:
        """Start the server and wait until ``GET /v1/config`` answers; retry on a port race."""
        cp = class_path("rest-catalog")
        started = time.monotonic()
        for _ in range(attempts):
            port = find_free_port()
            self.port = port
            command = [
                java_binary(),
                f"-Xmx{self.heap_mb}m",
                "-Xms32m",
                "-XX:+UseSerialGC",  # one GC thread: these machines have 2 cores and many servers
                "-XX:TieredStopAtLevel=1",  # C1 only: a test catalog starts sooner, runs enough
                *self.class_sharing_options(MAIN_CLASS, cp),
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
                "-cp",
                cp,
                MAIN_CLASS,
            ]
            self.spawn(command, env=self._environment(port))
            if self.wait_listening(port, self.start_timeout_s, interval_s=0.2, ready=self._serves):
                self.started_in_s = time.monotonic() - started
                return self
            self.stop()
        self.port = None
        raise RestCatalogStartError(
            f"the Iceberg REST catalog did not start; its log follows:\n{self.read_log()}"
        )
