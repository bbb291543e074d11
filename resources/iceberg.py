"""The Iceberg catalog resource: catalog name and properties handed to ``pyiceberg``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field

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


class IcebergCatalogResource(ConfigurableResource):
    """An Iceberg catalog, loaded with ``pyiceberg.catalog.load_catalog(name, **properties)``.

    With no ``properties`` it is the embedded SQLite catalog with its warehouse under
    ``state_dir``. In production pass the catalog's own properties (REST, Glue, Hive, SQL on
    PostgreSQL, S3 warehouse); give the one secret a catalog usually needs as ``credential``
    (an ``EnvVar``), which becomes pyiceberg's ``credential`` property.
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt setting fails at load

    catalog_name: str = Field(default="platform", description="Name given to load_catalog.")
    properties: dict[str, str] = Field(
        default_factory=dict, description="pyiceberg catalog properties; empty = embedded."
    )
    credential: str | None = Field(default=None, description="Catalog credential; an EnvVar.")
    state_dir: str = Field(
        default=".platform", description="Where the embedded catalog and warehouse live."
    )

    def catalog_properties(self) -> dict[str, str]:
        """Return the properties passed to pyiceberg, secrets included (never log them)."""
        properties = dict(self.properties) or embedded_catalog_properties(self.state_dir)
        if self.credential:
            properties["credential"] = self.credential
        return properties

    def load_catalog(self) -> Catalog:
        """Load the catalog; the embedded one creates its folder on first use."""
        from pyiceberg.catalog import load_catalog

        if not self.properties:
            (Path(self.state_dir) / "warehouse").mkdir(parents=True, exist_ok=True)
        return load_catalog(self.catalog_name, **self.catalog_properties())
