"""The production audit can see loss (R45-R47): each commit's ``added-records`` against an
independent read_committed recount of its ranges, new partitions and recorded lost ranges
without false alarms, and a cursor so that an evaluation recounts only the new commits."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetSelection, DagsterInstance, materialize
from pyiceberg.table import Table

from ingestion.audit.incremental import audit_commits
from ingestion.audit.oracle import PipelineAudit
from ingestion.audit.verdict import check_exactly_once
from ingestion.health.checks import Finding
from ingestion.ops.reset import apply_reset
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from ingestion.table.offsets import TopicOffsets, commit_properties, find_committed_state
from platform_assets.ingest.assets import build_pipeline_assets
from platform_assets.ingest.checks import audit_finding, build_pipeline_checks
from platform_assets.pipelines import table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, make_spec, records

pytestmark = pytest.mark.integration


Audit = Callable[[PipelineSpec], Finding]
"""``audit(spec)`` -> the exactly_once_audit finding of the pipeline: the fixture."""


@pytest.fixture
def audit(catalog_resource: IcebergCatalogResource, kafka: KafkaResource) -> Audit:
    """The exactly_once_audit finding of a pipeline, on the session's catalog and broker."""

    def _audit(spec: PipelineSpec) -> Finding:
        return audit_finding(spec, catalog_resource, kafka)

    return _audit


def ingest(harness: Harness, spec: PipelineSpec) -> Any:
    return harness.run(spec, use_spark=False)


def rows_of(harness: Harness, topic: str, name: str, start: int, end: int) -> pa.Table:
    """The rows the engine writes for offsets [start, end) of partition 0 (read by a scratch
    pipeline into its own table)."""
    scratch = make_spec(
        topic, name, starting_position={"mode": "offsets", "offsets": {f"{topic}:0": start}}
    )
    ingest(harness, scratch)
    return harness.table(scratch).scan(row_filter=f"_kafka_offset < {end}").to_arrow()


def commit_like_a_run(
    harness: Harness, spec: PipelineSpec, rows: pa.Table, next_offset: int, **extra: Any
) -> None:
    """Append ``rows`` in a snapshot carrying the properties a run would write (a run with a
    bug, or one that skipped a lost range)."""
    table = harness.table(spec)
    committed = find_committed_state(table, spec.consumer_group_id)
    assert committed is not None
    (topic, offsets), *_ = committed.offsets.items()
    properties = commit_properties(
        group_id=spec.consumer_group_id,
        offsets={topic: TopicOffsets(offsets.topic_id, {0: next_offset})},
        commit_id=uuid.uuid4().hex,
        cluster_id=harness.cluster_id,
        pipeline=spec.name,
        **extra,
    )
    table.append(rows, snapshot_properties=properties)


def test_a_commit_whose_files_miss_records_is_flagged(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, audit: Audit
) -> None:
    """R45: the commit says 10 records (``kafka.records``) and Kafka holds 10 in its range, but
    its files hold 9: the snapshot's ``added-records`` tells, the self-reported count does not."""
    topic, spec = new_pipeline("audit_loss", produce=20)
    ingest(harness, spec)
    assert audit(spec).passed
    ledger_producer.produce(topic, records(10, first=20))
    nine = rows_of(harness, topic, "audit_loss_src", 20, 29)
    commit_like_a_run(harness, spec, nine, 30, records=10)
    finding = audit(spec)
    assert not finding.passed
    assert "added 9 records" in finding.message
    assert "10 visible" in finding.message


def test_a_commit_adding_a_topic_is_not_a_false_alarm(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, audit: Audit
) -> None:
    """R46: a commit that adds a partition (here a new topic matching the pattern, R18) is
    recounted from where that partition's range started, and passes."""
    first = create_topic(partitions=1, name="auditpat-a")
    spec = make_spec(first, "audit_new_topic", topic_pattern=r"auditpat-[a-z]")
    ledger_producer.produce(first, records(10))
    ingest(harness, spec)
    second = create_topic(partitions=2, name="auditpat-b")
    ledger_producer.produce(second, records(12, first=100))
    ledger_producer.produce(first, records(5, first=10))
    assert ingest(harness, spec).records == 17
    finding = audit(spec)
    assert finding.passed, finding.message


def test_recorded_lost_ranges_are_not_flagged(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, audit: Audit
) -> None:
    """R46: a commit that skipped [10, 20) with ``on_data_loss: skip`` records the range as
    lost; the recount starts after it (here the records are still in Kafka, which makes a
    recount from the previous offsets a false alarm)."""
    topic, spec = new_pipeline("audit_lost", produce=10, on_data_loss="skip")
    ingest(harness, spec)
    ledger_producer.produce(topic, records(20, first=10))
    ten = rows_of(harness, topic, "audit_lost_src", 20, 30)
    commit_like_a_run(harness, spec, ten, 30, records=10, lost_ranges=[f"{topic}[0] [10, 20)"])
    finding = audit(spec)
    assert finding.passed, finding.message


