"""Small-file compaction on its own, on a real SQL catalog (no Kafka; Spark only as the reader of
the table's changes): which files a
pass merges (the prefix rule, per partition, capped per group), that a pass keeps every row in
one ``replace`` marked as compaction (which Spark's changelog reads as no change), sorted by a
declared sort order, and a second pass rewrites nothing, and what a group does
when the head moves under it (retried, replanned, or skipped; never raised, never resurrecting a
deleted row)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import NullOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from ingestion.ops.compaction import (
    MAINTENANCE,
    compact_small_files,
    pick_merge,
    plan_groups,
    target_file_bytes,
)
from ingestion.pipeline.hooks import FailureHooks
from ingestion.table.offsets import snapshot_properties
from tests.support.catalogs import local_catalog, region_table
from tests.support.iceberg_spark import OtherSpark


@pytest.mark.parametrize(
    ("counts", "chosen"),
    [
        ([10, 10, 10, 120], 3),  # new files beside a compacted one: only the new
        ([20, 120], 0),  # one small file beside a bigger one: nothing
        ([3, 10, 10], 3),  # a small old file joins a bigger new batch
        ([5], 0),  # below min_files
        ([], 0),
        ([1, 1, 5, 7], 4),  # 5 > 2 breaks the prefix, 7 <= 7 extends it again
        ([1, 2, 4, 8], 0),  # each holds more than all before: already compacted
    ],
)
def test_the_longest_prefix_whose_last_file_holds_no_more_than_all_before(
    counts: list[int], chosen: int
) -> None:
    assert pick_merge(counts) == chosen


def test_min_files_raises_the_bar() -> None:
    assert pick_merge([10, 10], min_files=3) == 0
    assert pick_merge([10, 10, 10], min_files=3) == 3


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """A table partitioned by ``region``, its target file size 64 KiB."""
    return region_table(
        local_catalog(tmp_path, "c"),
        properties={"write.target-file-size-bytes": str(64 * 1024)},
    )


def append(table: Table, region: str, numbers: range) -> None:
    """One small file of ``region`` holding ``numbers``."""
    rows = pa.table(
        {"region": pa.array([region] * len(numbers), pa.large_string()), "n": list(numbers)}
    )
    table.append(rows)


def elsewhere(table: Table) -> Table:
    """Another handle on ``table``: another writer (the pass's handle does not see it)."""
    return table.catalog.load_table(table.name())


def live_files(table: Table) -> dict[str, int]:
    """Data files per region."""
    files: dict[str, int] = {}
    for task in table.refresh().scan().plan_files():
        region = str(task.file.partition[0])
        files[region] = files.get(region, 0) + 1
    return files


def numbers(table: Table) -> list[int]:
    return sorted(table.refresh().scan().to_arrow().column("n").to_pylist())


def test_groups_are_per_partition_and_only_of_small_files(table: Table) -> None:
    for start in (0, 10, 20):
        append(table, "eu", range(start, start + 10))
    append(table, "us", range(100, 105))  # alone in its partition: nothing to merge with
    assert target_file_bytes(table) == 64 * 1024
    tasks = list(table.scan().plan_files())
    groups = plan_groups(tasks, target_file_bytes(table))
    assert [(key.split("/")[0], len(group)) for key, group in groups.items()] == [("0", 3)]
    # Files of at least half the target size are not small: nothing is planned.
    smallest = min(t.file.file_size_in_bytes for t in tasks)
    assert plan_groups(tasks, 2 * smallest - 2) == {}


def test_a_group_reads_at_most_two_target_sizes(table: Table) -> None:
    for start in range(0, 100, 10):
        append(table, "eu", range(start, start + 10))
    tasks = list(table.scan().plan_files())
    target = 3 * max(t.file.file_size_in_bytes for t in tasks)
    (group,) = plan_groups(tasks, target).values()
    assert 3 <= len(group) < 10  # the rest waits for the next pass
    assert sum(t.file.file_size_in_bytes for t in group) <= 2 * target


def test_a_pass_merges_each_partition_once_keeps_every_row_and_a_second_does_nothing(
    table: Table,
) -> None:
    for start in (0, 10, 20):
        append(table, "eu", range(start, start + 10))
        append(table, "us", range(100 + start, 110 + start))
    before = numbers(table)
    report = compact_small_files(table)
    assert (report.files_compacted, report.files_written, report.rows_rewritten) == (6, 2, 60)
    assert report.groups_skipped == []
    assert live_files(table) == {"eu": 1, "us": 1}
    assert numbers(table) == before
    head = table.current_snapshot()
    assert head is not None
    assert head.summary is not None
    assert head.summary.operation.value == "replace"
    assert snapshot_properties(head)[MAINTENANCE] == "compaction"
    snapshots = len(table.metadata.snapshots)
    again = compact_small_files(table)
    assert again.files_compacted == 0
    assert len(table.refresh().metadata.snapshots) == snapshots


def test_an_append_landing_before_the_commit_is_retried_over(table: Table) -> None:
    for start in (0, 10, 20):
        append(table, "eu", range(start, start + 10))
    landed: list[str] = []

    def ingest(point: str, **context: Any) -> None:
        if not landed:
            landed.append(point)
            append(elsewhere(table), "us", range(100, 103))

    report = compact_small_files(table, FailureHooks({"before_compaction_commit": ingest}))
    assert report.groups_retried == 1
    assert report.files_compacted == 3
    assert live_files(table) == {"eu": 1, "us": 1}
    assert numbers(table) == [*range(30), 100, 101, 102]


def test_rows_deleted_before_the_commit_never_come_back(table: Table) -> None:
    """A delete rewrote the group's inputs: its outputs are dropped and it is planned again."""
    for start in (0, 10, 20):
        append(table, "eu", range(start, start + 10))
    deleted: list[str] = []

    def delete(point: str, **context: Any) -> None:
        if not deleted:
            deleted.append(point)
            elsewhere(table).delete("n >= 25")

    report = compact_small_files(table, FailureHooks({"before_compaction_commit": delete}))
    assert report.groups_replanned == 1
    assert report.groups_skipped == []
    assert numbers(table) == list(range(25))


def test_a_group_that_keeps_losing_is_skipped_not_raised(table: Table) -> None:
    for start in (0, 10, 20):
        append(table, "eu", range(start, start + 10))
    files_before = live_files(table)

    def ingest(point: str, **context: Any) -> None:
        append(elsewhere(table), "us", range(100, 101))

    report = compact_small_files(
        table, FailureHooks({"before_compaction_commit": ingest}), max_attempts=2
    )
    (skipped,) = report.groups_skipped
    assert "the table kept changing (2 tries)" in skipped
    assert report.files_compacted == 0
    assert live_files(table)["eu"] == files_before["eu"]
    assert numbers(table) == [*range(30), 100, 100]


@pytest.mark.jvm  # Spark with Iceberg's runtime
def test_an_incremental_reader_sees_no_new_rows_in_a_compaction(
    table: Table, tmp_path: Path
) -> None:
    """Spark with Apache Iceberg's runtime (``tests/support/iceberg_spark.py``) reads the table's
    changes between two snapshots (its ``changes`` table, the changelog scan CDC readers use):
    over the appends it finds their rows, over the compaction nothing, as over Spark's own
    ``rewrite_data_files`` (both ``replace``; an ``overwrite`` reads as every rewritten row
    deleted and inserted again)."""
    append(table, "eu", range(0, 10))
    start = table.current_snapshot()
    for first in (10, 20):
        append(table, "eu", range(first, first + 10))
    appended = table.current_snapshot()
    assert compact_small_files(table).files_compacted == 3
    compacted = table.refresh().current_snapshot()
    assert start is not None
    assert appended is not None
    assert compacted is not None
    assert compacted.summary is not None
    assert compacted.summary.operation.value == "replace"

    def changes(other: OtherSpark, after: Snapshot, upto: Snapshot) -> dict[str, int]:
        window = {"start-snapshot-id": str(after.snapshot_id)}
        window["end-snapshot-id"] = str(upto.snapshot_id)
        found = Counter(row["_change_type"] for row in other.read("n.t.changes", window))
        return dict(found)

    with OtherSpark("c", table.catalog.properties, tmp_path / "spark.log") as other:
        assert changes(other, start, appended) == {"INSERT": 20}
        assert changes(other, appended, compacted) == {}


def test_merged_files_follow_the_declared_sort_order_and_are_marked_sorted(table: Table) -> None:
    """Small files written before the table declared an order (arrival order) merge into one
    file sorted by it; its ``sort_order_id`` says so."""
    for first in (0, 10, 20):
        append(table, "eu", range(first, first + 10))
    with table.update_sort_order() as order:
        order.desc("n", IdentityTransform(), NullOrder.NULLS_LAST)
    assert compact_small_files(table).files_compacted == 3
    (task,) = table.refresh().scan().plan_files()
    written = pq.read_table(task.file.file_path.removeprefix("file://"))
    assert written.column("n").to_pylist() == list(range(29, -1, -1))
    assert task.file.sort_order_id == table.metadata.default_sort_order_id != 0


def test_nested_fields_with_sanitised_names_keep_their_values(tmp_path: Path) -> None:
    """Files written by pyiceberg with a struct field ``x-y`` compact into files that still
    hold its values (the review found them nulled: a cast matched the Parquet-safe name)."""
    from pyiceberg.types import StructType

    catalog = local_catalog(tmp_path, "c")
    schema = Schema(
        NestedField(1, "n", LongType(), required=False),
        NestedField(2, "s", StructType(NestedField(3, "x-y", StringType(), False)), False),
    )
    nested = catalog.create_table("n.nested", schema)
    kind = pa.struct([("x-y", pa.large_string())])
    for first in (0, 10, 20):
        values = [{"x-y": f"v{i}"} for i in range(first, first + 10)]
        nested.append(pa.table({"n": range(first, first + 10), "s": pa.array(values, kind)}))
    assert compact_small_files(nested).files_compacted == 3
    back = nested.refresh().scan().to_arrow().sort_by("n").column("s").to_pylist()
    assert back == [{"x-y": f"v{i}"} for i in range(30)]


def test_a_rewrite_that_changed_values_is_refused_not_committed(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injected into our own writer (a column nulled): the files' metrics disagree, the
    outputs are deleted, nothing is committed, the pass reports it."""
    from ingestion.ops import compaction

    for first in (0, 10, 20):
        append(table, "eu", range(first, first + 10))
    write = compaction._write_sorted
    written: list[str] = []

    def lossy(table: Table, rows: pa.Table) -> Any:
        nulled = rows.set_column(1, "n", pa.nulls(rows.num_rows, rows.schema.field("n").type))
        outputs = write(table, nulled)
        written.extend(f.file_path for f in outputs)
        return outputs

    monkeypatch.setattr(compaction, "_write_sorted", lossy)
    snapshots = len(table.metadata.snapshots)
    report = compact_small_files(table)
    (skipped,) = report.groups_skipped
    assert "refused, the rewrite changed null_value_counts of field 2: 0 -> 30" in skipped
    assert report.files_compacted == 0
    assert len(table.refresh().metadata.snapshots) == snapshots
    assert written
    assert not any(Path(p.removeprefix("file://")).exists() for p in written)
    assert numbers(table) == list(range(30))
