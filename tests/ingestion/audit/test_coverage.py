"""A full audit recounts every committed range Kafka still holds, the commits whose snapshots
were expired included, or names what it could not check; it never passes on nothing (R47,
R56). "Another engine" is pyiceberg's own maintenance API (``expire_snapshots``, ``delete``,
``append``), as in ``tests/ingestion/table/test_offsets.py``; Kafka's retention is the broker's
own ``DeleteRecords``, which advances the log start as retention does."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pyiceberg.table import Table

from ingestion import exceptions
from ingestion.audit.coverage import (
    RangeRecount,
    compare_partition,
    count_expired_snapshots,
    read_cleanup_policies,
    recount_committed_ranges,
    recount_partition,
)
from ingestion.audit.oracle import AuditResult, PipelineAudit
from ingestion.audit.snapshots import CommitAudit
from ingestion.audit.verdict import check_exactly_once
from ingestion.health.checks import Finding
from ingestion.kafka.ranges import OffsetRange
from ingestion.ops.compaction import compact_small_files
from ingestion.ops.reset import apply_reset
from ingestion.pipeline.hooks import FailureHooks
from ingestion.quarantine.sync import SYNCED_SEQUENCE
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from ingestion.table.left_out import LEFT_OUT_PREFIX, find_left_out, read_left_out
from platform_assets.ingest.checks import audit_finding
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.brokers import delete_records
from tests.support.debezium import DebeziumTable, cdc_spec
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, crash, records

BAD = (b"bad", b"{", 0)  # a malformed value: dead-lettered into the quarantine table
DEADLINE_S = 30.0

Audit = Callable[[PipelineSpec], Finding]
"""``full_audit(spec)`` -> the exactly_once_audit finding of a full audit: the fixture."""


@pytest.fixture
def full_audit(catalog_resource: IcebergCatalogResource, kafka: KafkaResource) -> Audit:
    """The exactly_once_audit finding of ``platform status --full-audit``."""

    def _audit(spec: PipelineSpec) -> Finding:
        return audit_finding(spec, catalog_resource, kafka, full=True)

    return _audit


def ingest(harness: Harness, spec: PipelineSpec, hooks: FailureHooks | None = None) -> None:
    if hooks is None:
        harness.run(spec, use_spark=False)
    else:
        harness.run(spec, hooks=hooks, use_spark=False)


def ingest_batches(
    harness: Harness, spec: PipelineSpec, producer: LedgerProducer, topic: str, batches: int
) -> None:
    """``batches`` commits of 10 records each (ids 0, 10, 20, ...), the first already produced
    by ``new_pipeline``."""
    for batch in range(batches):
        if batch:
            producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, spec)


def expire_all_but_head(table: Table) -> None:
    """Another engine's expiry keeping one snapshot: pyiceberg's ``expire_snapshots``."""
    head = table.current_snapshot()
    assert head is not None
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()


@pytest.mark.integration
def test_a_full_audit_recounts_the_ranges_of_expired_commits(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """Three commits, the first with a dead letter; another engine expires every snapshot but
    the newest. Their summaries are gone (the per-commit recount has nothing to compare: 0
    commits), but the full audit recounts every partition's range in Kafka record by record,
    the dead letter found in the quarantine table, and names the expired snapshots as covered
    by that range recount alone."""
    topic, spec = new_pipeline(
        "cover_expired", partitions=2, produce=[*records(10), BAD], errors_tolerance="all"
    )
    ingest_batches(harness, spec, ledger_producer, topic, 3)
    assert full_audit(spec).passed
    table = harness.table(spec)
    head = table.current_snapshot()
    assert head is not None
    assert head.sequence_number is not None
    expire_all_but_head(table)
    assert count_expired_snapshots(harness.table(spec)) == (
        head.sequence_number - 1,
        head.snapshot_id,
    )
    finding = full_audit(spec)
    assert finding.passed, finding.message
    figures = finding.metadata
    assert figures["offsets_recounted"] == 0  # what the full audit recounted before: nothing
    assert "0 commit(s) recounted in Kafka (0 offsets)" in finding.message
    assert (figures["range_partitions_recounted"], figures["range_offsets_recounted"]) == (2, 31)
    assert figures["range_records_recounted"] == 31
    assert figures["expired_snapshots"] == head.sequence_number - 1 >= 2
    assert "range recount: 31 offsets of 2 partition(s) recounted in Kafka" in finding.message
    assert (
        f"{head.sequence_number - 1} snapshot(s) older than snapshot {head.snapshot_id} were "
        "expired: their commits are covered only by the range recount"
    ) in finding.message
    assert "not recounted" not in finding.message


@pytest.mark.integration
def test_a_compaction_left_as_the_only_snapshot_passes(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A compaction (``replace``, as Spark's ``rewrite_data_files`` writes) is the head and
    every snapshot with the offsets expired (R56): the offsets live on in the table property
    only. The full audit holds the rows to that position (not "beyond the watermark") and
    recounts every range."""
    topic, spec = new_pipeline("cover_compacted", produce=10)
    ingest_batches(harness, spec, ledger_producer, topic, 3)
    assert compact_small_files(harness.table(spec)).files_compacted == 3
    expire_all_but_head(harness.table(spec))
    head = harness.table(spec).current_snapshot()
    assert head is not None
    assert head.summary is not None
    assert head.summary.operation.value == "replace"
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert finding.metadata["range_offsets_recounted"] == 30
    assert "maintenance (compaction) kept the rows" in finding.metadata["not_verified"]


