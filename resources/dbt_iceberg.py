"""A dbt-duckdb source plugin that reads Iceberg tables through the pyiceberg catalog.

dbt-duckdb's built-in ``iceberg`` plugin loads a whole table into memory (``scan().to_arrow()``);
this one hands DuckDB a stream of record batches at the table's current committed snapshot
(``to_arrow_batch_reader()``), with any ``row_filter`` / ``selected_fields`` from the source's
``meta`` pushed down into the Iceberg scan. It never globs data files, so uncommitted or deleted
files are never read. Configure it in ``dbt/profiles.yml``::

    plugins:
      - module: resources.dbt_iceberg
        alias: iceberg
        config: {state_dir: .platform}            # embedded catalog, or:
        # config: {catalog_name: prod, properties: {type: rest, uri: ...}}
"""

from __future__ import annotations

from typing import Any

from dbt.adapters.duckdb.plugins import BasePlugin
from dbt.adapters.duckdb.utils import SourceConfig

from resources.iceberg import IcebergCatalogResource

SCAN_KEYS = ("row_filter", "selected_fields", "snapshot_id", "limit")


class Plugin(BasePlugin):
    """Loads ``{schema}.{identifier}`` (or ``meta.iceberg_table``) as a record-batch stream."""

    def initialize(self, plugin_config: dict[str, Any]) -> None:
        resource = IcebergCatalogResource(
            catalog_name=plugin_config.get("catalog_name", "platform"),
            properties=plugin_config.get("properties", {}),
            state_dir=plugin_config.get("state_dir", ".platform"),
        )
        self._catalog = resource.load_catalog()

    def load(self, source_config: SourceConfig) -> Any:
        identifier = source_config.get("iceberg_table", "{schema}.{identifier}")
        table = self._catalog.load_table(identifier.format(**source_config.as_dict()))
        scan = {key: source_config[key] for key in SCAN_KEYS if key in source_config}
        if "selected_fields" in scan:
            scan["selected_fields"] = tuple(scan["selected_fields"])
        return table.scan(**scan).to_arrow_batch_reader()
