"""A throw-away SQL catalog (SQLite file and local warehouse under a test's ``tmp_path``) with
one namespace ``n``: the real catalog for tests that need a table and no Kafka; and the small
partitioned table several of them write to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType


def local_catalog(tmp_path: Path, name: str = "c") -> SqlCatalog:
    """A new SQL catalog named ``name`` in ``tmp_path``, its namespace ``n`` created."""
    catalog = SqlCatalog(
        name, uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("n")
    return catalog


def region_table(catalog: SqlCatalog, **create: Any) -> Table:
    """Table ``n.t`` of ``region`` (string) and ``n`` (long), partitioned by ``region``
    (identity); ``create``: more ``create_table`` arguments (properties, sort order)."""
    schema = Schema(
        NestedField(1, "region", StringType(), required=False),
        NestedField(2, "n", LongType(), required=False),
    )
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "region"))
    return catalog.create_table("n.t", schema, partition_spec=spec, **create)