@pytest.mark.integration
@pytest.mark.parametrize("change", ["deleted", "duplicated"])
def test_a_row_of_an_expired_commit_changed_by_another_engine_fails(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    full_audit: Audit,
    change: str,
) -> None:
    """After the expiry, another engine deletes a row of an expired commit (or appends it a
    second time); the pipeline commits again and that write's snapshot expires too, so no
    snapshot shows it. The full audit fails naming the partition and the offset, with no
    caveat: the table's record (``kafka.left-out.<group>``) saw where reading began, so no
    unrecorded reset could explain the loss."""
    topic, spec = new_pipeline(f"cover_{change}", partitions=2, produce=10)
    ingest_batches(harness, spec, ledger_producer, topic, 2)
    expire_all_but_head(harness.table(spec))
    table = harness.table(spec)
    rows = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
    partition = min(rows.column("_kafka_partition").to_pylist())
    offset = min(
        o
        for p, o in zip(
            rows.column("_kafka_partition").to_pylist(),
            rows.column("_kafka_offset").to_pylist(),
            strict=True,
        )
        if p == partition
    )
    where = f"_kafka_partition = {partition} and _kafka_offset = {offset}"
    if change == "deleted":
        table.delete(delete_filter=where)
    else:
        table.append(table.scan(row_filter=where).to_arrow())
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    finding = full_audit(spec)
    assert not finding.passed
    assert finding.severity == "ERROR"
    if change == "deleted":
        assert f"{topic}[{partition}]: 1 record(s) Kafka holds in [0, " in finding.message
        assert f"(lost), at offsets {offset}. Stop the pipeline's runs" in finding.message
    else:
        assert f"duplicates: 1 e.g. [('{topic}', {partition}, {offset})]" in finding.message


@pytest.mark.integration
def test_offsets_deleted_by_kafkas_retention_are_named_not_recounted(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
    full_audit: Audit,
) -> None:
    """Kafka's retention deleted offsets 0-11 before the audit: the range from the log start
    is recounted, and the audit names the range it could not check instead of passing
    silently on it."""
    topic, spec = new_pipeline("cover_retention", produce=10)
    ingest_batches(harness, spec, ledger_producer, topic, 3)
    expire_all_but_head(harness.table(spec))
    delete_records(kafka, topic, 0, 12)
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert finding.metadata["range_offsets_recounted"] == 18
    named = (
        f"{topic}[0] offsets [0, 12) were deleted by Kafka's retention before this audit (its "
        "log starts at 12): not recounted"
    )
    assert f"not recounted: {named}" in finding.message
    assert named in finding.metadata["not_recounted"]


@pytest.mark.integration
def test_a_full_audit_that_recounts_nothing_never_passes(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
    full_audit: Audit,
) -> None:
    """Every commit's snapshot but the newest expired, and Kafka's retention deleted every
    committed offset: nothing can be recounted while the table holds 20 rows. That is the
    user's "0 commit(s) recounted in Kafka (0 offsets)", which passed: now it is not
    evaluated, naming why."""
    topic, spec = new_pipeline("cover_nothing", produce=10)
    ingest_batches(harness, spec, ledger_producer, topic, 2)
    expire_all_but_head(harness.table(spec))
    delete_records(kafka, topic, 0, 20)
    finding = full_audit(spec)
    assert (finding.passed, finding.severity) == (False, "WARN")
    assert "not evaluated: the full audit recounted no offset in Kafka" in finding.message
    assert "the table holds 20 row(s)" in finding.message
    assert f"{topic}[0] offsets [0, 20) were deleted by Kafka's retention" in finding.message


