"""Read what the replica check needs from the source and replica clusters (read only).

Nothing here writes to either cluster or joins a group: checkpoints are read with the
engine's ``assign()`` reader (``ingestion.kafka.consumer``), topic shapes and group offsets with the
admin API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.dr.mm2 import Checkpoint, ReplicationPolicy, checkpoints_topic, decode_checkpoint
from ingestion.dr.mm2 import replica_topic as copy_name
from ingestion.dr.replica_check import ReplicaFacts
from ingestion.kafka.consumer import iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange
from ingestion.kafka.topics import read_topic_ends

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


@dataclass(frozen=True)
class ReplicaTarget:
    """One replica of a pipeline's topics: the cluster's client settings and MM2's naming."""

    name: str
    kafka_config: dict[str, Any]
    source_alias: str
    replication_policy: ReplicationPolicy = "default"


@dataclass(frozen=True)
class StampedCheckpoint:
    """A checkpoint and when MM2 wrote it (the record's timestamp, ms)."""

    checkpoint: Checkpoint
    timestamp_ms: int


def read_checkpoints(
    kafka_config: dict[str, Any], topic: str, timeout_s: float = 30.0
) -> list[StampedCheckpoint]:
    """Every checkpoint record in ``topic``, oldest first; [] when the topic does not exist.

    Tombstones (compaction deletes) are skipped; a record in another format raises
    :class:`~ingestion.exceptions.ReplicaFormatError`.
    """
    from confluent_kafka import TopicPartition

    found: list[StampedCheckpoint] = []
    with open_consumer(kafka_config, "mm2-checkpoints-reader") as consumer:
        metadata = consumer.list_topics(timeout=timeout_s).topics.get(topic)  # never auto-create
        if metadata is None or metadata.error is not None:
            return []
        for partition in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
            rng = OffsetRange(topic, partition, low, high)
            for message in iter_range(consumer, rng, timeout_s, f"checkpoints {topic}"):
                key, value = message.key(), message.value()
                if key is None or value is None:
                    continue
                stamp = StampedCheckpoint(decode_checkpoint(key, value), message.timestamp()[1])
                found.append(stamp)
    return found


def newest_checkpoints(
    stamped: list[StampedCheckpoint], group: str
) -> dict[tuple[str, int], StampedCheckpoint]:
    """The latest checkpoint of ``group`` per replica (topic, partition), as compaction keeps."""
    newest: dict[tuple[str, int], StampedCheckpoint] = {}
    for item in stamped:
        c = item.checkpoint
        if c.group == group:
            newest[(c.topic, c.partition)] = item  # later records replace earlier ones
    return newest


def _partitions(admin: AdminClient, topic: str, timeout_s: float) -> int | None:
    # List every topic: a metadata request naming a missing topic auto-creates it on brokers
    # with auto.create.topics.enable (Tansu does so too): a check must not create what it checks.
    metadata = admin.list_topics(timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return None
    return len(metadata.partitions)


def _topic_setting(admin: AdminClient, topic: str, name: str, timeout_s: float) -> str | None:
    from confluent_kafka.admin import ConfigResource

    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    entry = future.result(timeout=timeout_s).get(name)
    return None if entry is None else str(entry.value)


def _group_has_offsets(admin: AdminClient, group: str, timeout_s: float) -> bool:
    from confluent_kafka import ConsumerGroupTopicPartitions

    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    listed = future.result(timeout=timeout_s).topic_partitions or []
    return any(tp.offset >= 0 for tp in listed)


def read_replica_facts(
    source_config: dict[str, Any],
    target: ReplicaTarget,
    group: str,
    topics: list[str],
    now_ms: int,
    timeout_s: float = 30.0,
) -> ReplicaFacts:
    """Read the facts :func:`~ingestion.dr.replica_check.check_replica` judges."""
    from confluent_kafka.admin import AdminClient

    source = AdminClient(source_config)
    replica = AdminClient(target.kafka_config)
    topic = checkpoints_topic(target.source_alias)
    partitions = _partitions(replica, topic, timeout_s)
    policy = (
        _topic_setting(replica, topic, "cleanup.policy", timeout_s)
        if partitions is not None
        else None
    )
    stamped = read_checkpoints(target.kafka_config, topic, timeout_s) if partitions else []
    newest = newest_checkpoints(stamped, group)
    age = (now_ms - max(s.timestamp_ms for s in newest.values())) / 1000 if newest else None
    copies: dict[str, tuple[int, str, int | None]] = {}
    stamps: dict[str, str | None] = {}
    for name in topics:
        copy = copy_name(name, target.source_alias, target.replication_policy)
        copy_partitions = _partitions(replica, copy, timeout_s)
        copies[name] = (_partitions(source, name, timeout_s) or 0, copy, copy_partitions)
        if copy_partitions is not None:
            stamps[copy] = _topic_setting(replica, copy, "message.timestamp.type", timeout_s)
    return ReplicaFacts(
        replica=target.name,
        source_alias=target.source_alias,
        group=group,
        checkpoint_partitions=partitions,
        checkpoint_cleanup_policy=policy,
        group_has_source_offsets=_group_has_offsets(source, group, timeout_s),
        newest_checkpoint_age_s=age,
        topics=copies,
        timestamp_types=stamps,
    )


def count_records(
    kafka_config: dict[str, Any], topics: list[str], timeout_s: float
) -> dict[str, int]:
    """Per topic of ``topics`` that exists on the cluster and holds records, how many offsets it
    spans (high - low watermark, summed over partitions; markers count: an estimate)."""
    from confluent_kafka.admin import AdminClient

    # Topics in error in the cluster's metadata (not ready, not authorised) are passed over.
    listed = AdminClient(dict(kafka_config)).list_topics(timeout=timeout_s).topics
    present = [t for t in topics if t in listed and listed[t].error is None]
    found = read_topic_ends(kafka_config, present, timeout_s, open_transactions=False)
    spans = {topic: ends.record_span for topic in present if (ends := found.get(topic))}
    return {topic: span for topic, span in spans.items() if span > 0}
