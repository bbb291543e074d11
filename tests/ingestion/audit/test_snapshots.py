"""The incremental audit's checks of one snapshot, on a real SQL catalog (and, for the recount,
the session broker): rows inside the commit's ranges once and from the cluster it read, no row
left after an operator's rewind, snapshots that are not the group's commits, and a commit's
count against what Kafka holds. Each check records findings (failures) or notes (unverified)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from ingestion.audit.recount import Recount
from ingestion.audit.snapshots import (
    CommitAudit,
    check_count,
    check_other,
    check_rewind,
    check_rows,
)
from ingestion.kafka.ranges import OffsetRange
from ingestion.ops.compaction import MAINTENANCE
from ingestion.table.offsets import (
    MIGRATED_FROM,
    QUARANTINED,
    RANGE_STARTS,
    TopicOffsets,
    commit_properties,
    snapshot_properties,
)
from ingestion.table.schema import CLUSTER_COLUMN, load_or_create_table
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, make_spec, records

GROUP = "group-snap"
Commit = Callable[..., Snapshot]
"""``commit(offsets, cluster=None, **properties)`` -> the snapshot appending those rows."""


def row(offset: int, cluster: str | None = None, partition: int = 0) -> dict[str, object]:
    at = dt.datetime(2026, 11, 23, 10, tzinfo=dt.UTC)
    return {
        "id": offset,
        "name": None,
        "amount": None,
        "ts": at,
        "_kafka_topic": "orders",
        "_kafka_partition": partition,
        "_kafka_offset": offset,
        "_kafka_timestamp": at,
        "_kafka_key": f"k{offset}",
        CLUSTER_COLUMN: cluster,
    }


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """A pipeline's table (on topic ``orders``) in a fresh embedded catalog."""
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    return load_or_create_table(catalog, make_spec("orders", "snap"))


@pytest.fixture
def commit(table: Table) -> Commit:
    """Append rows of ``orders[0]`` at ``offsets`` with the given snapshot properties."""

    def _commit(offsets: list[int], cluster: str | None = None, **properties: str) -> Snapshot:
        rows = pa.Table.from_pylist(
            [row(o, cluster) for o in offsets], schema=schema_to_pyarrow(table.schema())
        )
        table.append(rows, snapshot_properties=properties)
        snapshot = table.current_snapshot()
        assert snapshot is not None
        return snapshot

    return _commit


def offsets_properties(next_offset: int, group: str = GROUP, **extra: str) -> dict[str, str]:
    properties = commit_properties(
        group_id=group,
        offsets={"orders": TopicOffsets("id", {0: next_offset})},
        commit_id=f"c{next_offset}",
        cluster_id="k",
        pipeline="snap",
    )
    return {**properties, **extra}


def rows_audit(
    table: Table,
    snapshot: Snapshot,
    previous: dict[tuple[str, int], int] | None,
    current: dict[tuple[str, int], int],
    cluster: str | None = None,
) -> CommitAudit:
    audit = CommitAudit()
    check_rows(table, snapshot, previous, current, snapshot_properties(snapshot), audit, cluster)
    return audit


def test_a_commit_whose_rows_fill_its_range_once_is_clean(table: Table, commit: Commit) -> None:
    snapshot = commit(list(range(10, 15)), "primary")
    audit = rows_audit(table, snapshot, {("orders", 0): 10}, {("orders", 0): 15}, "primary")
    assert audit.ok
    assert audit.findings == []
    assert audit.notes == []


def test_a_row_added_twice_is_a_finding(table: Table, commit: Commit) -> None:
    snapshot = commit([10, 11, 11, 12])
    audit = rows_audit(table, snapshot, {("orders", 0): 10}, {("orders", 0): 13})
    assert not audit.ok
    assert audit.findings == [
        f"snapshot {snapshot.snapshot_id}: 1 records added twice, e.g. [('orders', 0, 11)]"
    ]


def test_rows_below_the_previous_offsets_or_at_the_new_ones_are_outside(
    table: Table, commit: Commit
) -> None:
    snapshot = commit([9, 10, 11, 12])
    audit = rows_audit(table, snapshot, {("orders", 0): 10}, {("orders", 0): 12})
    (finding,) = audit.findings
    assert "2 records outside its offset ranges" in finding
    assert "('orders', 0, 9)" in finding
    assert "('orders', 0, 12)" in finding


