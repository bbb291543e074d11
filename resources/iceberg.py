"""The Iceberg catalog resource: catalog name and properties handed to ``pyiceberg``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field

from resources.secrets import resolve, resolve_all

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def embedded_catalog_properties(state_dir: str | Path) -> dict[str, str]:
    """Return properties of the embedded catalog: SQLite file and warehouse under ``state_dir``.

    Example:
        >>> props = embedded_catalog_properties("/tmp/platform")
        >>> props["uri"], props["warehouse"]
        ('sqlite:////tmp/platform/catalog.db', 'file:///tmp/platform/warehouse')
    """
    root = Path(state_dir).resolve()
    return {
        "type": "sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": (root / "warehouse").as_uri(),
    }


# FileIO property prefixes (pyiceberg.io): what executors need to read and write the warehouse.
FILE_IO_PREFIXES = ("s3.", "gcs.", "adls.", "hdfs.", "oss.", "client.", "py-io-impl")


def file_io_subset(properties: dict[str, str]) -> dict[str, str]:
    """The FileIO properties among catalog properties (no catalog URI, no catalog credential).

    Example:
        >>> file_io_subset({"uri": "postgresql://db", "s3.endpoint": "http://s3", "type": "sql"})
        {'s3.endpoint': 'http://s3'}
    """
    return {k: v for k, v in properties.items() if k.startswith(FILE_IO_PREFIXES)}


def pyiceberg_catalog_config(name: str) -> dict[str, Any] | None:
    """pyiceberg's own configuration of catalog ``name`` (``.pyiceberg.yaml`` in
    ``$PYICEBERG_HOME`` or home, ``PYICEBERG_CATALOG__<NAME>__*``), read now; None if absent."""
    from pyiceberg.utils.config import Config

    found = Config().get_catalog_config(name)
    return dict(found) if found else None


class IcebergCatalogResource(ConfigurableResource):
    """An Iceberg catalog, loaded with ``pyiceberg.catalog.load_catalog(name, **properties)``.

    Which catalog: ``properties`` when given (any pyiceberg catalog: REST, Glue, Hive, SQL on
    PostgreSQL...); else pyiceberg's own configuration of ``catalog_name`` when it has one;
    else the embedded SQLite catalog with its warehouse under ``state_dir``. ``file_io`` (S3,
    GCS, ADLS properties) is added to the catalog's properties and is all the executors receive
    (:meth:`io_properties`). Values may be ``${NAME}`` references, resolved at use; the one
    secret a catalog usually needs may also be given as ``credential`` (an ``EnvVar``).
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    catalog_name: str = Field(default="platform", description="Name given to load_catalog.")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="pyiceberg catalog properties; empty = pyiceberg's config, else embedded.",
    )
    file_io: dict[str, str] = Field(
        default_factory=dict, description="FileIO properties (s3.*, gcs.*, adls.*) for all IO."
    )
    credential: str | None = Field(default=None, description="Catalog credential; an EnvVar.")
    state_dir: str = Field(
        default=".platform", description="Where the embedded catalog and warehouse live."
    )

    def source(self) -> str:
        """``properties``, ``pyiceberg`` (its own config of ``catalog_name``) or ``embedded``."""
        if self.properties:
            return "properties"
        return "pyiceberg" if pyiceberg_catalog_config(self.catalog_name) else "embedded"

    def embedded_state_dir(self) -> Path:
        """The embedded catalog's folder (``state_dir`` resolved)."""
        return Path(resolve(self.state_dir, "catalog.state_dir"))

    def catalog_properties(self) -> dict[str, str]:
        """Return the properties passed to pyiceberg, secrets included (never log them).

        With pyiceberg's own configuration in use they are that configuration as read now
        (pyiceberg itself reads its environment once, at import), with ``file_io`` over it.
        """
        source = self.source()
        if source == "properties":
            properties = resolve_all(self.properties, "catalog.properties")
        elif source == "pyiceberg":
            found = pyiceberg_catalog_config(self.catalog_name) or {}
            properties = {k: str(v) for k, v in found.items()}
        else:
            properties = embedded_catalog_properties(self.embedded_state_dir())
        properties.update(resolve_all(self.file_io, "file_io"))
        if self.credential:
            properties["credential"] = self.credential
        return properties

    def io_properties(self) -> dict[str, str]:
        """What executors get to build their FileIO: ``file_io`` and the catalog's own FileIO
        properties; never the catalog URI or credential."""
        return file_io_subset(self.catalog_properties())

    def load_catalog(self) -> Catalog:
        """Load the catalog; the embedded one creates its folder on first use."""
        from pyiceberg.catalog import load_catalog

        if self.source() == "embedded":
            (self.embedded_state_dir() / "warehouse").mkdir(parents=True, exist_ok=True)
        return load_catalog(self.catalog_name, **self.catalog_properties())
