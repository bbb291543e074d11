"""A group's position outlives the snapshots that carried it, and only where it is proven (R56).

"Another tool" here is pyiceberg's own maintenance API (a real Iceberg implementation): a
rewrite of the same rows, then ``expire_snapshots`` keeping only the head. The same with Spark's
Iceberg procedures while a stream ingests is ``tests/ingestion/ops/test_foreign_maintenance.py``.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from ingestion import exceptions
from ingestion.ops.reset import apply_reset
from ingestion.spec.pipeline import StartingPosition
from ingestion.table.offsets import (
    POSITION_PREFIX,
    find_committed_state,
    read_position,
)
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records


def _expire_all_but_head(table: Table) -> None:
    head = table.current_snapshot()
    assert head is not None
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()


def _rewrite_same_rows(table: Table) -> None:
    """Another tool's compaction: every row deleted and written again in one commit (a filter,
    not ``AlwaysTrue``: pyiceberg truncates for that, leaving a snapshot without a parent)."""
    rows = table.scan().to_arrow()
    table.overwrite(rows, overwrite_filter="_kafka_offset >= 0")


def test_expiry_by_another_tool_keeps_the_position(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R56: a compaction becomes the head and every snapshot with the offsets expires; the
    table property still knows the position, proven by its witness row, and the next run
    reads on from it: every record once."""
    topic, spec = new_pipeline("position", partitions=2, produce=20)
    harness.run(spec)
    ledger_producer.produce(topic, records(10, first=100))
    harness.run(spec)
    table = harness.table(spec)
    position = read_position(table.metadata.properties, spec.consumer_group_id)
    assert position is not None
    assert position.witness is not None
    assert position.witness.topic == topic
    committed = find_committed_state(table, spec.consumer_group_id)
    assert committed is not None
    assert not committed.from_position
    assert committed.offsets == position.offsets
    assert committed.snapshot_id == position.snapshot_id

    _rewrite_same_rows(table)
    _expire_all_but_head(harness.table(spec))
    table = harness.table(spec)
    state = find_committed_state(table, spec.consumer_group_id)
    assert state is not None
    assert state.from_position
    assert state.offsets == position.offsets
    assert "expired; its offsets kept by the table property" in state.describe()

    ledger_producer.produce(topic, records(15, first=200))
    report = harness.run(spec)
    assert report.records == 15
    harness.assert_exactly_once(spec, ledger)
    assert not find_committed_state(harness.table(spec), spec.consumer_group_id).from_position  # type: ignore[union-attr]


def test_a_rollback_past_the_position_refuses(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """R56: rolled back past the last commit, then another writer and an expiry: the property is
    ahead of the table and its witness row is gone, so nothing proves it. The run refuses by
    name instead of skipping the rolled-back range or re-reading from the start."""
    topic, spec = new_pipeline("rolled", produce=10)
    harness.run(spec)
    first = harness.table(spec).current_snapshot()
    assert first is not None
    ledger_producer.produce(topic, records(10, first=100))
    harness.run(spec)
    table = harness.table(spec)
    table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    table = harness.table(spec)
    rows = table.scan().to_arrow().slice(0, 1)
    table.append(pa.Table.from_pylist(rows.to_pylist(), schema=table.schema().as_arrow()))
    _expire_all_but_head(harness.table(spec))
    table = harness.table(spec)
    assert POSITION_PREFIX + spec.consumer_group_id in table.metadata.properties
    assert find_committed_state(table, spec.consumer_group_id) is None
    with pytest.raises(exceptions.MissingOffsetsError, match="holds rows but no snapshot"):
        harness.run(spec)


def test_an_offset_reset_keeps_the_witness_only_below_its_offsets(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """R56: an operator's rewind deletes the rows at or after its offsets, so a witness there
    is dropped; a reset forward keeps it."""
    topic, spec = new_pipeline("witness", produce=10)
    harness.run(spec)
    group = spec.consumer_group_id
    position = read_position(harness.table(spec).metadata.properties, group)
    assert position is not None
    assert position.witness is not None
    ledger_producer.produce(topic, records(5, first=100))
    forward = harness.plan_reset(spec, StartingPosition(mode="latest"))
    apply_reset(harness.catalog, spec, forward, harness.cluster_id, "ops", "skip")
    kept = read_position(harness.table(spec).metadata.properties, group)
    assert kept is not None
    assert kept.witness == position.witness
    assert kept.offsets != position.offsets
    back = harness.plan_reset(spec, StartingPosition(mode="earliest"))
    apply_reset(harness.catalog, spec, back, harness.cluster_id, "ops", "redo")
    table = harness.table(spec)
    rewound = read_position(table.metadata.properties, group)
    assert rewound is not None
    assert rewound.witness is None
    state = find_committed_state(table, group)
    assert state is not None
    assert rewound.offsets == state.offsets


def test_a_migration_retires_the_old_groups_position(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """R56 with R22/R42: a migration removes the old group's position in its commit, so once
    expiry removed the migration's snapshot the old group has no offsets to plan from (the run
    under it is refused, never a second reader of the same range)."""
    from ingestion.ops.reset import migrate_group

    _, spec = new_pipeline("migrated", produce=10)
    harness.run(spec)
    old = spec.consumer_group_id
    admin = harness.kafka.get_admin_client()
    migrate_group(harness.catalog, spec, "migrated-new", admin, "ops", "rename")
    table = harness.table(spec)
    assert read_position(table.metadata.properties, old) is None
    moved = read_position(table.metadata.properties, "migrated-new")
    assert moved is not None
    assert moved.witness is not None  # the rows are the old group's: its witness carries over
    _rewrite_same_rows(table)
    _expire_all_but_head(harness.table(spec))
    table = harness.table(spec)
    assert find_committed_state(table, old) is None
    state = find_committed_state(table, "migrated-new")
    assert state is not None
    assert state.from_position


def test_a_commit_that_only_quarantined_records_proves_nothing(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """R56: the proof needs every commit after the witness's to have changed no row and no dead
    letter; a commit that set records aside drops the witness."""
    topic, spec = new_pipeline("deadonly", produce=5, errors_tolerance="all")
    harness.run(spec)
    position = read_position(harness.table(spec).metadata.properties, spec.consumer_group_id)
    assert position is not None
    assert position.witness is not None
    ledger_producer.produce(topic, [(b"bad", b"{", 0)])
    assert harness.run(spec).quarantined == 1
    after = read_position(harness.table(spec).metadata.properties, spec.consumer_group_id)
    assert after is not None
    assert after.witness is None
