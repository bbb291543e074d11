"""Read-only views of Kafka topics: partitions, topic ids and offsets (no group, no commit)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.exceptions import TopicNotFoundError
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import consumer_config
from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    from ingestion.spec.pipeline import PipelineSpec


Ranges = dict[Key, tuple[int, int]]  # (topic, partition) -> [start, end)


# Errors a fresh consumer sees while the cluster's metadata settles (a broker just restarted or
# resumed, a leader moving, a partition just created). The topic was described a moment before,
# so they pass: ask again until the caller's timeout.
_SETTLING = frozenset(
    {
        "_UNKNOWN_PARTITION",
        "_TRANSPORT",
        "_TIMED_OUT",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "UNKNOWN_TOPIC_OR_PART",
    }
)


def query_watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float = 10.0
) -> tuple[int, int]:
    """Return a partition's (log start, end) offsets from the broker, never from a cache.

    The end is the last stable offset under ``read_committed``. Errors of a cluster whose metadata
    is settling (see ``_SETTLING``) are retried until ``timeout_s``; then the last one is raised.
    """
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        remaining = max(0.5, deadline - time.monotonic())
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=remaining, cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].name() not in _SETTLING or time.monotonic() + 0.2 >= deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class PartitionState:
    """Offsets of one partition: first offset still in the log and end (last stable) offset."""

    partition: int
    log_start_offset: int
    end_offset: int


@dataclass(frozen=True)
class TopicState:
    """A topic as it is now: its id (changes when the topic is recreated) and its partitions."""

    topic: str
    topic_id: str
    partitions: tuple[PartitionState, ...]

    @property
    def end_offsets(self) -> dict[int, int]:
        """Partition -> end offset."""
        return {p.partition: p.end_offset for p in self.partitions}

    @property
    def record_span(self) -> int:
        """Sum over partitions of end - log start (an upper bound on records held)."""
        return sum(p.end_offset - p.log_start_offset for p in self.partitions)


@dataclass(frozen=True)
class TopicEnds:
    """A topic on a cluster now: its id and, per partition, (log start, end offset)."""

    topic_id: str
    ends: dict[int, tuple[int, int]]

    @property
    def record_span(self) -> int:
        """Sum over partitions of end - log start (transaction markers count: an upper bound
        on the records held).

        Example:
            >>> TopicEnds("id", {0: (3, 10), 1: (0, 0)}).record_span
            7
        """
        return sum(high - low for low, high in self.ends.values())


def read_topic_ends(
    kafka_config: dict[str, Any],
    topics: list[str],
    timeout_s: float = 30.0,
    *,
    open_transactions: bool,
) -> dict[str, TopicEnds | None]:
    """Each topic's id and partitions' (log start, end offset) on a cluster, None when it does
    not exist. Reads only: never creates a topic (describe, not metadata), joins no group.

    Args:
        kafka_config: The cluster's client settings.
        topics: The topics to read.
        timeout_s: Per request.
        open_transactions: True: the end is the high watermark, records of open transactions
            counted (``read_uncommitted``: records MM2 is still writing are not drained);
            False: the last stable offset (``read_committed``, the engine's reads).

    Raises:
        KafkaException: a topic could not be described for another reason than not existing.
    """
    from confluent_kafka import Consumer, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    if not topics:
        return {}
    admin = AdminClient(client_properties(kafka_config, "admin"))
    found: dict[str, TopicEnds | None] = {}
    config = consumer_config(kafka_config, "topic-ends-reader")
    if open_transactions:
        config["isolation.level"] = "read_uncommitted"
    consumer = Consumer(config)
    try:
        for topic, future in admin.describe_topics(TopicCollection(topics)).items():
            try:
                described = future.result(timeout_s)
            except KafkaException as exc:
                if exc.args[0].name() == "UNKNOWN_TOPIC_OR_PART":
                    found[topic] = None
                    continue
                raise
            ends = {}
            for part in described.partitions:
                ends[part.id] = query_watermarks(consumer, topic, part.id, timeout_s)
            found[topic] = TopicEnds(str(described.topic_id), ends)
    finally:
        consumer.close()
    return found


def list_matching_topics(admin: AdminClient, pattern: str, timeout_s: float = 10.0) -> list[str]:
    """Return the cluster's topics whose whole name matches ``pattern``, sorted."""
    regex = re.compile(pattern)
    names = admin.list_topics(timeout=timeout_s).topics
    return sorted(name for name in names if regex.fullmatch(name))


def list_pipeline_topics(admin: AdminClient, spec: PipelineSpec) -> list[str]:
    """The pipeline's topics now: its fixed list, or those matching its pattern."""
    if spec.topic_pattern:
        return list_matching_topics(admin, spec.topic_pattern)
    return list(spec.source_topics)


def describe_topic(
    admin: AdminClient, consumer: Consumer, topic: str, timeout_s: float = 10.0
) -> TopicState:
    """Return the topic's id and each partition's log start and end offsets.

    End offsets come from the consumer's watermark query, which honours the consumer's
    ``isolation.level``: with ``read_committed`` (the engine's setting) it is the last stable
    offset, so an open upstream transaction is never planned past.

    Raises:
        TopicNotFoundError: the topic does not exist.
        TimeoutError: the cluster did not answer within ``timeout_s`` (the message names the
            topic; without it a Dagster run failure shows a bare ``TimeoutError``).
    """
    from confluent_kafka import KafkaException, TopicCollection

    try:
        description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout_s)
    except KafkaException as exc:
        raise TopicNotFoundError(f"topic {topic!r}: {exc.args[0]}") from exc
    except TimeoutError as exc:
        raise TimeoutError(
            f"topic {topic!r}: the Kafka cluster did not describe it within {timeout_s:.0f} s: "
            "its brokers are down or unreachable (check them, or fail the pipeline over); "
            "nothing was read"
        ) from exc
    partitions = []
    for info in sorted(description.partitions, key=lambda p: p.id):
        low, high = query_watermarks(consumer, topic, info.id, timeout_s)
        partitions.append(PartitionState(info.id, low, high))
    return TopicState(topic, str(description.topic_id), tuple(partitions))


