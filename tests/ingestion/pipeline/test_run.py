"""The exactly-once engine end to end on the real stack (Apache Kafka, SQLite catalog, local Spark).

Every test names its docs/reliability.md scenario and is judged by the same oracle
(``Harness.assert_exactly_once``: ingestion.audit.oracle against the producer's ledger).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.transforms import IdentityTransform

from ingestion import exceptions
from ingestion.pipeline.commit import commit_data
from ingestion.pipeline.hooks import RUN_HOOK_POINTS, FailureHooks
from ingestion.pipeline.mirror import read_group_offsets
from ingestion.pipeline.recovery import list_orphan_files, remove_orphan_files
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import (
    LOST_RANGES,
    OFFSETS_PREFIX,
    find_committed_state,
    iter_ancestry,
    read_position,
    snapshot_properties,
)
from tests.support.ledger import Ledger, LedgerEntry, LedgerProducer
from tests.support.pipelines import CreateTopic, Harness, NewPipeline, crash, make_spec, records

pytestmark = pytest.mark.integration


def crash_once(marker: Path) -> Callable[..., None]:
    """A hook that crashes the first time only (the marker file survives across processes)."""

    def hook(point: str, **context: Any) -> None:
        if not marker.exists():
            marker.write_text(point)
            raise exceptions.InjectedFailure(f"injected crash at {point}")

    return hook


def test_ingest_then_idle_run_makes_no_snapshot(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R10, R25: one run ingests everything; an idle run commits nothing; no reader groups."""
    _, spec = new_pipeline("basic", partitions=3, produce=1000)
    report = harness.run(spec)
    assert report.committed
    assert report.records == 1000
    assert report.files >= 3
    assert report.lag_after == 0
    assert report.mirror is not None
    assert report.mirror.ok
    table = harness.table(spec)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    rows = table.scan(row_filter="id = 7").to_arrow().to_pylist()
    assert rows[0]["amount"] == Decimal("7.25")
    assert rows[0]["_kafka_key"] == "k7"
    idle = harness.run(spec)
    assert not idle.committed
    assert harness.table(spec).current_snapshot().snapshot_id == snapshot.snapshot_id  # type: ignore[union-attr]
    harness.assert_exactly_once(spec, ledger)
    admin = harness.kafka.get_admin_client()
    for helper in ("kafka-iceberg-basic-reader", "kafka-iceberg-basic-planner"):
        assert read_group_offsets(admin, helper) == {}, f"{helper} must never commit"
    assert sum(read_group_offsets(admin, spec.consumer_group_id).values()) == 1000


