"""``mode: upsert`` end to end on the real stack (Apache Kafka, SQL catalog, local Spark): a
Debezium-shaped topic (``tests/support/debezium.py``: a snapshot phase, then inserts, updates and
deletes with tombstones over hot keys) ingested by ``run_pipeline`` leaves the table equal to
the source's ledger, read by DuckDB from the live files; crashes and a compaction racing the
commit change nothing of that (R57 in docs/reliability.md)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from ingestion import exceptions
from ingestion.ops.compaction import compact_small_files
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.recovery import list_orphan_files
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import snapshot_properties
from ingestion.table.upsert import DELETES, INSERTS
from tests.ingestion.pipeline.test_run import crash_once
from tests.support.debezium import DebeziumTable, Record, cdc_spec, expected, state_by_duckdb
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, Harness
from tests.support.registry import EmbeddedSchemaRegistry

pytestmark = pytest.mark.integration


def head_summary(harness: Harness, spec: PipelineSpec) -> dict[str, str]:
    head = harness.table(spec).current_snapshot()
    assert head is not None
    return snapshot_properties(head)


def produce(producer: LedgerProducer, topic: str, events: list[Record]) -> None:
    producer.produce(topic, events)


def test_a_debezium_topic_leaves_the_table_equal_to_the_source(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """A snapshot phase, then three batches of hot-key changes, each run on Spark: after every
    run DuckDB reads exactly the source's rows; each commit counts its inserts, updates and
    deletes, and the incremental audit (Kafka recount) passes every commit."""
    source = DebeziumTable(partitions=3)
    topic = create_topic(partitions=3)
    spec = cdc_spec(topic, "cdc_basic")
    rng = random.Random(31)
    produce(ledger_producer, topic, source.snapshot(200))
    report = harness.run(spec)
    assert (report.inserts, report.updates, report.deletes) == (200, 0, 0)
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    for _ in range(3):
        produce(ledger_producer, topic, source.random_changes(rng, 400, keys=300))
        report = harness.run(spec)
        assert report.committed
        assert report.updates > 0
        assert report.deletes > 0
        summary = head_summary(harness, spec)
        assert int(summary[INSERTS]) == report.inserts
        assert int(summary[DELETES]) == report.deletes
        assert state_by_duckdb(harness.table(spec)) == expected(source)
    assert report.executed_in == "spark"
    assert len(harness.assert_commits_audited(spec).recounted) == 4


def test_bad_envelopes_are_set_aside_and_new_columns_join(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """A truncate (``op: t``), a change without its key, and an ``after`` with a new column:
    the first two reach the quarantine table, the column is added, every other change lands."""
    source = DebeziumTable(schemas_enabled=False)
    topic = create_topic(partitions=1)
    spec = cdc_spec(topic, "cdc_dirty", errors_tolerance="all")
    events = source.snapshot(20)
    truncate = orjson.dumps({"op": "t", "before": None, "after": None, "source": {}})
    keyless = orjson.dumps({"op": "c", "before": None, "after": {"name": "x"}, "source": {}})
    row = {**source.rows[3], "tier": "gold"}
    source.rows[3] = {k: v for k, v in row.items() if k != "tier"}
    update = orjson.dumps({"op": "u", "before": None, "after": row, "source": {"lsn": 9}})
    events += [(None, truncate, 0), (None, keyless, 0), (b'{"id": 3}', update, 0)]
    produce(ledger_producer, topic, events)
    report = harness.run(spec)
    assert report.quarantined == 2
    assert any("tier" in change for change in report.schema_changes)
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    tiers = harness.table(spec).scan(row_filter="id = 3").to_arrow().column("tier").to_pylist()
    assert tiers == ["gold"]
    errors = harness.catalog.load_table(spec.quarantine_table).scan().to_arrow()
    assert sorted(errors.column("error_class").to_pylist()) == [
        "MissingKey",
        "UnsupportedOperation",
    ]


@pytest.mark.parametrize("point", ["before_commit", "before_catalog_call", "after_catalog_call"])
def test_a_crash_around_the_commit_applies_each_change_once(
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    tmp_path: Path,
    point: str,
) -> None:
    """Killed before the commit, or after the catalog applied it: the next run re-plans the
    same batch (or finds its commit) and the table equals the source."""
    source = DebeziumTable()
    topic = create_topic(partitions=1)
    spec = cdc_spec(topic, f"cdc_crash_{point}")
    rng = random.Random(7)
    produce(ledger_producer, topic, source.snapshot(50))
    harness.run(spec)
    produce(ledger_producer, topic, source.random_changes(rng, 120, keys=60))
    hooks = FailureHooks({point: crash_once(tmp_path / "crashed")})
    if point == "after_catalog_call":  # ambiguous: found by its commit id (R3)
        first = harness.run(spec, hooks=hooks)
        assert first.committed
        assert first.inserts + first.updates + first.deletes > 0  # read from its snapshot
    else:
        with pytest.raises(exceptions.IngestionError):
            harness.run(spec, hooks=hooks)
    again = harness.run(spec)
    assert again.committed == (point != "after_catalog_call")  # nothing left to commit
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    harness.assert_commits_audited(spec)


def test_a_compaction_between_the_plan_and_the_commit_is_planned_again(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """Our compaction replaces the files the batch would rewrite just before its commit: the
    commit fails on the moved head, its files are deleted, it plans again on the compacted
    files and lands once."""
    source = DebeziumTable()
    topic = create_topic(partitions=1)
    spec = cdc_spec(topic, "cdc_race", partition_by=[])
    rng = random.Random(3)
    for _ in range(3):  # three small files
        produce(ledger_producer, topic, source.snapshot(40))
        harness.run(spec)
    produce(ledger_producer, topic, source.random_changes(rng, 80, keys=120))
    compacted: list[int] = []

    def compact_once(point: str, **context: Any) -> None:
        if not compacted:
            compacted.append(compact_small_files(harness.table(spec)).files_compacted)

    report = harness.run(spec, hooks=FailureHooks({"before_catalog_call": compact_once}))
    assert compacted == [3]
    assert report.committed
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    operations = [s.summary.operation.value for s in harness.table(spec).snapshots() if s.summary]
    assert "replace" in operations
    assert not list_orphan_files(harness.table(spec), older_than_s=0), "the lost plan's files"


def test_mode_must_match_the_table(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """An upsert pipeline pointed at an append table (or the reverse) is refused by name."""
    source = DebeziumTable()
    topic = create_topic(partitions=1)
    produce(ledger_producer, topic, source.snapshot(3))
    spec = cdc_spec(topic, "cdc_mode")
    harness.run(spec)
    append = spec.model_copy(update={"mode": "append", "key_fields": None})
    with pytest.raises(exceptions.PipelineSpecError, match="created for mode: upsert"):
        harness.run(append)
    rekeyed = spec.model_copy(update={"key_fields": ["id", "name"]})
    with pytest.raises(exceptions.PipelineSpecError, match=r"is keyed by \['id'\]"):
        harness.run(rekeyed)


def test_the_flattened_form_leaves_the_source_state(
    harness: Harness, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """Debezium's ExtractNewRecordState rows (``__op``, ``__deleted``, ``__source_ts_ms``,
    ``__lsn``; no tombstones) with the JsonConverter's schema wrapper: the same state, and the
    change columns carry the source's timestamps and log positions."""
    source = DebeziumTable(flattened=True)
    topic = create_topic(partitions=1)
    spec = cdc_spec(topic, "cdc_flattened", envelope="flattened")
    produce(ledger_producer, topic, source.snapshot(30))
    harness.run(spec)
    produce(ledger_producer, topic, source.random_changes(random.Random(2), 90, keys=40))
    report = harness.run(spec)
    assert report.deletes > 0
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    rows = harness.table(spec).scan().to_arrow()
    assert set(rows.column("_cdc_op").to_pylist()) <= {"r", "c", "u"}
    assert None not in rows.column("_cdc_source_ts_ms").to_pylist()
    assert None not in rows.column("_cdc_lsn").to_pylist()


