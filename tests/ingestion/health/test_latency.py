"""Produce -> queryable latency read from a table (real SQL catalog): each record's Kafka
timestamp against the commit time of the first snapshot whose offsets cover it, over the
records produced in a window; percentiles by nearest rank."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from ingestion.health.latency import Latency, measure_latency, percentile
from ingestion.table.offsets import TopicOffsets, commit_properties
from ingestion.table.schema import load_or_create_table
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "latency")


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.0, 1.0), (0.25, 1.0), (0.5, 2.0), (0.75, 3.0), (0.95, 4.0), (1.0, 4.0)],
)
def test_percentiles_by_nearest_rank_whatever_the_order(q: float, expected: float) -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == expected


def test_one_value_is_every_percentile() -> None:
    assert {percentile([7.5], q) for q in (0.0, 0.5, 1.0)} == {7.5}


def new_table(tmp_path: Path) -> Table:
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    return load_or_create_table(catalog, SPEC)


def commit(table: Table, stamps_ms: dict[int, int], next_offset: int) -> int:
    """Commit rows of ``orders[0]`` (offset -> Kafka timestamp) with the group's next offset;
    return the snapshot's commit time."""
    rows = []
    for offset, stamp in stamps_ms.items():
        at = dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)
        rows.append(
            {
                "id": offset,
                "_kafka_topic": "orders",
                "_kafka_partition": 0,
                "_kafka_offset": offset,
                "_kafka_timestamp": at,
            }
        )
    properties = commit_properties(
        group_id=SPEC.consumer_group_id,
        offsets={"orders": TopicOffsets("id", {0: next_offset})},
        commit_id=f"c{next_offset}",
        cluster_id="k",
        pipeline=SPEC.name,
    )
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())), properties)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.timestamp_ms


def test_each_record_counts_from_its_timestamp_to_the_commit_that_first_covered_it(
    tmp_path: Path,
) -> None:
    table = load_or_create_table(
        IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog(), SPEC
    )
    now = int(time.time() * 1000)
    first = commit(table, {0: now - 3000, 1: now - 1000}, 2)
    time.sleep(0.05)  # the second commit is later
    second = commit(table, {2: now - 2000, 3: now - 60_000}, 4)
    expected = sorted(
        [(first - now + 3000) / 1000, (first - now + 1000) / 1000, (second - now + 2000) / 1000]
    )
    # Offset 3 was produced before the window: left out; the two commits fall inside.
    latency = measure_latency(table, SPEC.consumer_group_id, now - 10_000, second + 1)
    assert latency == Latency(
        records=3,
        p50_s=expected[1],
        p95_s=expected[2],
        max_s=expected[2],
        commits=2,
        commit_interval_s=(second - first) / 1000,
    )
    assert latency.line().startswith("3 records: produce->queryable p50 ")


def test_a_window_without_records_measures_nothing(tmp_path: Path) -> None:
    table = load_or_create_table(
        IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog(), SPEC
    )
    now = int(time.time() * 1000)
    committed = commit(table, {0: now - 3000}, 1)
    latency = measure_latency(table, SPEC.consumer_group_id, now, committed + 1)
    assert latency == Latency(0, 0.0, 0.0, 0.0, 1, 0.0)