def test_a_new_partition_starts_where_range_starts_says(table: Table, commit: Commit) -> None:
    starts = {RANGE_STARTS: '{"orders":{"0":5}}'}
    clean = commit(list(range(5, 8)), **starts)
    assert rows_audit(table, clean, None, {("orders", 0): 8}).ok
    early = commit([4, 5], **starts)
    (finding,) = rows_audit(table, early, None, {("orders", 0): 6}).findings
    assert "1 records outside" in finding
    assert "('orders', 0, 4)" in finding


def test_offsets_moving_back_or_a_dropped_partition_is_a_finding(
    table: Table, commit: Commit
) -> None:
    snapshot = commit([])
    previous = {("orders", 0): 10, ("orders", 1): 3}
    (finding,) = rows_audit(table, snapshot, previous, {("orders", 0): 8}).findings
    assert "moved backwards at [('orders', 0)]" in finding
    assert "dropped partitions [('orders', 1)]" in finding


def test_rows_labelled_with_another_cluster_than_the_commit_read_are_a_finding(
    table: Table, commit: Commit
) -> None:
    snapshot = commit([0, 1], "dr")
    ranges = ({("orders", 0): 0}, {("orders", 0): 2})
    (finding,) = rows_audit(table, snapshot, *ranges, cluster="primary").findings
    assert "rows record cluster(s) ['dr'], the commit read 'primary'" in finding
    assert rows_audit(table, snapshot, *ranges, cluster="dr").ok
    assert rows_audit(table, snapshot, *ranges, cluster=None).ok  # not checked


def rewind_audit(table: Table, rewind: Snapshot, cluster: str = "primary") -> CommitAudit:
    audit = CommitAudit()
    check_rewind(table, rewind, {("orders", 0): 10}, {("orders", 0): 5}, audit, cluster)
    return audit


def test_a_rewind_that_deleted_the_rewound_rows_is_clean(table: Table, commit: Commit) -> None:
    commit(list(range(10)), "primary")
    table.delete("_kafka_offset >= 5")
    rewind = table.current_snapshot()
    assert rewind is not None
    assert rewind_audit(table, rewind).ok


def test_a_rewind_that_left_rows_after_the_rewound_offset_is_a_finding(
    table: Table, commit: Commit
) -> None:
    commit(list(range(10)))  # null cluster: primary
    rewind = commit([])
    (finding,) = rewind_audit(table, rewind).findings
    assert f"snapshot {rewind.snapshot_id} (an operator's rewind) left 5 rows" in finding


def test_rows_another_cluster_holds_at_the_rewound_coordinates_stay(
    table: Table, commit: Commit
) -> None:
    """MM2's identity naming: dr's records at the same coordinates are other records."""
    commit(list(range(10)), "dr")
    rewind = commit([])
    assert rewind_audit(table, rewind, "primary").ok
    assert len(rewind_audit(table, rewind, "dr").findings) == 1


def test_a_snapshot_whose_offsets_did_not_go_back_is_no_rewind(
    table: Table, commit: Commit
) -> None:
    snapshot = commit(list(range(10)))
    audit = CommitAudit()
    check_rewind(table, snapshot, {("orders", 0): 5}, {("orders", 0): 10}, audit)
    assert audit.ok


def other_audit(snapshot: Snapshot) -> CommitAudit:
    audit = CommitAudit()
    check_other(snapshot, snapshot_properties(snapshot), GROUP, audit)
    return audit


def test_a_compaction_must_delete_as_many_records_as_it_adds(commit: Commit) -> None:
    snapshot = commit([0, 1, 2], **{MAINTENANCE: "compaction"})
    (finding,) = other_audit(snapshot).findings
    assert f"snapshot {snapshot.snapshot_id} (compaction) changed the rows" in finding
    assert "data files with 0 records replaced by 3" in finding


def _replace(**summary: str) -> Snapshot:
    """A ``replace`` snapshot as another engine writes one (pyiceberg 0.12 cannot write it;
    the check reads only the summary)."""
    from pyiceberg.table.snapshots import Operation, Summary

    return Snapshot.model_validate(
        {
            "snapshot-id": 7,
            "parent-snapshot-id": 6,
            "sequence-number": 7,
            "timestamp-ms": 0,
            "manifest-list": "unused",
            "summary": Summary(Operation.REPLACE, **summary),
        }
    )


