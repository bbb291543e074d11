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
import urllib.error
import urllib.request
from pathlib import Path

from resources.jvm import LOG4J2_CONFIG, class_path
from tests.support.jvm_server import JvmServer

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


class RestCatalogServer(JvmServer):
    """``RESTCatalogServer`` on a free loopback port with ``catalog_properties``; a context
    manager that always stops it (:class:`~tests.support.jvm_server.JvmServer`).

    Example:
        >>> with RestCatalogServer(tmp_dir / "rest.log", {"warehouse": "s3://lake/w"}) as rest:
        ...     rest.uri.startswith("http://127.0.0.1:")
        True
    """

    name = "the Iceberg REST catalog"
    error = RestCatalogStartError

    def __init__(
        self,
        log_path: Path,
        catalog_properties: dict[str, str],
        heap_mb: int = 256,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(log_path, heap_mb, start_timeout_s, stop_timeout_s)
        self.catalog_properties = dict(catalog_properties)

    @property
    def uri(self) -> str:
        """The catalog's base URI (pyiceberg's ``uri`` of a ``type: rest`` catalog)."""
        return self.base_url

    def main(self, port: int) -> tuple[str, str, list[str], dict[str, str]]:
        """The catalog's variables only (the base environment keeps the caller's credentials,
        AWS_* and other CATALOG_*, out, and no ``~/.aws`` profile is read)."""
        cp = class_path("rest-catalog")
        properties = {**self.catalog_properties, "rest.port": str(port)}
        variables = {environment_name(key): value for key, value in properties.items()}
        arguments = [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}", "-cp", cp, MAIN_CLASS]
        return MAIN_CLASS, cp, arguments, variables

    def serves(self) -> bool:
        """``GET /v1/config`` answers with the catalog's defaults."""
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=5) as r:
                return r.status == 200 and "defaults" in json.load(r)
        except (OSError, urllib.error.URLError, ValueError):
            return False
