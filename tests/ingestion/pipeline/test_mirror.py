"""The group mirror (ingestion/pipeline/mirror.py) on the session's real broker: it never raises
after a commit, whatever the broker does mid-call."""

from __future__ import annotations

import os
import signal
import time

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from ingestion.pipeline.mirror import (
    mirror_offsets,
    read_group_offsets,
    wait_for_group_coordinator,
)
from ingestion.table.rewind import RewindSource
from resources.embedded import EmbeddedBroker
from resources.kafka import KafkaResource
from tests.support.brokers import resume_broker
from tests.support.pipelines import CreateTopic


def commit_group(kafka: KafkaResource, group: str, offsets: dict[tuple[str, int], int]) -> None:
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    )
    admin = kafka.get_admin_client()
    wait_for_group_coordinator(admin, group, 30)  # librdkafka #5040: see the function
    admin.alter_consumer_group_offsets([request])[group].result(30)


def test_mirror_moves_the_group_forward_to_the_table(
    kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    topic, group = create_topic(2), "mirror-forward"
    commit_group(kafka, group, {(topic, 0): 1})
    outcome = mirror_offsets(kafka.get_admin_client(), group, {(topic, 0): 3, (topic, 1): 4})
    assert outcome.ok, outcome
    assert outcome.advanced == {(topic, 0): 3, (topic, 1): 4}
    assert read_group_offsets(kafka.get_admin_client(), group) == {(topic, 0): 3, (topic, 1): 4}


def test_a_broker_that_hangs_mid_mirror_is_an_outcome_not_a_raise(
    broker: EmbeddedBroker, kafka: KafkaResource, create_topic: CreateTopic
) -> None:
    """R4 and R37: the broker stops answering between reading the group and committing to it
    (SIGSTOP, from the ``rewinds`` callback the mirror asks when the group is ahead somewhere).
    Before the fix the commit's bare ``TimeoutError`` escaped a run that had already committed
    (and ended a stream); now it is the outcome's error and the group is left for the next run."""
    topic, group = create_topic(2), "mirror-hang"
    commit_group(kafka, group, {(topic, 0): 9, (topic, 1): 0})  # ahead on 0, behind on 1
    stopped_at: list[float] = []

    def stop_the_broker() -> list[RewindSource]:
        os.kill(broker.pid or 0, signal.SIGSTOP)
        stopped_at.append(time.monotonic())
        return []  # no recorded rewind: partition 0 is left ahead

    try:
        outcome = mirror_offsets(
            kafka.get_admin_client(),
            group,
            {(topic, 0): 3, (topic, 1): 4},
            timeout_s=2,
            rewinds=stop_the_broker,
        )
    finally:
        resume_broker(broker)
    assert stopped_at, "the mirror never asked for rewinds: the test did not reach the commit"
    assert not outcome.ok
    assert outcome.error is not None
    assert f"the offset commit of group {group!r} did not answer within 2 s" in outcome.error
    assert "the next run moves it" in outcome.describe()
    # The request may still land once the broker resumes (a timeout says nothing about that);
    # either way the next mirror (the next run) leaves the group at the table's offsets, and
    # partition 0, ahead with no rewind to explain it, as it was.
    again = mirror_offsets(kafka.get_admin_client(), group, {(topic, 0): 3, (topic, 1): 4})
    assert again.ok, again
    assert again.left_ahead == {(topic, 0): 9}, again
    assert read_group_offsets(kafka.get_admin_client(), group) == {(topic, 0): 9, (topic, 1): 4}