def test_capped_runs_resume_from_the_table(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R21, R17: capped end offsets are exactly what is committed; records after plan wait."""
    topic, spec = new_pipeline(
        "capped", partitions=2, produce=700, max_records_per_run=300, max_records_per_task=100
    )
    produced_late: list[Any] = []

    def produce_after_plan(point: str, **context: Any) -> None:
        if not produced_late:
            produced_late.extend(ledger_producer.produce(topic, records(50, first=10_000)))

    first = harness.run(spec, hooks=FailureHooks({"after_plan": produce_after_plan}))
    assert first.records == 300
    assert sum(first.offsets_after.values()) == 300
    while harness.run(spec).committed:
        pass
    result = harness.assert_exactly_once(spec, ledger)
    assert result.rows == 750


@pytest.mark.parametrize("point", RUN_HOOK_POINTS)
def test_crash_at_each_hook_then_rerun(
    point: str,
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """R2, R3, R4, R6, R9: a crash at any point, then a normal run: 0 lost, 0 duplicated.

    A crash right after the catalog call is an ambiguous outcome: the run reconciles by commit
    id, finds its snapshot and succeeds (R3). Every other crash fails the run.
    """
    topic, spec = new_pipeline(f"crash_{point}", partitions=2, produce=400)
    if point == "after_catalog_call":
        assert harness.run(spec, hooks=FailureHooks({point: crash})).committed
    else:
        with pytest.raises(exceptions.IngestionError):
            harness.run(spec, hooks=FailureHooks({point: crash}))
    ledger_producer.produce(topic, records(100, first=400))
    harness.run(spec)
    harness.run(spec)
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)


def test_task_retry_commits_one_file_set(
    tmp_path: Path, harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R1: a task crashes after writing its files and is retried: the retry's files commit."""
    _, spec = new_pipeline("task_retry", produce=300)
    marker = tmp_path / "crashed"

    def crash_after_write(point: str, **context: Any) -> None:
        if context.get("stage") == "written":
            crash_once(marker)(point)

    report = harness.run(spec, hooks=FailureHooks({"in_task": crash_after_write}))
    assert marker.exists()
    assert report.records == 300
    harness.assert_exactly_once(spec, ledger)
    table = harness.table(spec)
    orphans = list_orphan_files(table, older_than_s=0)
    assert orphans, "the crashed attempt's files should be orphans"
    removed = remove_orphan_files(table, older_than_s=0)
    assert removed == orphans
    assert harness.table(spec).scan().to_arrow().num_rows == 300
    harness.assert_exactly_once(spec, ledger)


def test_replayed_commit_is_idempotent(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R5: the commit step runs twice with the same plan (an op retry resubmits the plan, its
    files and its snapshot properties): success, no second snapshot, no file touched."""
    _, spec = new_pipeline("replay", partitions=2, produce=50, max_records_per_task=20)
    captured: dict[str, Any] = {}

    def capture(point: str, **context: Any) -> None:
        captured.setdefault("plan", context["plan"])

    first = harness.run(spec, hooks=FailureHooks({"after_commit": capture}))
    table = harness.table(spec)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.snapshot_id == first.snapshot_id
    files = [  # the first commit of the table: every live file is one the run committed
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]
    assert len(files) == first.files >= 3
    properties = {  # the engine's own properties, as the run passed them
        k: v for k, v in snapshot_properties(snapshot).items() if k.startswith("kafka.")
    }
    outcome = commit_data(harness.catalog, captured["plan"], files, properties)
    assert (outcome.replayed, outcome.snapshot_id) == (True, first.snapshot_id)
    table = harness.table(spec)
    assert [s.snapshot_id for s in table.metadata.snapshots] == [first.snapshot_id]
    assert all(table.io.new_input(f.file_path).exists() for f in files), "a replay deletes none"
    assert table.scan().to_arrow().num_rows == 50
    harness.assert_exactly_once(spec, ledger)


def test_racing_coordinators_one_wins(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R7, R8: a second run commits while the first is paused; the first aborts, names it."""
    _, spec = new_pipeline("race", partitions=2, produce=200)
    winner: dict[str, Any] = {}

    def run_the_other_coordinator(point: str, **context: Any) -> None:
        if not winner:
            winner["report"] = harness.run(spec)

    with pytest.raises(exceptions.CommitConflictError) as excinfo:
        harness.run(spec, hooks=FailureHooks({"before_commit": run_the_other_coordinator}))
    assert winner["report"].commit_id in str(excinfo.value)
    assert harness.table(spec).scan().to_arrow().num_rows == 200
    assert not list_orphan_files(harness.table(spec), older_than_s=0), "loser must delete its files"
    harness.assert_exactly_once(spec, ledger)


def test_concurrent_foreign_commit_is_retried(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R27: another writer commits (no offsets) between load and commit: refresh, re-check,
    retry; the run commits once, on top of the foreign snapshot."""
    import pyarrow as pa

    topic, spec = new_pipeline("foreign_writer", produce=30)
    before = harness.run(spec)
    ledger_producer.produce(topic, records(30, first=30))
    fired: list[str] = []
    foreign: list[int] = []

    def foreign_commit_on_first_attempt(point: str, **context: Any) -> None:
        fired.append(point)
        if point == "before_catalog_call" and not foreign:
            table = harness.table(spec)
            table.append(pa.Table.from_pylist([], schema=table.schema().as_arrow()))
            foreign.append(harness.table(spec).current_snapshot().snapshot_id)  # type: ignore[union-attr]

    hooks = FailureHooks(
        {p: foreign_commit_on_first_attempt for p in ("before_catalog_call", "after_catalog_call")}
    )
    report = harness.run(spec, hooks=hooks)
    assert report.committed
    assert fired == ["before_catalog_call", "before_catalog_call", "after_catalog_call"]
    table = harness.table(spec)
    lineage = [s.snapshot_id for s in iter_ancestry(table)]
    assert lineage == [report.snapshot_id, foreign[0], before.snapshot_id]
    harness.assert_exactly_once(spec, ledger)


def test_dropped_table_fails_and_nothing_advances(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """R29, R30: the table is dropped (and recreated) during the run: the commit refuses."""
    _, spec = new_pipeline("dropped", produce=20)

    def drop_and_recreate(point: str, **context: Any) -> None:
        from ingestion.table.schema import load_or_create_table

        harness.catalog.drop_table(spec.table)
        load_or_create_table(harness.catalog, spec)

    with pytest.raises(exceptions.TableDroppedError, match="recreated"):
        harness.run(spec, hooks=FailureHooks({"before_commit": drop_and_recreate}))
    assert harness.table(spec).current_snapshot() is None

    def drop(point: str, **context: Any) -> None:
        harness.catalog.drop_table(spec.table)

    with pytest.raises(exceptions.TableDroppedError, match="dropped"):
        harness.run(spec, hooks=FailureHooks({"before_commit": drop}))
    assert read_group_offsets(harness.kafka.get_admin_client(), spec.consumer_group_id) == {}


def test_recreated_topic_fails_the_run(
    harness: Harness, new_pipeline: NewPipeline, create_topic: CreateTopic
) -> None:
    """R20, R19: the topic is deleted (fails) and recreated (new id: fails, asks for reset)."""
    topic, spec = new_pipeline("recreated", produce=10)
    harness.run(spec)
    admin = harness.kafka.get_admin_client()
    for future in admin.delete_topics([topic]).values():
        future.result(15)
    with pytest.raises(exceptions.TopicNotFoundError, match=topic):
        harness.run(spec)
    create_topic(partitions=1, name=topic)
    with pytest.raises(exceptions.TopicRecreatedError, match="Reset the pipeline's offsets"):
        harness.run(spec)


def test_renamed_group_is_refused(harness: Harness, new_pipeline: NewPipeline) -> None:
    """R22: offsets exist under another group only: refuse, never fall back to earliest."""
    topic, spec = new_pipeline("renamed", produce=10)
    harness.run(spec)
    renamed = make_spec(topic, "renamed", consumer_group_id="connect-sink-group")
    with pytest.raises(exceptions.GroupMismatchError) as excinfo:
        harness.run(renamed)
    assert "'group-renamed'" in str(excinfo.value)
    assert "'connect-sink-group'" in str(excinfo.value)


def test_expired_watermark_on_non_empty_table_fails(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """R31: no snapshot in the ancestry carries our offsets, the table is not empty, and the
    position table property is not proven (R56: another writer deleted its witness row): fail."""
    _, spec = new_pipeline("expired", produce=10)
    harness.run(spec)
    table = harness.table(spec)
    position = read_position(table.metadata.properties, spec.consumer_group_id)
    assert position is not None
    assert position.witness is not None
    w = position.witness
    table.delete(f"_kafka_partition = {w.partition} and _kafka_offset = {w.offset}")
    table = harness.table(spec)
    current = table.current_snapshot()
    assert current is not None
    older = [
        s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id
    ]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    with pytest.raises(exceptions.MissingOffsetsError, match="holds rows but no snapshot"):
        harness.run(spec)


def test_new_topic_matching_pattern_starts_at_earliest(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R18: a topic that starts matching the pattern is read from its earliest offset."""
    first = create_topic(partitions=1, name="patt-a")
    ledger_producer.produce(first, records(20))
    spec = make_spec(first, "pattern", topic_pattern=r"patt-[a-z]")
    harness.run(spec)
    second = create_topic(partitions=2, name="patt-b")
    ledger_producer.produce(second, records(30, first=100))
    report = harness.run(spec)
    assert report.records == 30
    harness.assert_exactly_once(spec, ledger)
    properties = harness.table(spec).current_snapshot().summary.additional_properties  # type: ignore[union-attr]
    assert '"patt-b"' in properties[OFFSETS_PREFIX + spec.consumer_group_id]


def test_boundaries_single_record_and_impossible_end(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R17: exactly one record; a planned end past the real end fails the task, no commit."""
    from ingestion.kafka.ranges import OffsetRange
    from ingestion.task.prepare import TaskSpec, read_chunks

    topic, spec = new_pipeline("one_record", produce=1)
    assert harness.run(spec).records == 1
    harness.assert_exactly_once(spec, ledger)
    task = TaskSpec(
        pipeline="one_record",
        range=OffsetRange(topic, 0, 0, 5),
        kafka_config=harness.kafka.client_config(),
        value_format="json",
        key_format="string",
        table_metadata_json="{}",
        quarantine_metadata_json=None,
        io_properties={},
        errors_tolerance="none",
        commit_id="c",
        read_timeout_s=2.0,
    )
    with pytest.raises(exceptions.ReadError, match=r"no progress past offset 1"):
        list(read_chunks(task))


def test_transaction_markers_leave_gaps_that_tasks_cross(
    harness: Harness, create_topic: CreateTopic, kafka: Any, ledger: Ledger
) -> None:
    """R14, R15, R26: committed transactions (markers = offset gaps) in capped runs."""
    topic = create_topic(partitions=3)
    producer = LedgerProducer(kafka, ledger, **{"transactional.id": f"tx-{topic}"})
    for batch in range(6):
        producer.produce_transaction(topic, records(40, first=batch * 40))
    spec = make_spec(topic, "transactions", max_records_per_run=100, max_records_per_task=30)
    while harness.run(spec).committed:
        pass
    result = harness.assert_exactly_once(spec, ledger)
    assert result.rows == 240
    report = harness.run(spec)
    assert report.lag_after == 0
    ends = {(topic, p): o for (t, p), o in report.end_offsets.items()}
    assert read_group_offsets(kafka.get_admin_client(), spec.consumer_group_id) == ends


def test_foreign_member_rejects_the_mirror_not_the_ingestion(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """R23, R24: someone else consumes with our group id: the mirror is rejected and reported,
    the ingestion commits. Once they leave, the next run recreates the mirror."""
    import time

    topic, spec = new_pipeline("foreign_member", produce=20)
    intruder = harness.kafka.get_consumer(**{"group.id": spec.consumer_group_id})
    intruder.subscribe([topic])
    deadline = time.monotonic() + 60
    while not intruder.assignment() and time.monotonic() < deadline:
        intruder.poll(0.5)
    assert intruder.assignment(), "the intruder never joined its group"
    try:
        report = harness.run(spec)
    finally:
        intruder.close()
    assert report.committed
    assert report.mirror is not None
    assert report.mirror.foreign_members
    assert "active members" in (report.mirror.error or "")
    harness.assert_exactly_once(spec, ledger)
    repaired = harness.run(spec)
    assert repaired.mirror is not None
    assert repaired.mirror.ok
    assert read_group_offsets(harness.kafka.get_admin_client(), spec.consumer_group_id) == {
        (topic, 0): 20
    }


class FlakyCatalog:
    """A real catalog behind a proxy whose first ``outages`` loads fail (unit level, R28)."""

    def __init__(self, catalog: Any, outages: int) -> None:
        self.catalog = catalog
        self.outages = outages

    def load_table(self, identifier: str) -> Any:
        if self.outages > 0:
            self.outages -= 1
            raise ConnectionError("catalog unavailable")
        return self.catalog.load_table(identifier)


def test_unavailable_catalog_is_retried_then_fails(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """R28: bounded retry with backoff, then fail with nothing committed."""
    from ingestion.pipeline.commit import load_table_with_retry

    _, spec = new_pipeline("flaky_catalog")
    harness.run(spec)  # creates the table
    table = load_table_with_retry(FlakyCatalog(harness.catalog, 2), spec.table, wait_s=0.01)  # type: ignore[arg-type]
    assert table.name() == harness.table(spec).name()
    with pytest.raises(ConnectionError):
        load_table_with_retry(FlakyCatalog(harness.catalog, 9), spec.table, attempts=3, wait_s=0.01)  # type: ignore[arg-type]


def test_aborted_transactions_never_land(
    harness: Harness, create_topic: CreateTopic, kafka: Any, ledger: Ledger
) -> None:
    """R15, R38: a transactional producer that aborts every 10th transaction, across
    partitions, read by several capped runs: exactly the committed records, once; none of the
    aborted ones."""
    topic = create_topic(partitions=3)
    producer = LedgerProducer(kafka, ledger, **{"transactional.id": f"tx-{topic}"})
    for batch in range(20):
        producer.produce_transaction(topic, records(12, first=batch * 12), commit=batch % 10 != 9)
    assert len(ledger.aborted(topic)) == 24
    spec = make_spec(topic, "aborted", max_records_per_run=60, max_records_per_task=25)
    while harness.run(spec).committed:
        pass
    harness.assert_exactly_once(spec, ledger)
    landed = set(
        harness.table(spec).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    )
    assert landed.isdisjoint({i for batch in (9, 19) for i in range(batch * 12, batch * 12 + 12)})


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        ({"mode": "earliest"}, 40),
        ({"mode": "latest"}, 10),
        ({"mode": "offsets", "offsets": {"TOPIC:0": 25}}, 15),
    ],
)
def test_starting_positions_apply_only_without_offsets(
    position: dict[str, Any],
    expected: int,
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
) -> None:
    """The starting position is used for the first run only; later runs resume from the table."""
    topic = create_topic(partitions=1)
    if "offsets" in position:
        position = {**position, "offsets": {f"{topic}:0": 25}}
    spec = make_spec(topic, f"start_{position['mode']}", starting_position=position)
    ledger_producer.produce(topic, records(30))
    first = harness.run(spec)
    ledger_producer.produce(topic, records(10, first=30))
    second = harness.run(spec)
    assert first.records + second.records == expected


def test_production_oracle_counts_the_newest_commit_in_kafka(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """The audit's independent read_committed count catches a commit that advanced offsets
    past records it did not add (a simulated lost-data bug in a real run)."""
    from ingestion.audit.incremental import audit_commits

    topic, spec = new_pipeline("prod_oracle", partitions=2, produce=40)
    harness.run(spec)
    group, config = spec.consumer_group_id, harness.kafka.client_config()
    first = audit_commits(harness.table(spec), group, config, spec.name)
    assert first.ok, first.findings
    assert first.recounted  # the first commit records where its ranges start (R46)
    ledger_producer.produce(topic, records(20, first=40))
    harness.run(spec)
    second = audit_commits(
        harness.table(spec), group, config, spec.name, after_snapshot_id=first.cursor
    )
    assert second.ok, second.findings
    assert len(second.recounted) == 1
    ledger_producer.produce(topic, records(10, first=60))
    skipped: list[LedgerEntry] = []

    def commit_past_what_was_read(point: str, **context: Any) -> None:
        """A lost-data bug: the commit's offsets pass records that no task read."""
        plan = context["plan"]
        skipped.extend(ledger_producer.produce(topic, records(5, first=70)))
        for entry in skipped:
            key = (entry.topic, entry.partition)
            plan.end[key] = max(plan.end[key], entry.offset + 1)

    report = harness.run(spec, hooks=FailureHooks({"before_commit": commit_past_what_was_read}))
    assert report.records == 10
    third = audit_commits(
        harness.table(spec), group, config, spec.name, after_snapshot_id=second.cursor
    )
    message = "; ".join(third.findings)
    assert not third.ok
    assert "added 10 records" in message
    assert "holds 15 visible records" in message
    assert harness.audit(spec, ledger).missing == sorted(e.coordinates for e in skipped)


def test_small_runs_skip_spark_large_runs_use_it(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """``in_process_max_records``: a trickle is prepared in the driver and Spark is never asked
    for; a backlog above the bound goes to Spark. Both commit exactly once, in one table."""
    topic, spec = new_pipeline("trickle", partitions=2, in_process_max_records=100)
    asked: list[str] = []

    def session() -> Any:
        asked.append("spark")
        return harness.spark

    def ingest() -> Any:
        return run_pipeline(
            spec,
            harness.kafka.client_config(),
            harness.catalog,
            session,
            harness.cluster_id,
        )

    ledger_producer.produce(topic, records(60))
    small = ingest()
    assert (small.records, small.executed_in, asked) == (60, "driver", [])
    ledger_producer.produce(topic, records(300, first=60))
    large = ingest()
    assert (large.records, large.executed_in, asked) == (300, "spark", ["spark"])
    assert ingest().executed_in == ""  # nothing to read: neither
    harness.assert_exactly_once(spec, ledger)


def test_by_default_spark_does_every_batch_however_small(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """A spec that does not set ``in_process_max_records`` sends every run with something to
    read to Spark, a single record too (the shortcut is opt-in); the report says so,
    with the number of Spark tasks. Nothing to read asks for no Spark at all."""
    from ingestion.spec.pipeline import IN_PROCESS_MAX_RECORDS, parse_pipeline_spec

    topic, tested = new_pipeline("default_spark", partitions=2)
    raw = tested.model_dump(mode="json", by_alias=True, exclude={"in_process_max_records"})
    spec = parse_pipeline_spec(raw)
    assert spec.in_process_max_records == IN_PROCESS_MAX_RECORDS == 0
    asked: list[str] = []

    def session() -> Any:
        asked.append("spark")
        return harness.spark

    ledger_producer.produce(topic, records(1, partition=0))
    config = harness.kafka.client_config()
    report = run_pipeline(spec, config, harness.catalog, session, harness.cluster_id)
    assert (report.records, report.executed_in, report.spark_tasks) == (1, "spark", 1)
    assert asked == ["spark"]
    idle = run_pipeline(spec, config, harness.catalog, session, harness.cluster_id)
    assert (idle.executed_in, idle.spark_tasks, asked) == ("", 0, ["spark"])
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)


def delete_records_before(harness: Harness, topic: str, partition: int, offset: int) -> None:
    """Kafka's DeleteRecords: the log start moves to ``offset``, as retention would move it."""
    from confluent_kafka import TopicPartition

    admin = harness.kafka.get_admin_client()
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for future in futures.values():
        assert future.result(timeout=30).low_watermark == offset


def test_records_deleted_before_they_are_read_fail_the_run_by_name(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R12 on a real broker: records between the committed offset and the new log start are
    gone. The run fails naming the pipeline, topic, partition and lost range; the
    ``retention_risk`` check fails; only the explicit ``on_data_loss: skip`` moves on, and its
    commit records the lost range. Nothing is skipped silently."""
    from ingestion.health.checks import check_retention_risk
    from ingestion.health.state import read_state

    topic = create_topic(partitions=1)
    spec = make_spec(topic, "retention_lost")
    ledger_producer.produce(topic, records(30, partition=0))
    assert harness.run(spec).records == 30
    ledger_producer.produce(topic, records(20, first=30, partition=0))
    delete_records_before(harness, topic, 0, 40)

    with pytest.raises(exceptions.DataLossError) as failure:
        harness.run(spec)
    message = str(failure.value)
    assert "pipeline 'retention_lost'" in message
    assert f"{topic}[0] [30, 40)" in message
    consumer = harness.kafka.get_consumer()
    try:
        state = read_state(spec, harness.table(spec), harness.kafka.get_admin_client(), consumer)
    finally:
        consumer.close()
    finding = check_retention_risk(state)
    assert not finding.passed
    assert "deleted by retention" in finding.message

    skipping = spec.model_copy(update={"on_data_loss": "skip"})
    assert harness.run(skipping).records == 10
    lost = {(topic, 0, offset) for offset in range(30, 40)}
    harness.assert_exactly_once(skipping, ledger, lost=lost)
    summary = harness.table(spec).current_snapshot().summary.additional_properties  # type: ignore[union-attr]
    assert summary[LOST_RANGES] == f"{topic}[0] [30, 40)"


def test_records_deleted_while_a_run_reads_them_commit_nothing(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R13 on a real broker: retention moves the log start past a planned range between the
    plan and the read. The task fails (readers never reset an offset on their own), nothing is
    committed, and the next run meets R12 by name."""
    topic = create_topic(partitions=1)
    spec = make_spec(topic, "retention_race")
    ledger_producer.produce(topic, records(20, partition=0))
    assert harness.run(spec).records == 20
    ledger_producer.produce(topic, records(20, first=20, partition=0))
    before = harness.table(spec).current_snapshot()

    def delete_after_plan(point: str, **context: Any) -> None:
        delete_records_before(harness, topic, 0, 30)

    with pytest.raises(Exception) as failure:  # noqa: PT011 - the task's error, by name below
        harness.run(spec, hooks=FailureHooks({"after_plan": delete_after_plan}))
    assert topic in str(failure.value), failure.value
    assert harness.table(spec).current_snapshot() == before  # nothing committed
    with pytest.raises(exceptions.DataLossError, match=r"\[20, 30\)"):
        harness.run(spec)
    skipping = spec.model_copy(update={"on_data_loss": "skip"})
    assert harness.run(skipping).records == 10
    harness.assert_exactly_once(skipping, ledger, lost={(topic, 0, o) for o in range(20, 30)})


def test_a_partition_added_to_the_topic_is_read_from_its_start(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """R18 on a real broker: CreatePartitions grows the topic between runs; the next plan lists
    the new partition and reads it from its first offset, exactly once."""
    from confluent_kafka.admin import NewPartitions

    topic = create_topic(partitions=1)
    spec = make_spec(topic, "grown")
    ledger_producer.produce(topic, records(20, partition=0))
    assert harness.run(spec).records == 20
    admin = harness.kafka.get_admin_client()
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    for _ in range(100):  # the broker's metadata shows the new partitions (seconds at most)
        if len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3:
            break
        time.sleep(0.1)
    grown = LedgerProducer(harness.kafka, ledger)  # a producer that knows the new partitions
    grown.produce(topic, records(10, first=20, partition=1))
    grown.produce(topic, records(5, first=30, partition=2))
    assert harness.run(spec).records == 15
    harness.assert_exactly_once(spec, ledger)
    committed = find_committed_state(harness.table(spec), spec.consumer_group_id)
    assert committed is not None
    assert committed.offsets[topic].next_offsets == {0: 20, 1: 10, 2: 5}


def test_spark_tasks_write_in_the_tables_declared_sort_order(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """Another engine declares a sort order on the table (``WRITE ORDERED BY name DESC``); the
    executors' files of the next run are each sorted by it and marked sorted, as Spark's own
    writes would be."""
    import pyarrow.parquet as pq
    from pyiceberg.table.sorting import NullOrder

    topic, spec = new_pipeline("sorted", partitions=2, produce=50)
    assert harness.run(spec).committed
    table = harness.table(spec)
    with table.update_sort_order() as order:
        order.desc("name", IdentityTransform(), NullOrder.NULLS_LAST)
    before = {task.file.file_path for task in table.scan().plan_files()}
    ledger_producer.produce(topic, records(300, first=50))
    report = harness.run(spec)
    assert (report.records, report.executed_in) == (300, "spark")
    table = harness.table(spec)
    new = [task.file for task in table.scan().plan_files() if task.file.file_path not in before]
    assert new
    for data_file in new:
        names = pq.read_table(data_file.file_path.removeprefix("file://")).column("name")
        assert names.to_pylist() == sorted(names.to_pylist(), reverse=True)
        assert data_file.sort_order_id == table.metadata.default_sort_order_id != 0
    harness.assert_exactly_once(spec, ledger)
