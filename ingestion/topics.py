"""Read-only views of Kafka topics: partitions, topic ids and offsets (no group, no commit)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.exceptions import TopicNotFoundError

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    from ingestion.spec import PipelineSpec


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
    """
    from confluent_kafka import KafkaException, TopicCollection, TopicPartition

    try:
        description = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout_s)
    except KafkaException as exc:
        raise TopicNotFoundError(f"topic {topic!r}: {exc.args[0]}") from exc
    partitions = []
    for info in sorted(description.partitions, key=lambda p: p.id):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, info.id), timeout=timeout_s, cached=False
        )
        partitions.append(PartitionState(info.id, int(low), int(high)))
    return TopicState(topic, str(description.topic_id), tuple(partitions))


def read_newest_timestamp_ms(
    consumer: Consumer, state: TopicState, tail: int = 8, timeout_s: float = 5.0
) -> int | None:
    """Return the newest record timestamp (ms) among the last ``tail`` offsets of each partition.

    Reads with ``assign()`` until every partition's position reaches its end offset (the tail may
    hold only transaction markers); joins no group and commits nothing. None if nothing is read.
    """
    from confluent_kafka import TopicPartition

    ends = {
        p.partition: p.end_offset for p in state.partitions if p.end_offset > p.log_start_offset
    }
    if not ends:
        return None
    consumer.assign(
        [
            TopicPartition(state.topic, p.partition, max(p.log_start_offset, p.end_offset - tail))
            for p in state.partitions
            if p.partition in ends
        ]
    )
    newest: int | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is None:
                    _, timestamp = message.timestamp()
                    newest = timestamp if newest is None else max(newest, timestamp)
            positions = consumer.position([TopicPartition(state.topic, p) for p in ends])
            for position in positions:
                if position.offset >= ends[position.partition]:
                    del ends[position.partition]
    finally:
        consumer.unassign()
    return newest


def read_first_timestamps_ms(
    consumer: Consumer, ranges: dict[tuple[str, int], tuple[int, int]], timeout_s: float = 5.0
) -> dict[tuple[str, int], int]:
    """Return the timestamp (ms) of the first visible record in each ``[start, end)`` range.

    Reads with ``assign()``; joins no group and commits nothing. A range holding no visible
    record (transaction markers or aborted records only) is absent from the result, as is one
    not read within ``timeout_s``.
    """
    from confluent_kafka import TopicPartition

    pending = dict(ranges)
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in pending.items()])
    found: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(pending), timeout=0.2):
                key = (str(message.topic()), int(message.partition() or 0))
                if message.error() is None and key in pending:
                    found[key] = message.timestamp()[1]
                    consumer.pause([TopicPartition(*key)])
                    del pending[key]
            for position in consumer.position([TopicPartition(*key) for key in pending]):
                if position.offset >= pending[(position.topic, position.partition)][1]:
                    del pending[(position.topic, position.partition)]
    finally:
        consumer.unassign()
    return found
