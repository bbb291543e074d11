"""Maintenance on a busy table (R40-R44): incremental compaction, per-group compare-and-set
that survives concurrent commits, expiry that retires migrated groups and races a rollback
safely, orphan removal that refuses what it cannot prove unreferenced. Judged by the oracle."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.update import SetLocationUpdate

from ingestion import exceptions
from ingestion.ops.maintenance import maintain_table
from ingestion.ops.reset import apply_reset, migrate_group
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.recovery import list_file_paths, list_orphan_files, remove_orphan_files
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from ingestion.table.offsets import find_committed_state
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, crash, make_spec, records

pytestmark = pytest.mark.integration


def ingest(harness: Harness, spec: PipelineSpec, **kwargs: Any) -> Any:
    """One in-process run (no Spark: these tests are about the table, not the executors)."""
    return harness.run(spec, use_spark=False, **kwargs)


def test_compaction_rewrites_only_what_is_new(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R40: a second pass with little new data rewrites the new small files only; a pass with
    nothing new rewrites nothing (today every pass rewrote the whole table)."""
    topic, spec = new_pipeline("compact_incr", partitions=2, max_records_per_task=10)
    for batch in range(3):
        ledger_producer.produce(topic, records(40, first=batch * 40))
        ingest(harness, spec)
    first = maintain_table(harness.table(spec), 3600, 3600)
    assert first.rows_rewritten == 120
    ledger_producer.produce(topic, records(20, first=120))
    ingest(harness, spec)
    second = maintain_table(harness.table(spec), 3600, 3600)
    assert second.rows_rewritten == 20, "only the new rows are rewritten"
    third = maintain_table(harness.table(spec), 3600, 3600)
    assert third.rows_rewritten == 0, "nothing new: nothing rewritten"
    assert harness.table(spec).scan().to_arrow().num_rows == 140
    harness.assert_exactly_once(spec, ledger)


def test_compaction_losing_to_an_ingestion_commit_retries_and_maintenance_goes_on(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R41: an ingestion commit lands between a compaction group's plan and its commit: the
    group is committed again on the new head (its input files are still live), and expiry and
    orphan removal still run."""
    topic, spec = new_pipeline("compact_vs_run", partitions=2, produce=40, max_records_per_task=10)
    ingest(harness, spec)
    ledger_producer.produce(topic, records(20, first=40))
    with pytest.raises(exceptions.InjectedFailure):  # leaves orphan files (R2)
        ingest(harness, spec, hooks=FailureHooks({"before_commit": crash}))
    raced: list[int] = []

    def ingest_now(point: str, **context: Any) -> None:
        if not raced:
            raced.append(ingest(harness, spec).records)

    table = harness.table(spec)
    report = maintain_table(
        table,
        0,
        0,
        hooks=FailureHooks({"before_compaction_commit": ingest_now}),
        min_orphan_window_s=0,
    )
    assert raced == [20]
    assert report.rows_rewritten >= 40
    assert report.groups_retried == 1
    assert report.expired_snapshots >= 1
    harness.assert_exactly_once(spec, ledger)
    assert harness.table(spec).scan().to_arrow().num_rows == 60


def test_compaction_losing_to_a_reset_delete_resurrects_nothing(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R41: a backward reset deletes rows from the files a compaction group has read: the group
    is re-planned from the new head (never committed over it), the deleted rows stay deleted,
    and the next run re-reads them exactly once."""
    topic, spec = new_pipeline(
        "compact_vs_reset",
        produce=30,
        max_records_per_task=10,
        partition_by=[{"source": "id", "transform": "bucket[2]"}],
    )
    ingest(harness, spec)
    reset = harness.plan_reset(spec, StartingPosition(mode="offsets", offsets={f"{topic}:0": 15}))
    rows_seen: list[int] = []

    def reset_now(point: str, **context: Any) -> None:
        if not rows_seen:
            apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "rewind")
            rows_seen.append(harness.table(spec).scan().to_arrow().num_rows)

    report = maintain_table(
        harness.table(spec),
        3600,
        3600,
        hooks=FailureHooks({"before_compaction_commit": reset_now}),
    )
    assert rows_seen == [15]
    assert report.compaction.groups_replanned == 1, report  # its inputs were rewritten
    assert not report.errors
    assert harness.table(spec).scan().to_arrow().num_rows == 15, "deleted rows came back"
    assert ingest(harness, spec).records == 15
    harness.assert_exactly_once(spec, ledger)


