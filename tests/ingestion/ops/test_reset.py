"""Operator actions on the real stack: offset reset and group migration keep the oracle clean."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ingestion import exceptions
from ingestion.health.checks import check_group_consistency
from ingestion.health.state import read_state
from ingestion.ops.reset import apply_reset, migrate_group
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.mirror import read_group_offsets
from ingestion.spec.pipeline import StartingPosition
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, crash, make_spec, records

pytestmark = pytest.mark.integration


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
