"""Keyed changes applied by copy-on-write on a real SQL catalog (no Kafka, no Spark): a
Debezium stream (``tests/support/debezium.py``: a snapshot, then hot-key inserts, updates and
deletes) applied batch by batch leaves exactly the source table's rows, read back by DuckDB
from the live files and by pyiceberg; each commit is one snapshot with its counts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import (
    DecimalType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from ingestion.formats.debezium import decode_changes
from ingestion.table.upsert import DELETES, INSERTS, UPDATES, commit_upsert, plan_upsert
from tests.support.catalogs import local_catalog
from tests.support.debezium import DebeziumTable, Record, expected, state_by_duckdb

KEY = ("id",)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "balance", DecimalType(10, 2), required=False),
    NestedField(4, "updated_at", TimestamptzType(), required=False),
    identifier_field_ids=[1],
)


@pytest.fixture(params=["bucket", "day"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Table:
    """Partitioned by the key's bucket, or by ``updated_at`` (a delete carries no
    ``updated_at``: its row is found by the key alone)."""
    catalog = local_catalog(tmp_path, "c")
    field = (
        PartitionField(1, 1000, BucketTransform(4), "id_bucket")
        if request.param == "bucket"
        else PartitionField(4, 1000, DayTransform(), "day")
    )
    return catalog.create_table("n.t", SCHEMA, partition_spec=PartitionSpec(field))


def apply(table: Table, events: list[Record]) -> dict[str, str]:
    arrow = SCHEMA.as_arrow()
    changes = decode_changes([v for _, v, _ in events], [k for k, _, _ in events], arrow, KEY)
    assert changes.rejections == []
    table.refresh()
    plan = plan_upsert(table, changes.table, KEY, arrow.names)
    commit_upsert(table, plan, {"batch": "x"})
    head = table.refresh().current_snapshot()
    assert head is not None
    assert head.summary is not None
    return dict(head.summary.additional_properties)


def test_a_debezium_stream_applied_in_batches_leaves_the_source_state(table: Table) -> None:
    source = DebeziumTable()
    rng = random.Random(5)
    counts = apply(table, source.snapshot(80))
    assert (counts[INSERTS], counts[UPDATES], counts[DELETES]) == ("80", "0", "0")
    for _ in range(6):
        summary = apply(table, source.random_changes(rng, 150, keys=120))
        assert int(summary[UPDATES]) > 0
    assert state_by_duckdb(table) == expected(source)
    back = table.scan().to_arrow()
    assert sorted(back.column("id").to_pylist()) == sorted(source.rows)


def test_a_delete_of_an_absent_key_and_a_repeated_tombstone_change_nothing(table: Table) -> None:
    source = DebeziumTable()
    apply(table, source.snapshot(5))
    gone = source.delete(3)  # d, then its tombstone
    summary = apply(table, gone)
    assert summary[DELETES] == "1"
    again = apply(table, [gone[-1]])  # the tombstone replayed alone
    assert (again[INSERTS], again[UPDATES], again[DELETES]) == ("0", "0", "0")
    assert state_by_duckdb(table) == expected(source)


def test_a_batch_touches_only_the_files_holding_its_keys(tmp_path: Path) -> None:
    """Unpartitioned, one file per snapshot batch of 100 keys: updating keys of one batch
    rewrites that file only (the key bounds prune the others)."""
    catalog = local_catalog(tmp_path, "c")
    flat = catalog.create_table("n.t", SCHEMA)
    source = DebeziumTable()
    for _ in range(4):
        apply(flat, source.snapshot(100))
    rng = random.Random(1)
    summary = apply(flat, [e for key in (120, 150, 199) for e in source.update(key, rng)])
    assert summary["kafka.cdc.rewritten-files"] == "1"
    assert summary[UPDATES] == "3"
    assert state_by_duckdb(flat) == expected(source)


def test_a_timestamp_key_finds_its_files_by_their_bounds(tmp_path: Path) -> None:
    """Bounds decode to microseconds, the batch's keys to datetimes: compared in one form."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from ingestion.table.upsert import candidate_files

    schema = Schema(
        NestedField(1, "at", TimestamptzType(), required=True), identifier_field_ids=[1]
    )
    keyed = local_catalog(tmp_path, "c").create_table("n.ts", schema)
    first = datetime(2026, 1, 1, tzinfo=UTC)
    keyed.append(
        pa.table({"at": pa.array([first], pa.timestamp("us", "UTC"))}, schema=schema.as_arrow())
    )
    later = datetime(2027, 1, 1, tzinfo=UTC)
    keys = pa.table({"at": pa.array([first, later], pa.timestamp("us", "UTC"))})
    assert len(candidate_files(keyed, keys, ("at",))) == 1
    assert candidate_files(keyed, keys.slice(1), ("at",)) == []


