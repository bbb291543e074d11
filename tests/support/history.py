"""Real Iceberg tables whose snapshots carry given properties: a table's history, written by hand.

Unit tests of what the engine reads from snapshot properties (routes, switches, carried
routes, reverse copies) build the history they need on a real SQL catalog, with no Kafka.
"""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

from ingestion.table.offsets import (
    CLUSTER_ID,
    GROUP_ID,
    OFFSETS_PREFIX,
    TopicOffsets,
    encode_offsets,
)


def table_with_history(tmp_path: Path, *commits: dict[str, str]) -> Table:
    """A table ``n.t`` under ``tmp_path`` whose snapshots carry ``commits``' properties, oldest
    first (each an empty append)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        "h", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", Schema(NestedField(1, "x", LongType(), required=False)))
    for properties in commits:
        with (
            table.transaction() as transaction,
            transaction.update_snapshot(snapshot_properties=properties).fast_append(),
        ):
            pass
    return catalog.load_table("n.t")


def group_commit(group: str, cluster: str, offsets: dict[str, int], **extra: str) -> dict[str, str]:
    """The properties of a commit of ``group`` under cluster id ``cluster``, with partition 0 of
    each topic at its offset, plus ``extra``."""
    mapped = {topic: TopicOffsets(f"id-{topic}", {0: at}) for topic, at in offsets.items()}
    return {
        GROUP_ID: group,
        CLUSTER_ID: cluster,
        OFFSETS_PREFIX + group: encode_offsets(mapped),
        **extra,
    }
