"""Operator actions on the real stack: offset reset and group migration keep the oracle clean."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyiceberg.table import Table

from ingestion import exceptions
from ingestion.health.checks import check_group_consistency
from ingestion.health.state import read_state
from ingestion.ops.action import ActionCommit, commit_action
from ingestion.ops.reset import ResetRequest, apply_reset, migrate_group
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.mirror import read_group_offsets
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from ingestion.table.left_out import LEFT_OUT_PREFIX, Skip, find_left_out
from ingestion.table.offsets import snapshot_properties
from platform_assets.ingest.checks import audit_finding
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, crash, make_spec, records

pytestmark = pytest.mark.integration
SMALL = {"in_process_max_records": 10_000}  # no Spark: the offsets are the point here


def test_reset_to_timestamp_rereads_exactly_once(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic, spec = new_pipeline("reset_ts", partitions=2, errors_tolerance="all")
    ledger_producer.produce(topic, [*records(20), (b"bad", b"{", 0)])
    time.sleep(0.05)
    cutoff_ms = int(time.time() * 1000)
    ledger_producer.produce(topic, [*records(10, first=20), (b"bad2", b"{", 1)])
    assert harness.run(spec).records == 30
    reset = harness.plan_reset(spec, StartingPosition(mode="timestamp", timestamp_ms=cutoff_ms))
    assert all("re-read" in line for line in reset.describe())  # the dry run says what happens
    assert sum(before - after for before, after in reset.changes.values()) == 11
    apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops@example", "replay test")
    assert harness.table(spec).scan().to_arrow().num_rows == 20  # rows past the cutoff removed
    report = harness.run(spec)
    assert report.records == 10
    assert report.quarantined == 1
    harness.assert_exactly_once(spec, ledger)  # 30 rows + 2 quarantined, each once


def test_reset_while_a_run_is_in_flight_wins_and_the_run_aborts(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic, spec = new_pipeline("reset_race", produce=10)
    harness.run(spec)
    ledger_producer.produce(topic, records(10, first=10))
    reset = harness.plan_reset(spec, StartingPosition(mode="latest"))
    with pytest.raises(exceptions.CommitConflictError, match="run\\(s\\) in progress"):
        apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "x", active_runs=1)

    def reset_now(point: str, **context: Any) -> None:
        apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "skip the rest")

    with pytest.raises(exceptions.CommitConflictError):
        harness.run(spec, hooks=FailureHooks({"before_commit": reset_now}))
    assert harness.table(spec).scan().to_arrow().num_rows == 10  # skipped, as the operator said
    assert not harness.run(spec).committed


def test_group_migration_reads_nothing_twice_and_passes_the_check(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic = create_topic(partitions=2)
    old = make_spec(topic, "migrate", consumer_group_id="migrate-cg-control")
    ledger_producer.produce(topic, records(30))
    harness.run(old)
    admin = harness.kafka.get_admin_client()
    migration = migrate_group(
        harness.catalog, old, "migrate-connect-sink", admin, "ops", "seed fix"
    )
    assert migration.mirror.ok
    assert read_group_offsets(admin, "migrate-connect-sink") == migration.offsets
    assert migration.old_group_offsets == migration.offsets  # the old group is left as it was
    new = make_spec(topic, "migrate", consumer_group_id="migrate-connect-sink")
    assert not harness.run(new).committed  # nothing read twice
    ledger_producer.produce(topic, records(5, first=30))
    assert harness.run(new).records == 5
    harness.assert_exactly_once(new, ledger)
    consumer = harness.kafka.get_consumer()
    try:
        state = read_state(new, harness.table(new), admin, consumer)
    finally:
        consumer.close()
    assert check_group_consistency(state).passed
    with pytest.raises(exceptions.CommitConflictError, match="already has offsets"):
        migrate_group(harness.catalog, old, "migrate-connect-sink", admin, "ops", "again")


def test_maintenance_between_ingestions_keeps_oracle_and_watermark(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R31 by construction: compact + expire + orphan removal, then ingest again: clean."""
    from ingestion.ops.maintenance import longest_run_s, maintain_table, orphan_window
    from ingestion.table.offsets import find_committed_state

    topic, spec = new_pipeline("maintained", partitions=2, max_records_per_task=15)
    for batch in range(3):
        ledger_producer.produce(topic, records(40, first=batch * 40))
        if batch == 1:  # a crashed attempt leaves its written files behind as orphans (R2)
            with pytest.raises(exceptions.InjectedFailure):
                harness.run(spec, hooks=FailureHooks({"before_commit": crash}))
            crashed_at = time.time()
        harness.run(spec)
    table = harness.table(spec)
    files_before = len(table.inspect.files())
    window, _ = orphan_window(0, longest_run_s(table), 0)  # never below the longest run (R44)
    time.sleep(max(0.0, crashed_at + window - time.time()))
    report = maintain_table(table, 0, 0, min_orphan_window_s=0)
    assert report.files_compacted == files_before
    assert report.files_written < files_before
    assert report.expired_snapshots >= 2
    assert report.orphans_removed  # the crashed attempt's files
    table = harness.table(spec)
    assert find_committed_state(table, spec.consumer_group_id) is not None
    assert table.scan().to_arrow().num_rows == 120
    ledger_producer.produce(topic, records(20, first=120))
    assert harness.run(spec).records == 20
    harness.assert_exactly_once(spec, ledger)


def expire_all_but_head(table: Table) -> None:
    """Another engine's expiry keeping one snapshot: pyiceberg's ``expire_snapshots``."""
    head = table.current_snapshot()
    assert head is not None
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()


