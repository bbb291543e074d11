"""The embedded stack itself: broker, ledger producer, catalog and Spark, all real."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition

from ingestion.kafka.consumer import open_consumer
from ingestion.kafka.topics import (
    TopicState,
    describe_topic,
    read_first_timestamps_ms,
    read_newest_timestamp_ms,
)
from resources.embedded import EmbeddedBroker, cluster_id_for
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic

pytestmark = pytest.mark.integration


def read_all(kafka: KafkaResource, topic: str, ends: dict[int, int]) -> set[tuple[str, int, int]]:
    """Read every partition from 0 to its end with assign(); done when position >= end."""
    consumer = kafka.get_consumer()
    seen: set[tuple[str, int, int]] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        remaining = {p for p, end in ends.items() if end > 0}
        for _ in range(200):
            if not remaining:
                break
            for message in consumer.consume(500, timeout=0.5):
                assert message.error() is None, message.error()
                seen.add((topic, int(message.partition() or 0), int(message.offset() or 0)))
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    finally:
        consumer.close()
    return seen


def test_ledger_matches_broker_and_end_offsets_are_exact(
    kafka: KafkaResource, create_topic: CreateTopic, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    topic = create_topic(partitions=3)
    records = [(f"k{i}".encode(), f'{{"n": {i}}}'.encode(), None) for i in range(300)]
    ledger_producer.produce(topic, records)
    consumer = kafka.get_consumer()
    try:
        state = describe_topic(kafka.get_admin_client(), consumer, topic)
        newest = read_newest_timestamp_ms(consumer, state)
    finally:
        consumer.close()
    expected_ends = {p: 0 for p in range(3)}
    for entry in ledger.entries:
        expected_ends[entry.partition] = max(expected_ends[entry.partition], entry.offset + 1)
    assert state.end_offsets == expected_ends
    assert sum(state.end_offsets.values()) == 300
    assert read_all(kafka, topic, state.end_offsets) == ledger.committed(topic)
    assert newest == max(entry.timestamp_ms for entry in ledger.entries)


@pytest.fixture
def mixed_topic(kafka: KafkaResource, create_topic: CreateTopic, ledger: Ledger) -> str:
    """A new topic of 2 partitions holding transactions committed, aborted, committed: markers
    at offsets 1, 3 and 5 of partition 0."""
    topic = create_topic(partitions=2)
    producer = LedgerProducer(kafka, ledger, **{"transactional.id": f"tx-{topic}"})
    producer.produce_transaction(topic, [(b"a", b"1", 0), (b"b", b"2", 1)], commit=True)
    producer.produce_transaction(topic, [(b"c", b"3", 0), (b"d", b"4", 1)], commit=False)
    producer.produce_transaction(topic, [(b"e", b"5", 0)], commit=True)
    return topic


def describe(kafka: KafkaResource, topic: str) -> TopicState:
    consumer = kafka.get_consumer()
    try:
        return describe_topic(kafka.get_admin_client(), consumer, topic)
    finally:
        consumer.close()


def test_transaction_end_offsets_cover_the_markers(
    kafka: KafkaResource, mixed_topic: str, ledger: Ledger
) -> None:
    topic = mixed_topic
    state = describe(kafka, topic)
    assert state.end_offsets == {0: 6, 1: 4}  # records + one control record per transaction
    assert len(ledger.aborted(topic)) == 2
    assert ledger.committed(topic) <= read_all(kafka, topic, state.end_offsets)


def test_first_timestamps_cross_marker_only_ranges_without_waiting(
    kafka: KafkaResource, mixed_topic: str, ledger: Ledger
) -> None:
    """A range holding only a transaction marker ends when the position passes it, not at the
    timeout; a range with a record yields that record's timestamp."""
    topic = mixed_topic
    started = time.monotonic()
    with open_consumer(kafka.client_config(), "first-timestamps") as consumer:
        found = read_first_timestamps_ms(
            consumer, {(topic, 0): (5, 6), (topic, 1): (0, 4)}, timeout_s=60
        )
    assert set(found) == {(topic, 1)}
    assert time.monotonic() - started < 30  # not the 60 s timeout


def test_read_committed_hides_aborted_records(
    kafka: KafkaResource, mixed_topic: str, ledger: Ledger
) -> None:
    topic = mixed_topic
    state = describe(kafka, topic)
    assert not read_all(kafka, topic, state.end_offsets) & ledger.aborted(topic)


def test_cluster_id(kafka: KafkaResource, broker: EmbeddedBroker) -> None:
    assert kafka.get_cluster_id() == broker.cluster_id == cluster_id_for("embedded")


def test_broker_stops_and_restarts_on_a_free_port(tmp_path_factory: pytest.TempPathFactory) -> None:
    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("b") / "kafka.log").start()
    pid = broker.pid
    assert pid is not None
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "Kafka Server started" in broker.read_log()


def test_catalog_round_trip(catalog_resource: IcebergCatalogResource) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = catalog_resource.load_catalog()
    catalog.create_namespace_if_not_exists("smoke")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType())
    )
    table = catalog.create_table("smoke.round_trip", schema=schema)
    rows = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", None]},
        schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())]),
    )
    table.append(rows)
    assert catalog.load_table("smoke.round_trip").scan().to_arrow().num_rows == 3
    assert table.metadata.location.startswith(catalog_resource.catalog_properties()["warehouse"])


def test_spark_executors_import_the_engine(spark_resource: SparkResource) -> None:
    spark = spark_resource.spark_session

    def where_is_engine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import ingestion.spec.pipeline

        for batch in batches:
            yield pa.RecordBatch.from_pydict(
                {
                    "id": batch.column(0),
                    "module": [ingestion.spec.pipeline.__file__] * batch.num_rows,
                }
            )

    frame = spark.range(0, 8, numPartitions=2).mapInArrow(where_is_engine, "id long, module string")
    rows = frame.collect()
    assert len(rows) == 8
    assert all(row.module.endswith("ingestion/spec/pipeline.py") for row in rows)