def test_expiry_after_a_migration_retires_the_old_group(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R42: after a group migration the old group's last commit no longer pins every later
    snapshot; the current group's offsets stay reachable."""
    topic, old = new_pipeline("expire_migrated", partitions=2, consumer_group_id="expire-old")
    for batch in range(2):
        ledger_producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, old)
    admin = harness.kafka.get_admin_client()
    migrate_group(harness.catalog, old, "expire-new", admin, "ops", "rename")
    new = make_spec(topic, "expire_migrated", consumer_group_id="expire-new")
    for batch in range(2, 5):
        ledger_producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, new)
    report = maintain_table(harness.table(new), 0, 3600, compact=False)
    table = harness.table(new)
    assert report.kept_for_watermark == 0, report
    assert len(table.metadata.snapshots) == 1  # the head carries the current group's offsets
    assert find_committed_state(table, "expire-new") is not None
    ledger_producer.produce(topic, records(10, first=50))
    assert ingest(harness, new).records == 10
    harness.assert_exactly_once(new, ledger)


def test_expiry_racing_an_external_rollback_keeps_the_new_head(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R43: another tool rolls the table back (R32) while expiry is planned from the old head:
    the expiry is a compare-and-set on the head, so it is planned again and never removes the
    snapshot the table now points at, nor the path to its offsets."""
    topic, spec = new_pipeline("expire_vs_rollback")
    for batch in range(3):
        ledger_producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, spec)
    table = harness.table(spec)
    ancestors = [s.snapshot_id for s in table.snapshots()]
    target = ancestors[1]

    def rollback(point: str, **context: Any) -> None:
        harness.table(spec).manage_snapshots().rollback_to_snapshot(target).commit()

    maintain_table(
        table,
        0,
        3600,
        compact=False,
        hooks=FailureHooks({"before_expiry_commit": rollback}),
    )
    table = harness.table(spec)
    current = table.current_snapshot()
    assert current is not None, "expiry removed the snapshot the table points at"
    assert current.snapshot_id == target
    assert table.scan().to_arrow().num_rows == 20
    assert ingest(harness, spec).records == 10  # the rolled-back range is read again (R32)
    harness.assert_exactly_once(spec, ledger)


def small_table(catalog: Catalog, name: str, location: str, **properties: str) -> Table:
    """A real table with two data files, created at ``location`` spelled as given."""
    rows = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
    if not catalog.namespace_exists("paths"):
        catalog.create_namespace("paths")
    table = catalog.create_table(
        f"paths.{name}", schema=rows.schema, location=location, properties=properties
    )
    table.append(rows)
    table.append(rows)
    return catalog.load_table(f"paths.{name}")


@pytest.mark.parametrize("spelling", ["file:/", "file:///", "plain"])
def test_orphans_compare_paths_however_they_are_spelt(
    harness: Harness, tmp_path: Path, spelling: str
) -> None:
    """R44: a table whose location reads ``file:/...`` (or ``file:///...``, or a plain path)
    has no orphan among its live files."""
    root = str(tmp_path / "table").lstrip("/")
    location = {"file:/": f"file:/{root}", "file:///": f"file:///{root}", "plain": f"/{root}"}
    table = small_table(harness.catalog, f"spelt_{len(spelling)}", location[spelling])
    current = table.current_snapshot()
    assert current is not None
    assert len(list_file_paths(table, current)) == 2
    assert list_orphan_files(table, older_than_s=0) == []
    assert remove_orphan_files(table, older_than_s=0) == []
    assert harness.catalog.load_table(table.name()).scan().to_arrow().num_rows == 6


def test_orphan_removal_refuses_when_references_and_listing_do_not_overlap(
    harness: Harness, tmp_path: Path
) -> None:
    """R44: the table's files were written under a location spelt one way (a symlinked path;
    s3a:// or a mount point alike) and the location now reads another: the listing spells every
    file differently from the references, so nothing can be proven unreferenced. Orphan
    removal refuses, deletes nothing, and the table stays readable."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    os.symlink(real, link)
    table = small_table(harness.catalog, "respelt", str(link / "t"))
    moved = SetLocationUpdate(
        location=str(real / "t")
    )  # Transaction.update_location: 0.12 lacks it
    harness.catalog.commit_table(table, (), (moved,))
    table = harness.catalog.load_table(table.name())
    with pytest.raises(exceptions.IngestionError, match="refus"):
        remove_orphan_files(table, older_than_s=0)
    assert len(list(os.scandir(real / "t" / "data"))) == 2
    assert harness.catalog.load_table(table.name()).scan().to_arrow().num_rows == 6


def test_orphan_window_is_never_below_the_longest_run(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R44: the table has seen a run that took 2 s from plan to commit; a window of 0 is raised
    to twice that, so the files of an attempt younger than it are kept (they could still be
    committed); once older, they are removed."""
    topic, spec = new_pipeline("orphan_window", produce=10)

    def stall(point: str, **context: Any) -> None:
        time.sleep(2)

    ingest(harness, spec, hooks=FailureHooks({"before_commit": stall}))
    ledger_producer.produce(topic, records(10, first=10))
    with pytest.raises(exceptions.InjectedFailure):
        ingest(harness, spec, hooks=FailureHooks({"before_commit": crash}))
    report = maintain_table(harness.table(spec), 3600, 0, compact=False, min_orphan_window_s=0)
    assert report.orphans_removed == []
    assert report.orphan_window_s >= 4
    assert "longest run" in report.orphan_window_reason
    time.sleep(report.orphan_window_s)
    report = maintain_table(harness.table(spec), 3600, 0, compact=False, min_orphan_window_s=0)
    assert len(report.orphans_removed) >= 1
    ingest(harness, spec)
    harness.assert_exactly_once(spec, ledger)


def test_expiry_keeps_the_commits_the_audit_has_not_recounted(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R47: expiry never removes the commits after the audit's cursor; when they were expired
    anyway (a manual expiry without the cursor), the audit says so instead of passing."""
    from ingestion.audit.incremental import audit_commits
    from ingestion.ops.maintenance import expire_snapshots

    topic, spec = new_pipeline("audit_keep", produce=10)
    ingest(harness, spec)
    cursor = harness.table(spec).current_snapshot()
    assert cursor is not None
    for batch in range(3):
        ledger_producer.produce(topic, records(5, first=100 + 10 * batch))
        ingest(harness, spec)
    group = spec.consumer_group_id
    time.sleep(0.01)
    now_ms = int(time.time() * 1000)
    expired, _ = expire_snapshots(
        harness.table(spec), now_ms, {group}, keep_after=cursor.snapshot_id
    )
    assert expired == 0  # everything after the cursor (and the cursor) kept
    audit = audit_commits(
        harness.table(spec),
        group,
        harness.kafka.client_config(),
        spec.name,
        after_snapshot_id=cursor.snapshot_id,
    )
    assert (audit.ok, len(audit.recounted), audit.cursor_expired) == (True, 3, None)
    expired, _ = expire_snapshots(harness.table(spec), now_ms, {group})  # without the cursor
    assert expired == 3
    audit = audit_commits(
        harness.table(spec),
        group,
        harness.kafka.client_config(),
        spec.name,
        after_snapshot_id=cursor.snapshot_id,
    )
    assert audit.cursor_expired == cursor.snapshot_id  # check_exactly_once: ERROR (test_checks)
    harness.assert_exactly_once(spec, ledger)


def test_compaction_yields_to_an_operator_action_and_the_next_pass_goes_on(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """An operator action on the pipeline (its run holds it) stops compaction before its next
    group, so the action's own commit does not lose its compare-and-set to one compaction
    commit after another; expiry and orphan removal still run, and the next pass compacts."""
    topic, spec = new_pipeline("compact_yield", partitions=2, max_records_per_task=10)
    for batch in range(3):
        ledger_producer.produce(topic, records(40, first=batch * 40))
        ingest(harness, spec)
    held = maintain_table(
        harness.table(spec), 3600, 3600, yield_to=lambda: "operator action in progress (run r1)"
    )
    assert held.compaction.stopped == "operator action in progress (run r1)"
    assert held.rows_rewritten == 0
    assert not held.errors
    assert any("compaction stopped early (operator action" in line for line in held.describe())
    free = maintain_table(harness.table(spec), 3600, 3600, yield_to=lambda: None)
    assert free.rows_rewritten == 120
    assert not free.compaction.stopped
    harness.assert_exactly_once(spec, ledger)