def skipped_of(harness: Harness, spec: PipelineSpec, topic: str) -> tuple[Skip, ...]:
    """The ranges the table's record says resets skipped on ``topic``[0]."""
    record = find_left_out(harness.table(spec), spec.consumer_group_id)
    assert record is not None
    return record.partitions[(topic, 0)].skipped


def test_forward_resets_merge_into_one_range_named_after_expiry(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    catalog_resource: IcebergCatalogResource,
    kafka: KafkaResource,
) -> None:
    """Five ``--shift-by +2`` resets in a row skip 10-19: the record keeps one range naming
    the first and the last reset and counting five (bounded however many resets there are:
    tests/ingestion/table/test_left_out.py); after every snapshot but the newest expired, the
    full audit passes and names it."""
    topic, spec = new_pipeline("reset_merge", produce=10, **SMALL)
    harness.run(spec)
    ledger_producer.produce(topic, records(10, first=10))
    commits = []
    for _ in range(5):
        reset = harness.plan_reset(spec, ResetRequest(shift_by=2))
        done = apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "skip a burst")
        commits.append(done.commit_id)
    (merged,) = skipped_of(harness, spec, topic)
    assert merged == Skip(10, 20, (commits[0], commits[-1]), 5)
    ledger_producer.produce(topic, records(10, first=20))
    harness.run(spec)
    expire_all_but_head(harness.table(spec))
    finding = audit_finding(spec, catalog_resource, kafka, full=True)
    assert finding.passed, finding.message
    assert (
        f"{topic}[0] [10, 20): 10 record(s) not expected: skipped by 5 offset resets, among "
        "them the offset reset on "
    ) in finding.message
    assert f"commit {commits[0]}, " in finding.message
    assert f"commit {commits[-1]}, " in finding.message


def test_a_reset_retried_or_replayed_records_its_skip_once(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """A commit that leaves the offsets alone (another writer's empty append) lands just before
    the reset's catalog call: the reset retries on the new head and records its skip, computed
    from that head, once. Replayed by its commit id (a retry after an unknown outcome that had
    landed) it writes nothing again; applied again from the same plan it aborts; the record
    stays as it was."""
    topic, spec = new_pipeline("reset_retried", produce=10, **SMALL)
    harness.run(spec)
    ledger_producer.produce(topic, records(10, first=10))
    reset = harness.plan_reset(spec, StartingPosition(mode="latest"))
    fired: list[str] = []

    def touch_once(point: str, **context: Any) -> None:
        fired.append(point)
        if len(fired) == 1:
            with harness.table(spec).transaction() as transaction:  # moves the head
                transaction.set_properties({"touched": "yes"})
                with transaction.update_snapshot().fast_append():
                    pass

    hooks = FailureHooks({"before_catalog_call": touch_once})
    done = apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "x", hooks=hooks)
    assert fired == ["before_catalog_call", "before_catalog_call"]  # retried on the new head
    table = harness.table(spec)
    assert table.properties["touched"] == "yes"
    assert skipped_of(harness, spec, topic) == (Skip(10, 20, (done.commit_id,)),)
    recorded = table.properties[LEFT_OUT_PREFIX + spec.consumer_group_id]
    snapshots = len(table.metadata.snapshots)
    head = table.current_snapshot()
    assert head is not None
    replay = ActionCommit(
        spec.name,
        "offset reset",
        spec.table,
        reset.table_uuid,
        {spec.consumer_group_id: reset.committed},
        snapshot_properties(head),
    )
    assert commit_action(harness.catalog, replay) == done.snapshot_id
    with pytest.raises(exceptions.CommitConflictError, match="changed since the reset was planned"):
        apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "x")
    table = harness.table(spec)
    assert len(table.metadata.snapshots) == snapshots
    assert table.properties[LEFT_OUT_PREFIX + spec.consumer_group_id] == recorded


def test_a_group_migration_carries_the_record_to_the_new_group(
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    catalog_resource: IcebergCatalogResource,
    kafka: KafkaResource,
) -> None:
    """A forward reset skipped 10-19 under the old group; the migration's commit carries the
    record to the new group and removes the old group's, in the same commit. After every
    snapshot but the newest expired, the full audit under the new group names the range."""
    topic = create_topic(partitions=1)
    old = make_spec(topic, "reset_migrated", consumer_group_id="reset-migrated-old", **SMALL)
    new = make_spec(topic, "reset_migrated", consumer_group_id="reset-migrated-new", **SMALL)
    ledger_producer.produce(topic, records(10))
    harness.run(old)
    ledger_producer.produce(topic, records(10, first=10))
    reset = harness.plan_reset(old, StartingPosition(mode="latest"))
    apply_reset(harness.catalog, old, reset, harness.cluster_id, "ops", "skip a bad burst")
    admin = harness.kafka.get_admin_client()
    migrate_group(harness.catalog, old, new.consumer_group_id, admin, "ops", "seed fix")
    table = harness.table(new)
    assert LEFT_OUT_PREFIX + old.consumer_group_id not in table.properties
    assert [(s.start, s.end) for s in skipped_of(harness, new, topic)] == [(10, 20)]
    ledger_producer.produce(topic, records(10, first=20))
    harness.run(new)
    expire_all_but_head(harness.table(new))
    finding = audit_finding(new, catalog_resource, kafka, full=True)
    assert finding.passed, finding.message
    assert f"{topic}[0] [10, 20): 10 record(s) not expected: skipped by the offset reset on " in (
        finding.message
    )