def test_avro_envelopes_through_the_registry_leave_the_source_state(
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    schema_registry: EmbeddedSchemaRegistry,
) -> None:
    """Debezium's envelope written by the AvroConverter (keys and values in the Confluent wire
    format, schemas registered in the real registry under ``<topic>-key`` and ``-value``),
    tombstones included: run on Spark, the same state as the ledger; the decimal and timestamp
    columns decode from the row's text as with JSON; the audit passes."""
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        topic = create_topic(partitions=2)
        source = DebeziumTable(partitions=2, registry=client, kafka_topic=topic)
        spec = cdc_spec(
            topic, "cdc_avro", value_format="avro", schema_registry_url=schema_registry.url
        )
        produce(ledger_producer, topic, source.snapshot(60))
        assert harness.run(spec).inserts == 60
        produce(ledger_producer, topic, source.random_changes(random.Random(5), 200, keys=80))
        report = harness.run(spec)
    assert report.executed_in == "spark"
    assert report.spark_tasks == 2, "a task ran twice: a key schema was not prefetched"
    assert report.deletes > 0
    assert report.updates > 0
    assert report.quarantined == 0
    assert state_by_duckdb(harness.table(spec)) == expected(source)
    harness.assert_commits_audited(spec)


def test_an_avro_table_is_derived_from_the_registered_row(
    harness: Harness,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    schema_registry: EmbeddedSchemaRegistry,
) -> None:
    """No declared schema: the table's columns are the flattened record's registered fields
    without ExtractNewRecordState's ``__`` fields, the key made required and the identifier;
    the rows are the source's. A key the registered row lacks is refused by name."""
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        topic = create_topic(partitions=1)
        source = DebeziumTable(flattened=True, registry=client, kafka_topic=topic)
        avro = {"value_format": "avro", "schema_registry_url": schema_registry.url}
        spec = cdc_spec(topic, "cdc_avro_derived", envelope="flattened", schema=None, **avro)
        produce(ledger_producer, topic, source.snapshot(20))
        produce(ledger_producer, topic, source.random_changes(random.Random(6), 60, keys=25))
        harness.run(spec)
        wrong = cdc_spec(
            topic,
            "cdc_avro_wrong_key",
            envelope="flattened",
            schema=None,
            key_fields=["uid"],
            **avro,
        )
        with pytest.raises(exceptions.PipelineSpecError, match=r"cdc_avro_wrong_key.*\['uid'\]"):
            harness.run(wrong)
        envelope = cdc_spec(topic, "cdc_avro_wrong_envelope", schema=None, **avro)
        with pytest.raises(exceptions.PipelineSpecError, match=r"no table schema.*envelope"):
            harness.run(envelope)  # the registered row is flattened: no before/after
    table = harness.table(spec)
    user = [f for f in table.schema().fields if not f.name.startswith(("_kafka_", "_cdc_"))]
    assert [(f.name, str(f.field_type), f.required) for f in user] == [
        ("id", "int", True),
        ("name", "string", False),
        ("balance", "string", False),
        ("updated_at", "string", False),
    ]
    assert table.schema().identifier_field_names() == {"id"}
    rows = table.scan(selected_fields=("id", "name", "balance")).to_arrow().to_pylist()
    assert sorted(rows, key=lambda row: row["id"]) == [
        {"id": key, "name": row["name"], "balance": row["balance"]}
        for key, row in sorted(source.rows.items())
    ]