def expire_all_but_last(table: Table, keep: int) -> None:
    """Another engine's expiry keeping the newest ``keep`` snapshots of the head's lineage."""
    lineage: list[int] = []
    snapshot = table.current_snapshot()
    while snapshot is not None and len(lineage) < keep:
        lineage.append(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.metadata.snapshot_by_id(parent)
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id not in lineage]
    table.maintenance.expire_snapshots().by_ids(older).commit()


def crash_with_dead_letter(
    harness: Harness, spec: PipelineSpec, producer: LedgerProducer, topic: str
) -> None:
    """A run that commits 5 records and a dead letter (offsets 11-16), then crashes before the
    quarantine sync."""
    producer.produce(topic, [*records(5, first=10), BAD])
    with pytest.raises(exceptions.InjectedFailure):
        ingest(harness, spec, FailureHooks({"after_commit": crash}))


@pytest.mark.integration
def test_dead_letters_not_synced_yet_are_not_read_as_lost(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A run crashed after its commit, before the quarantine sync: the commit's dead letter is
    in neither table yet. While the commit before it is left, the range recount counts it as
    not synced (up to the commit's ``kafka.quarantined``), not as lost. Once that commit is
    expired too, where the crashed commit's range began is not recorded: the audit cannot
    tell its dead letter from a loss, and says so (a WARN, not a pass); the next run syncs it
    and the audit passes."""
    topic, spec = new_pipeline(
        "cover_unsynced", produce=[*records(10), BAD], errors_tolerance="all"
    )
    ingest(harness, spec)
    crash_with_dead_letter(harness, spec, ledger_producer, topic)
    head = harness.table(spec).metadata.current_snapshot_id
    expire_all_but_last(harness.table(spec), 2)
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert (
        f"snapshot {head}: 1 record(s) of its ranges are its dead letters, not yet synced"
    ) in finding.message
    expire_all_but_head(harness.table(spec))
    unplaced = full_audit(spec)
    assert (unplaced.passed, unplaced.severity) == (False, "WARN"), unplaced.message
    assert "not evaluated: the full audit cannot tell a loss from what it names" in (
        unplaced.message
    )
    assert f"at offsets 16: lost, or dead letters of snapshot {head} (it quarantined 1" in (
        unplaced.message
    )
    ingest(harness, spec)  # syncs the quarantine table
    synced = full_audit(spec)
    assert synced.passed, synced.message
    assert "not yet synced" not in synced.message
    assert synced.metadata["quarantined"] == 2


@pytest.mark.integration
@pytest.mark.parametrize("kept", [1, 3])
def test_unsynced_dead_letters_never_excuse_a_loss_below_their_commit(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    full_audit: Audit,
    kept: int,
) -> None:
    """Another engine deletes row 3 of the first commit; a later commit quarantines one record
    and the run crashes before the sync. Whether the commit before it is left (its range is
    [11, 17)) or expired (its range start is not recorded: nothing is excused), the loss at
    offset 3 is an ERROR: the dead letter not synced yet never excuses a record below its
    commit's range (it excused any record from offset 0 up)."""
    topic, spec = new_pipeline(
        f"cover_unsynced_loss{kept}", produce=[*records(10), BAD], errors_tolerance="all"
    )
    ingest(harness, spec)
    delete_rows(harness, spec, [3])
    crash_with_dead_letter(harness, spec, ledger_producer, topic)
    expire_all_but_last(harness.table(spec), kept)
    finding = full_audit(spec)
    assert (finding.passed, finding.severity) == (False, "ERROR"), finding.message
    assert f"{topic}[0]: " in finding.message
    assert "(lost), at offsets 3" in finding.message


@pytest.mark.integration
def test_a_lagging_quarantine_sync_excuses_no_loss_below_the_oldest_commit(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    catalog_resource: IcebergCatalogResource,
    full_audit: Audit,
) -> None:
    """The quarantine table's record of the last commit it reflects is behind (here: gone),
    so every commit left counts as having dead letters not synced yet. The oldest commit left
    (its previous one expired, no range start recorded) quarantined one record; another engine
    deleted row 3. That loss was excused as "not yet synced"; now the audit names offset 3 and
    does not pass."""
    topic, spec = new_pipeline(
        "cover_lagging_sync", produce=[*records(10), BAD], errors_tolerance="all"
    )
    ingest(harness, spec)
    delete_rows(harness, spec, [3])
    ledger_producer.produce(topic, [*records(5, first=10), BAD])
    ingest(harness, spec)
    expire_all_but_last(harness.table(spec), 1)
    quarantine = harness.catalog.load_table(spec.quarantine_table)
    with quarantine.transaction() as change:
        change.remove_properties(SYNCED_SEQUENCE)
    finding = full_audit(spec)
    assert not finding.passed, finding.message
    assert f"{topic}[0]: 1 record(s) Kafka holds in [0, 17) are in neither" in finding.message
    assert "at offsets 3" in finding.message


def forward_reset(
    harness: Harness, spec: PipelineSpec, position: StartingPosition, who: str, why: str
) -> tuple[int, str]:
    """Plan and apply an operator's reset of ``spec`` to ``position``; (snapshot id, commit
    id) of its commit."""
    reset = harness.plan_reset(spec, position)
    outcome = apply_reset(harness.catalog, spec, reset, harness.cluster_id, who, why)
    return outcome.snapshot_id, outcome.commit_id


def skipped_by(harness: Harness, spec: PipelineSpec, snapshot_id: int, commit_id: str) -> str:
    """How the audit names a range skipped by the reset of ``snapshot_id``: when, who, why,
    its commit and snapshot (when: the reset snapshot's timestamp, in UTC)."""
    snapshot = harness.table(spec).metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    when = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC)
    return (
        f"skipped by the offset reset on {when:%Y-%m-%d %H:%M:%S} UTC by 'ops' (reason 'skip a "
        f"bad burst'; commit {commit_id}, snapshot {snapshot_id})"
    )


def delete_rows(harness: Harness, spec: PipelineSpec, offsets: list[int]) -> None:
    """Another engine deletes the rows at ``offsets`` of partition 0 (pyiceberg's ``delete``)."""
    where = " or ".join(f"_kafka_offset = {o}" for o in offsets)
    harness.table(spec).delete(delete_filter=f"_kafka_partition = 0 and ({where})")


@pytest.mark.integration
def test_a_forward_reset_is_named_after_its_snapshot_expires(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """An operator's forward reset skipped offsets 10-19 on purpose. While its snapshot is in
    the table and after another engine expired every snapshot but the newest, the range
    recount does not expect them and names the range with the reset's when, who and why: the
    reset's commit wrote them into the table property ``kafka.left-out.<group>``, which
    outlives the expiry."""
    topic, spec = new_pipeline("cover_forward", produce=10)
    ingest(harness, spec)
    ledger_producer.produce(topic, records(10, first=10))
    reset = forward_reset(harness, spec, StartingPosition(mode="latest"), "ops", "skip a bad burst")
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    named = f"{topic}[0] [10, 20): 10 record(s) not expected: {skipped_by(harness, spec, *reset)}"
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert named in finding.message
    expire_all_but_head(harness.table(spec))
    table = harness.table(spec)
    assert table.metadata.snapshot_by_id(reset[0]) is None  # the reset's snapshot is gone
    expired = full_audit(spec)
    assert expired.passed, expired.message
    assert named in expired.message
    assert (
        expired.metadata["range_offsets_recounted"],
        expired.metadata["range_records_recounted"],
    ) == (30, 30)
    assert "not recounted" not in expired.message


@pytest.mark.integration
def test_where_reading_began_outlives_the_first_commit(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A pipeline started at ``latest`` (offset 10), whose first commit expired, and whose
    ``starting_position`` was edited to ``earliest`` since: the record says reading began at
    10, so offsets 0-9 are not expected (they read as lost before) and 10-19 are recounted."""
    topic, spec = new_pipeline("cover_began", produce=10, starting_position={"mode": "latest"})
    ingest(harness, spec)  # pins the start at 10
    ledger_producer.produce(topic, records(10, first=10))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    edited = spec.model_copy(update={"starting_position": StartingPosition(mode="earliest")})
    finding = full_audit(edited)
    assert finding.passed, finding.message
    assert (
        "range recount: 10 offsets of 1 partition(s) recounted in Kafka record by record "
        f"({topic}[0] [10, 20))"
    ) in finding.message
    assert "not recounted" not in finding.message


@pytest.mark.integration
def test_a_backward_reset_reads_the_skipped_range_again(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A forward reset skipped offsets 10-19, then a backward reset to 5 deleted the rows from
    5 on and the next run read them again, the skipped ones too: the backward reset cut the
    range out of the table's record, and every record is expected again, before and after the
    expiry. Proof that they are expected: another engine deletes the re-read row 15, whose
    snapshot expires too: the audit fails naming offset 15."""
    topic, spec = new_pipeline("cover_backward", produce=10)
    ingest(harness, spec)
    ledger_producer.produce(topic, records(10, first=10))
    forward_reset(harness, spec, StartingPosition(mode="latest"), "ops", "skip a bad burst")
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    record = find_left_out(harness.table(spec), spec.consumer_group_id)
    assert record is not None
    assert [(s.start, s.end) for s in record.partitions[(topic, 0)].skipped] == [(10, 20)]
    back = StartingPosition(mode="offsets", offsets={f"{topic}:0": 5})
    forward_reset(harness, spec, back, "ops", "read it after all")
    record = find_left_out(harness.table(spec), spec.consumer_group_id)
    assert record is not None
    assert record.partitions[(topic, 0)].skipped == ()  # read again: no longer left out
    assert record.resets == {}
    ingest(harness, spec)
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert "not expected" not in finding.message
    assert finding.metadata["range_records_recounted"] == 30
    expire_all_but_head(harness.table(spec))
    expired = full_audit(spec)
    assert expired.passed, expired.message
    assert expired.metadata["range_offsets_recounted"] == 30
    assert "not expected" not in expired.message
    delete_rows(harness, spec, [15])
    ledger_producer.produce(topic, records(5, first=30))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    lost = full_audit(spec)
    assert (lost.passed, lost.severity) == (False, "ERROR")
    assert (
        f"{topic}[0]: 1 record(s) Kafka holds in [0, 35) are in neither the table nor its "
        "quarantine table (lost), at offsets 15."
    ) in lost.message


@pytest.mark.integration
def test_a_loss_next_to_a_skipped_range_is_still_an_error(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A forward reset skipped offsets 10-19; another engine deletes the rows at 9 and 20, on
    either side of the skipped range, and every snapshot but the newest expires. The audit
    fails naming exactly those two offsets: the record excuses [10, 20) and nothing more."""
    topic, spec = new_pipeline("cover_adjacent", produce=10)
    ingest(harness, spec)
    ledger_producer.produce(topic, records(10, first=10))
    forward_reset(harness, spec, StartingPosition(mode="latest"), "ops", "skip a bad burst")
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    delete_rows(harness, spec, [9, 20])
    ledger_producer.produce(topic, records(5, first=30))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    finding = full_audit(spec)
    assert (finding.passed, finding.severity) == (False, "ERROR")
    assert (
        f"{topic}[0]: 2 record(s) Kafka holds in [0, 35) are in neither the table nor its "
        "quarantine table (lost), at offsets 9, 20."
    ) in finding.message


@pytest.mark.integration
def test_a_rollback_past_the_reset_excuses_nothing(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """Another tool rolls the table back past a forward reset (Iceberg's rollback): the table
    property still names the reset, but the head's history no longer holds it, so the record
    is not used (and said so); the next run reads 10-19 again and drops the record. A loss
    there (another engine deletes row 15), once every snapshot but the newest expired, is
    an ERROR naming offset 15, never excused as skipped (with the caveat of a table whose
    record no longer says where reading began)."""
    topic, spec = new_pipeline("cover_rollback", produce=10)
    ingest(harness, spec)
    before = harness.table(spec).metadata.current_snapshot_id
    assert before is not None
    ledger_producer.produce(topic, records(10, first=10))
    forward_reset(harness, spec, StartingPosition(mode="latest"), "ops", "skip a bad burst")
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    harness.table(spec).manage_snapshots().rollback_to_snapshot(before).commit()
    table, group = harness.table(spec), spec.consumer_group_id
    assert read_left_out(table.properties, group) is not None  # ahead of the table
    assert find_left_out(table, group) is None
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert f"({LEFT_OUT_PREFIX}{group}) was written by snapshot" in finding.message
    assert "not used, nothing is excused by it" in finding.message
    ingest(harness, spec)  # reads 10-29 again from the rolled-back offsets
    assert LEFT_OUT_PREFIX + group not in harness.table(spec).properties
    delete_rows(harness, spec, [15])
    ledger_producer.produce(topic, records(5, first=30))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    lost = full_audit(spec)
    assert (lost.passed, lost.severity) == (False, "ERROR")
    # The record dropped, nothing vouches for where reading began: the finding says what
    # else could explain it, and is an ERROR all the same.
    assert "(lost), at offsets 15 (below offset " in lost.message


@pytest.mark.integration
def test_an_upsert_table_checks_its_rows_against_kafka_after_expiry(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """``mode: upsert`` rewrites rows: a record whose key changed again or was deleted has no
    row, which is no loss. The range recount keeps the audit's upsert rule: every row is one
    of Kafka's records in the range, no record is expected to have a row."""
    source = DebeziumTable(partitions=1)
    topic = create_topic(partitions=1)
    spec = cdc_spec(topic, "cover_upsert")
    ledger_producer.produce(topic, source.snapshot(10))
    ingest(harness, spec)
    ledger_producer.produce(topic, source.random_changes(random.Random(7), 20, keys=12))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert "every row among them" in finding.message
    assert "mode: upsert: a record whose key changed again or was deleted has no row" in (
        finding.message
    )
    assert finding.metadata["range_offsets_recounted"] > 10


@pytest.mark.integration
def test_an_unreachable_cluster_is_not_a_pass(
    harness: Harness, new_pipeline: NewPipeline, kafka: KafkaResource
) -> None:
    """The range recount cannot read Kafka: it names what it could not recount, and the full
    audit is not evaluated (a WARN), never passed."""
    _, spec = new_pipeline("cover_down", produce=10)
    ingest(harness, spec)
    quiet = logging.getLogger("tests.unreachable_cluster")  # librdkafka's connect errors
    down = {**kafka.client_config(), "bootstrap.servers": "127.0.0.1:1", "logger": quiet}
    found = recount_committed_ranges(
        harness.table(spec), spec.consumer_group_id, down, spec.name, timeout_s=2.0
    )
    assert found.unrecounted is not None
    assert found.ranges == []
    commits = CommitAudit(recounted=[1], offsets_recounted=10)
    finding = check_exactly_once(
        spec.table, PipelineAudit(commits, AuditResult(rows=10), None, found)
    )
    assert (finding.passed, finding.severity) == (False, "WARN")
    assert "not evaluated: the full audit could not recount" in finding.message


@pytest.mark.parametrize(
    ("visible", "held", "skipped", "pending", "upsert", "expected"),
    [
        # every record held once: nothing missing, nothing outside
        ([0, 1, 2], [0, 1, 2], [], [], False, (0, 0, {}, 0)),
        # a record without a row is missing; a row where Kafka holds no record (an aborted
        # record, a marker) is outside; rows past the range are not this check's
        ([0, 1, 3], [0, 2, 3, 9], [], [], False, (1, 0, {}, 1)),
        # a range skipped on purpose (a forward reset, a lost range) is not expected
        ([0, 1, 2, 3], [0, 3], [(1, 3)], [], False, (0, 2, {}, 0)),
        # a pending commit's dead letters are counted per commit, not as missing
        ([0, 1, 2, 3], [0, 1], [], [(0, 0), (2, 4)], False, (0, 0, {1: 2}, 0)),
        # mode: upsert: no record needs a row; a row must still be a record
        ([0, 1, 2], [2, 5], [], [], True, (0, 0, {}, 0)),
        ([0, 2], [1, 2], [], [], True, (0, 0, {}, 1)),
    ],
    ids=["exact", "missing-and-outside", "skipped", "pending", "upsert", "upsert-outside"],
)
def test_compare_partition(
    visible: list[int],
    held: list[int],
    skipped: list[tuple[int, int]],
    pending: list[tuple[int, int]],
    upsert: bool,
    expected: tuple[int, int, dict[int, int], int],
) -> None:
    """Kafka's records in [0, 5) against the rows' offsets, as two sorted streams."""
    check = compare_partition(0, 5, iter(visible), held, skipped, pending, upsert)
    assert (check.missing, check.left_out, check.awaiting, check.outside) == expected
    assert check.visible == len(visible)


def recount(**fields: Any) -> RangeRecount:
    """A range recount of t[0] [0, 30) that found all 30 records, with ``fields`` changed."""
    clean = RangeRecount(partitions=1, offsets=30, visible=30, ranges=[OffsetRange("t", 0, 0, 30)])
    return replace(clean, **fields)


@pytest.mark.parametrize(
    ("ranges", "rows", "outcome", "text"),
    [
        (recount(), 30, "passed", "range recount: 30 offsets of 1 partition(s)"),
        (
            recount(expired_snapshots=4, oldest_snapshot=9),
            30,
            "passed",
            "4 snapshot(s) older than snapshot 9 were expired: their commits are covered only",
        ),
        (recount(findings=["t[0]: 1 record(s) Kafka holds"]), 29, "ERROR", "t[0]: 1 record(s)"),
        (
            RangeRecount(unchecked=["t[0] offsets [0, 30) were deleted"]),
            30,
            "WARN",
            "not evaluated: the full audit recounted no offset in Kafka",
        ),
        (RangeRecount(), 5, "WARN", "every committed range is empty"),
        (RangeRecount(), 0, "passed", "range recount: no offset recounted"),
        (
            recount(unrecounted="could not recount t[0] [0, 30) (down)"),
            30,
            "WARN",
            "not evaluated: the full audit could not recount t[0] [0, 30) (down)",
        ),
    ],
    ids=["clean", "expired", "lost", "nothing", "rows-unrecounted", "empty", "unreadable"],
)
def test_the_verdict_of_a_range_recount(
    ranges: RangeRecount, rows: int, outcome: str, text: str
) -> None:
    """A full audit passes only on what it recounted; recounting nothing while the table holds
    rows, or while it names what it could not check, is a WARN, never a pass."""
    audit = PipelineAudit(CommitAudit(), AuditResult(rows=rows), ranges=ranges)
    finding = check_exactly_once("tests.t", audit)
    assert ("passed" if finding.passed else finding.severity) == outcome
    assert text in finding.message


def test_expired_commits_no_range_covers_are_named_as_not_audited() -> None:
    """A pipeline with replicas is not range-recounted: its commits left are recounted one by
    one (a pass on those), and the expired ones are named as not audited, never as covered."""
    unchecked = ["no partition range-recounted: the pipeline has replicas"]
    ranges = RangeRecount(expired_snapshots=3, oldest_snapshot=9, unchecked=unchecked)
    commits = CommitAudit(recounted=[9], offsets_recounted=10)
    finding = check_exactly_once(
        "tests.t", PipelineAudit(commits, AuditResult(rows=10), None, ranges)
    )
    assert finding.passed, finding.message
    assert (
        "3 snapshot(s) older than snapshot 9 were expired: their commits are not audited"
    ) in finding.message
    assert "not recounted: no partition range-recounted" in finding.message


def test_a_pipeline_with_replicas_that_recounted_nothing_passes_partly() -> None:
    """A pipeline with replicas recounts its commits one by one by design: when none of them is
    left to recount (expired, or empty), its rows' scan (duplicates, the cluster allowance) is
    the check, and the pass names the ranges it did not recount; a pipeline without replicas
    that recounted nothing is not evaluated (the case above)."""
    unchecked = ["no partition range-recounted: the pipeline has replicas"]
    ranges = RangeRecount(unchecked=unchecked, by_commit_only=True)
    audit = PipelineAudit(CommitAudit(), AuditResult(rows=166), None, ranges)
    finding = check_exactly_once("tests.t", audit)
    assert finding.passed, finding.message
    assert "not recounted: no partition range-recounted" in finding.message


@pytest.mark.integration
def test_an_unrecorded_start_passes_only_partly(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, full_audit: Audit
) -> None:
    """A pipeline started at ``latest`` (offset 10) whose first commit expired and whose
    record of where reading began another engine removed: nothing says where reading began,
    so offsets 0-9, below the lowest row, are not checked. The audit passes on what it
    recounted, but says "passed, partly" and names the unchecked range in ``not_recounted``,
    never a plain pass."""
    topic, spec = new_pipeline("cover_unrecorded", produce=10, starting_position={"mode": "latest"})
    ingest(harness, spec)  # pins the start at 10
    ledger_producer.produce(topic, records(10, first=10))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    with harness.table(spec).transaction() as change:
        change.remove_properties(LEFT_OUT_PREFIX + spec.consumer_group_id)
    finding = full_audit(spec)
    assert finding.passed, finding.message
    assert finding.message.startswith("passed, partly: 1 range(s) or topic(s) not recounted")
    named = f"{topic}[0] offsets [0, 10), below the table's lowest row"
    assert named in finding.metadata["not_recounted"]
    assert finding.metadata["range_offsets_recounted"] == 10


def recreate_topic(kafka: KafkaResource, create_topic: CreateTopic, topic: str) -> str:
    """Delete ``topic`` and create it again under the same name (a new topic id), waiting
    (with a deadline) until the broker lets the name be reused; return the new id."""
    from confluent_kafka import KafkaException, TopicCollection

    admin = kafka.get_admin_client()
    for future in admin.delete_topics([topic]).values():
        future.result(DEADLINE_S)
    deadline, created = time.monotonic() + DEADLINE_S, False
    while True:
        try:
            if not created:
                create_topic(partitions=1, name=topic)
                created = True
            (described,) = admin.describe_topics(TopicCollection([topic])).values()
            return str(described.result(DEADLINE_S).topic_id)
        except KafkaException:
            assert time.monotonic() < deadline, f"{topic} could not be created again"
            time.sleep(0.2)


@pytest.mark.integration
def test_a_recreated_topic_is_named_not_compared(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
    create_topic: CreateTopic,
    full_audit: Audit,
) -> None:
    """The topic was deleted and recreated (the pipeline refuses it: TopicRecreatedError), and
    the new topic holds other records. The full audit compared the new topic's records with
    the old topic's rows (a false loss, or a read error read as an outage); now it names the
    topic with both ids and recounts nothing there: not evaluated, never an ERROR."""
    topic, spec = new_pipeline("cover_recreated", produce=10)
    ingest(harness, spec)
    ledger_producer.produce(topic, records(10, first=10))
    ingest(harness, spec)
    new_id = recreate_topic(kafka, create_topic, topic)
    ledger_producer.produce(topic, records(5, first=100))
    finding = full_audit(spec)
    assert (finding.passed, finding.severity) == (False, "WARN"), finding.message
    assert f"{topic}: recreated: topic id {new_id}, the table's offsets are for " in (
        finding.message
    )
    assert "could not recount" not in finding.message


@pytest.mark.integration
def test_retention_during_the_audit_is_named_and_read_past(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
) -> None:
    """Kafka's retention deletes offsets 0-11 after the partition's log start was read and
    before its range is: the read is out of range. The recount queries the log start again,
    reads the range from there and names the retention cut, instead of a read error that
    leaves the audit "not evaluated" for good."""
    topic, spec = new_pipeline("cover_retention_during", produce=10)
    ingest_batches(harness, spec, ledger_producer, topic, 2)
    consumer = kafka.get_consumer()
    try:
        (stale, _) = consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=10, cached=False
        )
        assert stale == 0
        delete_records(kafka, topic, 0, 12)
        held = list(range(20))
        recounted = recount_partition(
            consumer,
            (topic, 0),
            20,
            lambda log_start: (log_start, []),
            held,
            timeout_s=10.0,
            log_start=stale,
        )
    finally:
        consumer.close()
    assert recounted.range == OffsetRange(topic, 0, 12, 20)
    assert recounted.check is not None
    assert (recounted.check.visible, recounted.check.missing) == (8, 0)
    assert recounted.unchecked == [
        f"{topic}[0]: Kafka's retention deleted offsets [0, 12) during this audit (the log start "
        "moved from 0 to 12 before the range was read): recounted from the new log start"
    ]


@pytest.mark.integration
def test_an_unreadable_cleanup_policy_is_not_known(
    kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """``cleanup.policy`` as the broker describes it; a topic whose settings cannot be read
    (here: it does not exist; in production: no DescribeConfigs ACL) is None, not "delete"."""
    compacted = create_topic(partitions=1, **{"cleanup.policy": "compact"})
    plain = create_topic(partitions=1)
    policies = read_cleanup_policies(
        kafka.client_config(), {compacted, plain, "no-such-topic-here"}, 10.0
    )
    assert policies == {compacted: "compact", plain: "delete", "no-such-topic-here": None}


def test_a_doubt_is_not_a_pass() -> None:
    """Rows where Kafka holds no record on a topic whose cleanup.policy could not be read
    (they may be records log compaction removed), or records that are lost or dead letters
    not synced yet: the audit cannot tell, so it is a WARN naming them, never a pass nor an
    ERROR."""
    doubt = (
        "t[0]: 2 row(s) in [0, 30) at offsets where Kafka holds no record, at offsets 3-4: the "
        "topic's cleanup.policy could not be read (grant the principal DescribeConfigs on topic "
        "'t')"
    )
    audit = PipelineAudit(CommitAudit(), AuditResult(rows=30), ranges=recount(doubts=[doubt]))
    finding = check_exactly_once("tests.t", audit)
    assert (finding.passed, finding.severity) == (False, "WARN")
    assert f"not evaluated: the full audit cannot tell a loss from what it names: {doubt}" in (
        finding.message
    )