def scan_timestamps_ms(
    consumer: Consumer, ranges: Ranges, first_only: bool = False, timeout_s: float = 5.0
) -> dict[Key, list[int]]:
    """Return the timestamps (ms) of the visible records of each ``[start, end)`` range.

    Reads with ``assign()`` until each partition's position reaches its end (a range may hold
    only transaction markers) or, with ``first_only``, until its first visible record; joins no
    group and commits nothing. A range not finished within ``timeout_s`` keeps what was read.
    """
    from confluent_kafka import TopicPartition

    pending = dict(ranges)
    found: dict[Key, list[int]] = {}
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in pending.items()])
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                key = (str(message.topic()), int(message.partition() or 0))
                if message.error() is not None or key not in pending:
                    continue
                if int(message.offset() or 0) < pending[key][1]:
                    found.setdefault(key, []).append(message.timestamp()[1])
                    if first_only:
                        consumer.pause([TopicPartition(*key)])
                        del pending[key]
            for position in consumer.position([TopicPartition(*key) for key in pending]):
                if position.offset >= pending[(position.topic, position.partition)][1]:
                    del pending[(position.topic, position.partition)]
    finally:
        consumer.unassign()
    return found


def read_newest_timestamp_ms(
    consumer: Consumer, state: TopicState, tail: int = 8, timeout_s: float = 5.0
) -> int | None:
    """Return the newest record timestamp (ms) among the last ``tail`` offsets of each partition;
    None if nothing is read."""
    ranges = {
        (state.topic, p.partition): (max(p.log_start_offset, p.end_offset - tail), p.end_offset)
        for p in state.partitions
        if p.end_offset > p.log_start_offset
    }
    stamps = [
        t
        for found in scan_timestamps_ms(consumer, ranges, timeout_s=timeout_s).values()
        for t in found
    ]
    return max(stamps) if stamps else None


def read_first_timestamps_ms(
    consumer: Consumer, ranges: Ranges, timeout_s: float = 5.0
) -> dict[Key, int]:
    """Return the timestamp (ms) of the first visible record of each ``[start, end)`` range;
    a range holding none (markers or aborted records only) is absent."""
    found = scan_timestamps_ms(consumer, ranges, first_only=True, timeout_s=timeout_s)
    return {key: stamps[0] for key, stamps in found.items()}