def test_composite_keys_that_join_alike_stay_two_keys(tmp_path: Path) -> None:
    """("x:y", "z") and ("x", "y:z") are two rows; deleting one keeps the other."""
    import pyarrow as pa

    schema = Schema(
        NestedField(1, "a", StringType(), required=True),
        NestedField(2, "b", StringType(), required=True),
        identifier_field_ids=[1, 2],
    )
    keyed = local_catalog(tmp_path, "c").create_table("n.pair", schema)
    keyed.append(pa.table({"a": ["x:y", "x"], "b": ["z", "y:z"]}, schema=schema.as_arrow()))
    delete = pa.table({"a": ["x:y"], "b": ["z"], "_cdc_op": ["d"]})
    plan = plan_upsert(keyed, delete, ("a", "b"), ["a", "b"])
    commit_upsert(keyed, plan, {})
    assert plan.deletes == 1
    assert keyed.refresh().scan().to_arrow().to_pylist() == [{"a": "x", "b": "y:z"}]


def test_the_source_log_position_orders_changes_across_partitions() -> None:
    """A key whose changes sit in two partitions (partitions added to the topic): the change
    with the later source.lsn wins, whatever partition sorts last."""
    import pyarrow as pa

    from ingestion.table.upsert import gather_changes

    newer_in_p0 = pa.table({"id": [1], "_cdc_op": ["u"], "_cdc_lsn": [200], "v": ["new"]})
    older_in_p1 = pa.table({"id": [1], "_cdc_op": ["d"], "_cdc_lsn": [100], "v": [None]})
    (winner,) = gather_changes([newer_in_p0, older_in_p1], ("id",)).to_pylist()
    assert winner["v"] == "new"


def test_a_failed_attempts_files_are_deleted_only_once_its_commit_is_absent(table: Table) -> None:
    """The commit raises CommitFailedException (the head moved): its files stay until the next
    attempt's prepare, which runs only after the caller found the commit id absent."""
    import pyarrow as pa
    from pyiceberg.exceptions import CommitFailedException

    from ingestion.table.upsert import ApplyChanges

    source = DebeziumTable()
    apply(table, source.snapshot(5))
    events = source.update(2, random.Random(1))
    arrow = SCHEMA.as_arrow()
    changes = decode_changes([v for _, v, _ in events], [k for k, _, _ in events], arrow, KEY)
    stale = table.catalog.load_table(table.name())  # a handle at this head
    apply(table, source.update(3, random.Random(2)))  # the head moves
    step = ApplyChanges(changes.table, KEY)
    step.prepare(stale, "p")
    assert step.plan is not None
    written = [f.file_path for f in step.plan.added]
    with pytest.raises(CommitFailedException):
        step(stale, {})
    assert all(stale.io.new_input(path).exists() for path in written)
    step.prepare(table.refresh(), "p")
    assert not any(stale.io.new_input(path).exists() for path in written)
    assert isinstance(step.changes, pa.Table)
