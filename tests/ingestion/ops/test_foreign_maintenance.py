"""Another engine maintains the table while a stream ingests (R56): Spark with Apache Iceberg's
Spark runtime runs Iceberg's standard procedures (``tests/support/iceberg_spark.py``); every
record stays once, the audit stays green, the stream never stops, DuckDB reads the table after
each step."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import duckdb
from confluent_kafka import Consumer, TopicPartition

from ingestion.audit.oracle import audit_pipeline
from ingestion.audit.verdict import check_exactly_once
from ingestion.kafka.ranges import Key
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import stream_pipeline
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state, flatten
from resources.iceberg import IcebergCatalogResource
from tests.support.iceberg_spark import OtherSpark
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records

BAD = (b"bad", b"{", 0)  # a malformed value: dead-lettered into the quarantine table


def _kafka_ends(harness: Harness, topic: str, partitions: int) -> dict[Key, int]:
    consumer = Consumer({**harness.kafka.client_config(), "group.id": "ends"})
    try:
        return {
            (topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def _wait_caught_up(harness: Harness, spec: PipelineSpec, topic: str, partitions: int) -> None:
    """Until the table's committed offsets reach Kafka's end offsets (the stream is live)."""
    ends = _kafka_ends(harness, topic, partitions)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if harness.catalog.table_exists(spec.table):  # the stream creates it
            state = find_committed_state(harness.table(spec), spec.consumer_group_id)
            if state is not None and flatten(state.offsets) == ends:
                return
        time.sleep(0.3)
    raise AssertionError(f"the stream did not reach {ends}")


def _read_with_duckdb(harness: Harness, spec: PipelineSpec) -> tuple[int, int]:
    """(rows, distinct coordinates) of the head's live data files, read by DuckDB."""
    files = [urlparse(task.file.file_path).path for task in harness.table(spec).scan().plan_files()]
    with duckdb.connect() as connection:
        found = connection.execute(
            "select count(*), count(distinct (_kafka_topic, _kafka_partition, _kafka_offset)) "
            "from read_parquet(?)",
            [files],
        ).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def _plant_orphan(harness: Harness, spec: PipelineSpec) -> Path:
    """A data file no snapshot names, older than remove_orphan_files' default 3 days."""
    data = Path(urlparse(harness.table(spec).location()).path) / "data"
    planted = data / "orphan-of-a-crashed-writer.parquet"
    planted.write_bytes(b"PAR1")
    old = time.time() - 4 * 86_400
    os.utime(planted, (old, old))
    return planted


def test_spark_procedures_while_a_stream_ingests(
    harness: Harness,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
    catalog_resource: IcebergCatalogResource,
    tmp_path: Path,
) -> None:
    """rewrite_data_files, rewrite_manifests, expire_snapshots keeping one snapshot and
    remove_orphan_files, each while the stream runs. The expiry removes every snapshot with the
    offsets (a rewrite is the head while the stream idles) and commits the audit had not seen:
    the stream goes on from the position table property, the audit audits the expired commits
    as one range."""
    partitions = 2
    topic, spec = new_pipeline(
        "foreign", partitions=partitions, produce=[*records(40), BAD], errors_tolerance="all"
    )
    stop = threading.Event()
    failures: list[BaseException] = []
    reports: list[RunReport] = []

    def stream() -> None:
        try:
            stream_pipeline(
                spec,
                harness.kafka.client_config(),
                harness.catalog,
                harness.cluster_id,
                0.2,
                should_stop=lambda: "done" if stop.is_set() else None,
                on_report=reports.append,
            )
        except BaseException as exc:  # the test fails on it below
            failures.append(exc)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    cursor: int | None = None
    offsets: dict[Key, int] | None = None

    def audit_is_green() -> list[str]:
        nonlocal cursor, offsets
        audit = audit_pipeline(
            spec,
            harness.catalog,
            harness.kafka.client_config(),
            after_snapshot_id=cursor,
            cursor_offsets=offsets,
        )
        assert audit is not None
        finding = check_exactly_once(spec.table, audit)
        assert finding.passed, finding.message
        cursor, offsets = audit.commits.cursor, audit.commits.cursor_offsets
        return audit.commits.notes

    def produce(first: int) -> None:
        ledger_producer.produce(topic, [*records(20, first=first), BAD])
        _wait_caught_up(harness, spec, topic, partitions)

    table = spec.table
    try:
        with OtherSpark(
            catalog_resource.catalog_name,
            catalog_resource.catalog_properties(),
            tmp_path / "spark.log",
        ) as other:
            _wait_caught_up(harness, spec, topic, partitions)
            audit_is_green()
            produce(100)
            done = other.call(
                "rewrite_data_files", f"table => '{table}', options => map('min-input-files', '2')"
            )
            assert done[0]["rewritten_data_files_count"] >= 2, done
            assert _read_with_duckdb(harness, spec) == (60, 60)
            assert any("maintenance (replace) kept the rows" in n for n in audit_is_green())

            produce(200)  # commits after the audit's cursor, expired below before it sees them
            produce(300)
            done = other.call("rewrite_manifests", f"table => '{table}'")
            assert _read_with_duckdb(harness, spec) == (100, 100)
            head = harness.table(spec).current_snapshot()
            assert head is not None
            assert head.summary is not None
            assert head.summary.operation.value == "replace"  # the stream idles: no commit since

            done = other.call(
                "expire_snapshots",
                f"table => '{table}', older_than => TIMESTAMP '2999-01-01 00:00:00', "
                "retain_last => 1",
            )
            assert done[0]["deleted_manifest_lists_count"] >= 5, done
            assert _read_with_duckdb(harness, spec) == (100, 100)
            expired = harness.table(spec)
            assert len(expired.metadata.snapshots) == 1
            state = find_committed_state(expired, spec.consumer_group_id)
            assert state is not None
            assert state.from_position  # no snapshot with the offsets is left
            notes = audit_is_green()
            assert any("audited as one range" in n for n in notes), notes

            produce(400)  # the stream reads on from the position property
            planted = _plant_orphan(harness, spec)  # a crashed writer's file, 4 days old
            done = other.call("remove_orphan_files", f"table => '{table}'")
            assert [urlparse(r["orphan_file_location"]).path for r in done] == [str(planted)]
            assert not planted.exists()
            assert _read_with_duckdb(harness, spec) == (120, 120)
            audit_is_green()
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, failures
    assert sum(r.records for r in reports) == 120
    harness.assert_exactly_once(spec, ledger)
