"""The one owner of consumer settings: assign-only reads that never commit, read_committed,
never jumping to another offset, and user settings the engine owns refused; ranges read to
their end and not past it, on the session broker."""

from __future__ import annotations

import time

import pytest

from ingestion.exceptions import ReadError
from ingestion.kafka.consumer import (
    ENGINE_OWNED_PROPERTIES,
    consumer_config,
    count_visible,
    iter_batches,
    iter_range,
    open_consumer,
)
from ingestion.kafka.ranges import OffsetRange
from ingestion.pipeline.mirror import wait_for_group_coordinator
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import CreateTopic, records


def test_the_engine_sets_what_exactly_once_reads_rely_on() -> None:
    config = consumer_config({"bootstrap.servers": "b:9092", "fetch.max.bytes": 1024}, "r")
    assert config == {
        "bootstrap.servers": "b:9092",
        "fetch.max.bytes": 1024,  # other settings pass through
        "group.id": "kafka-iceberg-r",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
    }


@pytest.mark.parametrize("name", sorted(ENGINE_OWNED_PROPERTIES))
def test_a_setting_the_engine_owns_is_refused_not_overridden(name: str) -> None:
    with pytest.raises(ValueError, match=f"Kafka settings \\['{name}'\\] are owned by the"):
        consumer_config({"bootstrap.servers": "b:9092", name: "x"}, "r")


@pytest.fixture
def ten(create_topic: CreateTopic, ledger_producer: LedgerProducer) -> str:
    """A one-partition topic holding offsets 0..9."""
    topic = create_topic(partitions=1)
    ledger_producer.produce(topic, records(10))
    return topic


@pytest.mark.integration
def test_a_range_is_read_to_its_end_and_not_past_it(kafka: KafkaResource, ten: str) -> None:
    config = kafka.client_config()
    with open_consumer(config, "t-range") as consumer:
        offsets = [m.offset() for m in iter_range(consumer, OffsetRange(ten, 0, 3, 7), 5, "t")]
        assert offsets == [3, 4, 5, 6]
        batches = list(iter_batches(consumer, OffsetRange(ten, 0, 0, 10), 5, "t", limit=4))
        assert sum(len(b) for b in batches) >= 4
        assert [m.offset() for b in batches for m in b] == list(range(sum(map(len, batches))))
    ranges = [OffsetRange(ten, 0, 0, 2), OffsetRange(ten, 0, 5, 10)]
    assert count_visible(config, ranges, "t-count", 5) == 7


@pytest.mark.integration
def test_a_range_past_the_log_end_fails_after_the_timeout_naming_where(
    kafka: KafkaResource, ten: str
) -> None:
    started = time.monotonic()
    with (
        open_consumer(kafka.client_config(), "t-beyond") as consumer,
        pytest.raises(ReadError, match="where: no progress past offset 10 for 1 s"),
    ):
        list(iter_range(consumer, OffsetRange(ten, 0, 8, 12), 1.0, "where"))
    assert time.monotonic() - started < 4


@pytest.mark.integration
def test_reading_commits_nothing_to_the_group(kafka: KafkaResource, ten: str) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    with open_consumer(kafka.client_config(), "t-nocommit") as consumer:
        assert len(list(iter_range(consumer, OffsetRange(ten, 0, 0, 10), 5, "t"))) == 10
    admin = kafka.get_admin_client()
    wait_for_group_coordinator(admin, "kafka-iceberg-t-nocommit", 10)  # librdkafka #5040
    request = ConsumerGroupTopicPartitions("kafka-iceberg-t-nocommit", [TopicPartition(ten, 0)])
    (future,) = admin.list_consumer_group_offsets([request]).values()
    (position,) = future.result(10).topic_partitions
    assert position.offset < 0  # no committed offset
