"""A dbt-duckdb source plugin that reads Iceberg tables through the pyiceberg catalog.

dbt-duckdb's built-in ``iceberg`` plugin loads a whole table into memory (``scan().to_arrow()``);
this one hands DuckDB a stream of record batches at the table's current committed snapshot
(``to_arrow_batch_reader()``), with any ``row_filter`` / ``selected_fields`` from the source's
``meta`` pushed down into the Iceberg scan. It never globs data files, so uncommitted or deleted
files are never read. The catalog is the platform configuration's (``$PLATFORM_CONFIG``:
``catalog`` and ``file_io``), as for the ingestion; ``config`` in ``dbt/profiles.yml`` may
override ``catalog_name``, ``properties`` or the embedded ``state_dir``::

    plugins:
      - module: resources.dbt_iceberg
        alias: iceberg
        config: {state_dir: .platform}            # the embedded catalog's folder
"""

from __future__ import annotations

from typing import Any

from dbt.adapters.duckdb.plugins import BasePlugin
from dbt.adapters.duckdb.utils import SourceConfig

from resources.config import load_config
from resources.factory import iceberg_resource
from resources.iceberg import IcebergCatalogResource

OVERRIDES = ("catalog_name", "properties", "state_dir")
SCAN_KEYS = ("row_filter", "selected_fields", "snapshot_id", "limit")


class Plugin(BasePlugin):
    """Loads ``{schema}.{identifier}`` (or ``meta.iceberg_table``) as a record-batch stream."""

    def initialize(self, plugin_config: dict[str, Any]) -> None:
        resource = iceberg_resource(load_config())  # the platform's one configuration
        overrides = {k: plugin_config[k] for k in OVERRIDES if plugin_config.get(k)}
        if overrides:  # the embedded catalog's folder as dbt sees it (profiles.yml)
            resource = IcebergCatalogResource(**{**resource.model_dump(), **overrides})
        self._catalog = resource.load_catalog()

    def load(self, source_config: SourceConfig) -> Any:
        identifier = source_config.get("iceberg_table", "{schema}.{identifier}")
        table = self._catalog.load_table(identifier.format(**source_config.as_dict()))
        scan = {key: source_config[key] for key in SCAN_KEYS if key in source_config}
        if "selected_fields" in scan:
            scan["selected_fields"] = tuple(scan["selected_fields"])
        return table.scan(**scan).to_arrow_batch_reader()
