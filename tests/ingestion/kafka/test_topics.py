"""Read-only views of Kafka topics: a topic's id and each partition's log start and end (the
last stable offset for the engine's reads, the high watermark when open transactions count), a
missing topic named or None, a pipeline's topics by list or pattern; on the session broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException

from ingestion.exceptions import TopicNotFoundError
from ingestion.kafka.topics import (
    PartitionState,
    TopicEnds,
    TopicState,
    describe_topic,
    list_matching_topics,
    list_pipeline_topics,
    read_topic_ends,
)
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import CreateTopic, make_spec, records


def test_a_topic_states_offsets_per_partition_and_its_span() -> None:
    state = TopicState("t", "id", (PartitionState(0, 3, 10), PartitionState(1, 0, 0)))
    assert state.end_offsets == {0: 10, 1: 0}
    assert state.record_span == 7
    assert TopicEnds("id", {0: (3, 10), 1: (5, 5)}).record_span == 7


@pytest.mark.integration
def test_recreated_topic_gets_a_new_topic_id(
    kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    admin = kafka.get_admin_client()
    topic = create_topic(partitions=1)
    consumer = kafka.get_consumer()

    def described_once_settled(present: bool) -> str | None:
        """Kafka creates and deletes a topic asynchronously: its metadata follows within
        seconds. The topic id once it is there, None once it is gone (TopicNotFoundError)."""
        for _ in range(100):
            try:
                topic_id = describe_topic(admin, consumer, topic).topic_id
            except TopicNotFoundError:
                if not present:
                    return None
            except KafkaException:  # NOT_LEADER while the new partition elects its leader
                pass
            else:
                if present:
                    return topic_id
            time.sleep(0.1)
        raise AssertionError(f"{topic} still {'absent' if present else 'present'} after 10 s")

    try:
        first = described_once_settled(present=True)
        for future in admin.delete_topics([topic]).values():
            future.result(15)
        assert described_once_settled(present=False) is None
        create_topic(partitions=1, name=topic)
        second = described_once_settled(present=True)
    finally:
        consumer.close()
    assert first is not None
    assert first != second


@pytest.mark.integration
def test_pattern_lists_matching_topics(kafka: KafkaResource, create_topic: CreateTopic) -> None:
    names = [create_topic(partitions=1, name=f"pattern-demo-{i}") for i in range(2)]
    create_topic(partitions=1, name="pattern-demox")
    assert list_matching_topics(kafka.get_admin_client(), r"pattern-demo-\d+") == names


@pytest.mark.integration
def test_a_pipelines_topics_are_its_list_or_those_its_pattern_matches_now(
    kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    admin = kafka.get_admin_client()
    fixed = make_spec("not-created-yet", "fixed")
    assert list_pipeline_topics(admin, fixed) == ["not-created-yet"]  # listed, not looked up
    names = [create_topic(partitions=1, name=f"pipeline-topics-{i}") for i in range(2)]
    by_pattern = make_spec("x", "by_pattern", topic_pattern=r"pipeline-topics-\d")
    assert list_pipeline_topics(admin, by_pattern) == names
    assert list_matching_topics(admin, r"pipeline-topics") == []  # the whole name must match


@pytest.mark.integration
def test_topic_ends_stop_at_an_open_transaction_unless_it_counts(
    kafka: KafkaResource,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """Reads only: a missing topic is None and is not created. Kafka answers the last stable
    offset (3, the first open record) while a transaction is open, below the high watermark,
    which counts the open records (test_plan.py's planner test, R16)."""
    topic = create_topic(partitions=1)
    ledger_producer.produce(topic, records(3, partition=0))
    transactional = LedgerProducer(kafka, ledger, **{"transactional.id": f"tx-{topic}"})
    config = kafka.client_config()
    with transactional.open_transaction(topic, records(2, first=3, partition=0)):
        stable = read_topic_ends(config, [topic], open_transactions=False)[topic]
        written = read_topic_ends(config, [topic, "no-such-topic"], open_transactions=True)
    high = written[topic]
    assert stable is not None
    assert high is not None
    assert written["no-such-topic"] is None
    assert high.topic_id == stable.topic_id
    assert stable.ends[0][1] == 3 < high.ends[0][1]
    # The coordinator writes the commit marker just after the commit returns: the last stable
    # offset follows within moments.
    for _ in range(100):
        committed = read_topic_ends(config, [topic], open_transactions=False)[topic]
        if committed == TopicEnds(stable.topic_id, {0: (0, 6)}):  # its marker counts too
            break
        time.sleep(0.1)
    assert committed == TopicEnds(stable.topic_id, {0: (0, 6)})
    assert "no-such-topic" not in kafka.get_admin_client().list_topics(timeout=10).topics
    assert read_topic_ends(config, [], open_transactions=False) == {}


@pytest.mark.integration
def test_describing_a_topic_gives_its_id_and_each_partitions_offsets(
    kafka: KafkaResource, create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    topic = create_topic(partitions=2)
    ledger_producer.produce(topic, [*records(3, partition=0), *records(1, 3, partition=1)])
    consumer = kafka.get_consumer()
    try:
        state = describe_topic(kafka.get_admin_client(), consumer, topic)
    finally:
        consumer.close()
    assert state.topic == topic
    assert state.partitions == (PartitionState(0, 0, 3), PartitionState(1, 0, 1))
    ends = read_topic_ends(kafka.client_config(), [topic], open_transactions=False)[topic]
    assert ends is not None
    assert ends.topic_id == state.topic_id