@pytest.mark.parametrize(
    ("summary", "kept"),
    [
        # Spark's rewrite_data_files: 5 files with 50 records into 1
        (
            {
                "deleted-data-files": "5",
                "added-data-files": "1",
                "deleted-records": "50",
                "added-records": "50",
            },
            True,
        ),
        ({"manifests-replaced": "6", "manifests-created": "1"}, True),  # rewrite_manifests
        # rewrite_position_delete_files: dangling deletes dropped
        ({"added-position-deletes": "3", "removed-position-deletes": "5"}, True),
        ({"deleted-records": "50", "added-records": "49"}, False),  # a row lost
        ({"added-position-deletes": "2"}, False),  # rows deleted under a replace
        ({"added-equality-deletes": "1"}, False),
    ],
    ids=["data-files", "manifests", "delete-files", "row-lost", "deletes-added", "equality"],
)
def test_maintenance_keeps_the_rows_or_is_a_finding(summary: dict[str, str], kept: bool) -> None:
    """R56: another engine's replace passes with a note when its summary shows the rows kept."""
    audit = other_audit(_replace(**summary))
    assert audit.ok is kept
    if kept:
        (note,) = audit.notes
        assert note.startswith("snapshot 7: maintenance (replace) kept the rows")
    else:
        (finding,) = audit.findings
        assert "snapshot 7 (replace) changed the rows" in finding


def test_a_write_without_offsets_is_a_writer_outside_the_pipeline(commit: Commit) -> None:
    snapshot = commit([0, 1])
    (finding,) = other_audit(snapshot).findings
    assert "(append) added 2 and deleted 0 rows without offsets" in finding
    assert other_audit(commit([])).ok  # nothing added or deleted: nothing to say


def test_another_groups_offsets_are_another_pipeline_unless_migrated_from_this_one(
    commit: Commit,
) -> None:
    foreign = commit([], **offsets_properties(5, group="other"))
    (finding,) = other_audit(foreign).findings
    assert "commits offsets of group(s) ['other']" in finding
    migrated = commit([], **offsets_properties(5, group="other", **{MIGRATED_FROM: GROUP}))
    audit = other_audit(migrated)
    assert audit.ok
    assert audit.notes == [
        f"snapshot {migrated.snapshot_id}: offsets migrated to ['other']; {GROUP!r} retired"
    ]


def test_a_first_commit_without_recorded_starts_is_noted_not_recounted(commit: Commit) -> None:
    """Nothing is read: the Kafka settings point nowhere."""
    snapshot = commit([0])
    audit = CommitAudit()
    unverifiable = Recount((), exact=False, verifiable=False)
    check_count(snapshot, {}, unverifiable, {"bootstrap.servers": "nowhere:1"}, "p", 1, audit)
    assert audit.ok
    assert audit.recounted == []
    assert audit.notes == [
        f"snapshot {snapshot.snapshot_id}: the group's first commit, or the oldest left after "
        "an expiry, start not recorded (a full audit recounts its partitions' ranges whole)"
    ]


@pytest.mark.integration
def test_the_count_is_checked_against_the_records_kafka_holds(
    commit: Commit,
    kafka: KafkaResource,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
) -> None:
    """5 records in Kafka: 5 added is clean; 4 added plus 1 quarantined too; 6 is a finding
    unless the start is a lower bound (a note); a range past the log end is unrecounted."""
    topic = create_topic(partitions=1)
    ledger_producer.produce(topic, records(5))
    config = kafka.client_config()
    exact = Recount((OffsetRange(topic, 0, 0, 5),))

    def count(added: int, recount: Recount, **properties: str) -> tuple[Snapshot, CommitAudit]:
        snapshot, audit = commit(list(range(added))), CommitAudit()
        check_count(snapshot, properties, recount, config, "p", 5.0, audit)
        return snapshot, audit

    snapshot, audit = count(5, exact)
    assert audit.ok
    assert audit.recounted == [snapshot.snapshot_id]
    assert audit.offsets_recounted == 5
    assert count(4, exact, **{QUARANTINED: "1"})[1].ok
    snapshot, audit = count(6, exact)
    assert audit.findings == [
        f"snapshot {snapshot.snapshot_id} added 6 records (quarantined and late copies "
        "included) but Kafka holds 5 visible records in its ranges"
    ]
    lower_bound = Recount(exact.ranges, exact=False)
    snapshot, audit = count(6, lower_bound)
    assert audit.ok
    assert "a range start is a lower bound" in audit.notes[0]
    assert count(4, lower_bound)[1].findings  # fewer than Kafka holds: still loss

    beyond, snapshot, audit = Recount((OffsetRange(topic, 0, 0, 9),)), commit([]), CommitAudit()
    check_count(snapshot, {}, beyond, config, "p", 1.0, audit)
    assert audit.unrecounted_snapshot == snapshot.snapshot_id
    assert audit.recounted == []
    assert f"could not recount {topic}[0] [0, 9)" in str(audit.unrecounted)
    assert audit.ok  # not a finding: retried by the next evaluation
