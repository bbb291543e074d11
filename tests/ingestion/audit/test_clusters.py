"""The full audit's allowance for duplicates across clusters: the ranges each cluster's commits
read (a reset or a switch reads nothing), how many clusters hold an offset, and which
coordinates are duplicates: rows recording their cluster by (cluster, coordinate), rows written
before the column by that allowance. Real SQL catalog; commits as the engine writes them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.audit.clusters import (
    allowed_copies,
    count_duplicates,
    holders,
    read_labelled,
    read_ranges,
)
from ingestion.table.offsets import FAILOVER_TO, RESET_BY, TopicOffsets, commit_properties
from ingestion.table.route import ROUTE
from ingestion.table.schema import CLUSTER_COLUMN, load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "clusters")
GROUP = SPEC.consumer_group_id


def row(offset: int, cluster: str | None, partition: int = 0) -> dict[str, object]:
    at = dt.datetime(2026, 11, 23, 10, tzinfo=dt.UTC)
    return {
        "id": offset,
        "_kafka_topic": "orders",
        "_kafka_partition": partition,
        "_kafka_offset": offset,
        "_kafka_timestamp": at,
        CLUSTER_COLUMN: cluster,
    }


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """orders read on the primary to 60 (partition 1 to 5), a failover to dr at 50, then dr
    read to 62 (identity naming: the same topic name on both clusters)."""
    table = load_or_create_table(
        IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog(), SPEC
    )
    schema = schema_to_pyarrow(table.schema())

    def commit(
        rows: list[dict[str, object]], cluster: str, to: dict[int, int], **extra: str
    ) -> None:
        properties = commit_properties(
            group_id=GROUP,
            offsets={"orders": TopicOffsets(cluster, to)},
            commit_id=f"c{len(table.metadata.snapshots)}",
            cluster_id=cluster,
            pipeline=SPEC.name,
        )
        table.append(pa.Table.from_pylist(rows, schema=schema), {**properties, **extra})

    commit([row(o, None) for o in range(40, 60)], "primary", {0: 60, 1: 5})
    commit([], "dr", {0: 50, 1: 5}, **{RESET_BY: "ops", FAILOVER_TO: "dr"})  # the switch
    route = orjson.dumps({FAILOVER_TO: "dr"}).decode()
    commit([row(o, "dr") for o in range(50, 62)], "dr", {0: 62, 1: 5}, **{ROUTE: route})
    return table


def test_each_clusters_ranges_and_the_switch_reads_nothing(table: Table) -> None:
    assert read_ranges(table, GROUP) == {
        ("orders", 0): {"primary": [(0, 60)], "dr": [(50, 62)]},
        ("orders", 1): {"primary": [(0, 5)]},
    }


@pytest.mark.parametrize(
    ("coordinates", "allowed"),
    [
        (("orders", 0, 55), 2),
        (("orders", 0, 45), 1),
        (("orders", 0, 61), 1),
        (("orders", 1, 3), 1),
        (("other", 0, 55), 1),
    ],
    ids=["read-on-both", "primary-only", "dr-only", "one-cluster-partition", "other-topic"],
)
def test_an_offset_may_occur_once_per_cluster_that_read_it(
    table: Table, coordinates: tuple[str, int, int], allowed: int
) -> None:
    assert allowed_copies(table, GROUP)(coordinates) == allowed


def test_holders_count_clusters_not_ranges_and_at_least_one() -> None:
    by_cluster = {"dr": [(0, 5), (3, 9)], "primary": [(4, 6)]}
    assert [holders(by_cluster, o) for o in (0, 4, 7, 20)] == [1, 2, 1, 1]


def test_every_rows_coordinates_and_cluster_are_read(table: Table) -> None:
    rows = read_labelled(table)
    assert len(rows) == 32
    assert (("orders", 0, 40), None) in rows
    assert (("orders", 0, 55), "dr") in rows
    assert (("orders", 0, 55), None) in rows


def test_the_tables_rows_hold_no_duplicate_until_a_cluster_repeats_one(table: Table) -> None:
    allowed = allowed_copies(table, GROUP)
    rows = read_labelled(table)
    assert count_duplicates(rows, allowed) == []
    again = [*rows, (("orders", 0, 55), "dr"), (("orders", 0, 45), None)]
    assert count_duplicates(again, allowed) == [("orders", 0, 45), ("orders", 0, 55)]
    assert count_duplicates([], allowed) == []