def test_the_second_evaluation_recounts_only_new_commits(
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    kafka: KafkaResource,
    spark_resource: SparkResource,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
) -> None:
    """R47: the audit keeps a cursor (the last audited snapshot): the engine's second pass and
    the Dagster check's second evaluation recount only the commits made since."""
    topic, spec = new_pipeline("audit_cursor", partitions=2)
    for batch in range(3):
        ledger_producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, spec)
    group, config = spec.consumer_group_id, kafka.client_config()
    first = audit_commits(harness.table(spec), group, config, spec.name)
    assert first.ok, first.findings
    assert len(first.recounted) == 3
    ledger_producer.produce(topic, records(10, first=30))
    ingest(harness, spec)
    table = harness.table(spec)
    second = audit_commits(table, group, config, spec.name, after_snapshot_id=first.cursor)
    assert second.ok, second.findings
    assert second.recounted == [table.metadata.current_snapshot_id]

    with DagsterInstance.ephemeral() as instance:  # disposed: no dead instance left current
        resources = {"kafka": kafka, "iceberg": catalog_resource, "spark": spark_resource}

        def evaluate() -> dict[str, Any]:
            result = materialize(
                [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
                resources=resources,
                selection=AssetSelection.checks_for_assets(table_key(spec)),
                instance=instance,
            )
            (audit,) = [
                e
                for e in result.get_asset_check_evaluations()
                if e.check_name == "exactly_once_audit"
            ]
            assert audit.passed, audit.description
            return {key: value.value for key, value in audit.metadata.items()}

        assert evaluate()["commits_recounted"] == 4
        ledger_producer.produce(topic, records(10, first=40))
        ingest(harness, spec)
        assert evaluate()["commits_recounted"] == 1
        assert evaluate()["commits_recounted"] == 0


def test_full_audit_on_demand_recounts_every_commit_and_scans_every_row(
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    kafka: KafkaResource,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
) -> None:
    """R47: ``platform status --full-audit`` audits every commit and every row's coordinates."""
    from platform_assets.cli.main import pipeline_status

    topic, spec = new_pipeline("audit_full", partitions=2)
    for batch in range(2):
        ledger_producer.produce(topic, records(10, first=batch * 10))
        ingest(harness, spec)
    status = pipeline_status(spec, kafka, catalog_resource, full_audit=True)
    check = status.checks["exactly_once_audit"]
    assert check["passed"], check["message"]
    assert "each (topic, partition, offset) once: 20 rows" in check["message"]
    assert "2 commit(s) recounted" in check["message"]


def test_an_unrecountable_commit_is_retried_not_skipped(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
) -> None:
    """R47: a commit whose ranges cannot be recounted (here the cluster is unreachable) is not
    audited: the cursor stays before it, the check WARNs naming it, and the next evaluation
    (the cluster back) recounts it."""
    topic, spec = new_pipeline("audit_retry", produce=10)
    ingest(harness, spec)
    group, config = spec.consumer_group_id, kafka.client_config()
    first = audit_commits(harness.table(spec), group, config, spec.name)
    assert first.ok
    assert first.cursor is not None
    ledger_producer.produce(topic, records(10, first=10))
    ingest(harness, spec)
    table = harness.table(spec)
    newest = table.metadata.current_snapshot_id
    quiet = logging.getLogger("tests.unreachable_cluster")  # librdkafka's connect errors
    unreachable = {**config, "bootstrap.servers": "127.0.0.1:1", "logger": quiet}
    down = audit_commits(
        table, group, unreachable, spec.name, after_snapshot_id=first.cursor, timeout_s=2.0
    )
    assert down.recounted == []
    assert down.cursor == first.cursor  # not moved past the commit it could not recount
    assert down.unrecounted_snapshot == newest
    assert f"could not recount {topic}[0] [10, 20)" in (down.unrecounted or "")
    assert (down.pending, down.backlog_offsets) == (1, 10)
    finding = check_exactly_once(spec.table, PipelineAudit(down))
    assert (finding.passed, finding.severity) == (False, "WARN")
    assert f"snapshot {newest}: could not recount {topic}[0]" in finding.message
    back = audit_commits(table, group, config, spec.name, after_snapshot_id=down.cursor)
    assert back.ok, back.findings
    assert back.recounted == [newest]
    assert back.cursor == newest


def test_an_audit_over_its_budget_reports_its_backlog_and_catches_up(
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    kafka: KafkaResource,
    spark_resource: SparkResource,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
) -> None:
    """R47: with more new offsets than one evaluation may recount (``audit_recount_offsets``),
    the Dagster check reports the backlog (commits, offsets, the oldest's age) and WARNs while
    one budget cannot clear it; the cursor moves on each evaluation until it is audited."""
    topic, spec = new_pipeline("audit_backlog", produce=10, audit_recount_offsets=15)
    ingest(harness, spec)
    resources = {"kafka": kafka, "iceberg": catalog_resource, "spark": spark_resource}
    with DagsterInstance.ephemeral() as instance:

        def evaluate() -> Any:
            result = materialize(
                [*build_pipeline_assets(spec), build_pipeline_checks(spec)],
                resources=resources,
                selection=AssetSelection.checks_for_assets(table_key(spec)),
                instance=instance,
            )
            (audit,) = [
                e
                for e in result.get_asset_check_evaluations()
                if e.check_name == "exactly_once_audit"
            ]
            return audit

        assert evaluate().passed
        for batch in range(3):
            ledger_producer.produce(topic, records(10, first=10 + batch * 10))
            ingest(harness, spec)
        behind = evaluate()
        figures = {k: v.value for k, v in behind.metadata.items()}
        assert not behind.passed
        assert behind.severity.value == "WARN"
        assert "the audit is falling behind" in behind.description
        assert (figures["commits_recounted"], figures["backlog_commits"]) == (1, 2)
        assert figures["backlog_offsets"] == 20
        assert figures["oldest_unaudited_age_s"] >= 0
        catching_up = evaluate()
        assert catching_up.passed, catching_up.description
        assert catching_up.metadata["backlog_commits"].value == 1
        done = evaluate()
        assert done.passed, done.description
        assert done.metadata["backlog_commits"].value == 0
        assert done.metadata["audit_cursor"].value == str(
            harness.table(spec).metadata.current_snapshot_id
        )


def expire_all_but_head(table: Table) -> None:
    """Another engine's expiry keeping one snapshot: pyiceberg's ``expire_snapshots``."""
    head = table.current_snapshot()
    assert head is not None
    older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()


def test_a_forward_reset_among_expired_commits_is_named_by_the_gap_audit(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    kafka: KafkaResource,
) -> None:
    """R56: after the audit's cursor, a forward reset skips offsets 10-19 and a run reads
    20-29; another engine expires every snapshot but the newest before the audit sees them.
    The gap from the cursor's offsets is audited as one range: the table's record of what the
    group's reads left out (``kafka.left-out.<group>``) names the skipped range, so only 20-29
    are expected and the audit passes. A loss there still fails it: the reset excuses nothing
    else."""
    topic, spec = new_pipeline("audit_gap_reset", produce=10)
    ingest(harness, spec)
    group, config = spec.consumer_group_id, kafka.client_config()
    first = audit_commits(harness.table(spec), group, config, spec.name)
    assert first.ok, first.findings
    assert first.cursor_offsets == {(topic, 0): 10}
    ledger_producer.produce(topic, records(10, first=10))
    reset = harness.plan_reset(spec, StartingPosition(mode="latest"))
    apply_reset(harness.catalog, spec, reset, harness.cluster_id, "ops", "skip a bad burst")
    ledger_producer.produce(topic, records(10, first=20))
    ingest(harness, spec)
    head = harness.table(spec).current_snapshot()
    assert head is not None
    expire_all_but_head(harness.table(spec))
    gap = audit_commits(
        harness.table(spec),
        group,
        config,
        spec.name,
        after_snapshot_id=first.cursor,
        cursor_offsets=first.cursor_offsets,
    )
    assert gap.ok, gap.findings
    assert any(
        f"{topic}[0] [10, 20) not expected: skipped by the offset reset on " in note
        and "by 'ops' (reason 'skip a bad burst'" in note
        for note in gap.notes
    ), gap.notes
    assert "audited as one range: 10 offsets, 10 records held once each" in " ".join(gap.notes)
    assert gap.cursor == head.snapshot_id
    harness.table(spec).delete(delete_filter="_kafka_offset = 25")  # then that expires too
    ledger_producer.produce(topic, records(5, first=30))
    ingest(harness, spec)
    expire_all_but_head(harness.table(spec))
    lossy = audit_commits(
        harness.table(spec),
        group,
        config,
        spec.name,
        after_snapshot_id=first.cursor,
        cursor_offsets=first.cursor_offsets,
    )
    assert lossy.findings == [
        "commits expired by another tool: the table and its quarantine table hold 14 records "
        "of their ranges (15 offsets) but Kafka holds 15 visible records"
    ]
