"""Is a pipeline ready to fail over to its MirrorMaker 2 replica? The check, as a pure function.

MM2 fails quietly in known ways; each one leaves a failover with nothing to stand on:

- the checkpoints topic (``<source alias>.checkpoints.internal`` on the replica) is missing, has
  more than one partition, or is not compacted (a pre-created topic must be exactly that);
- the pipeline's group has no committed offsets on the source cluster: MM2's checkpoint
  connector lists consumer groups on the source and finds "0 consumer groups", so it emits no
  checkpoints at all (this platform keeps its offsets in the table and mirrors them to that
  group after every commit; a mirror that never ran, or a group filter in MM2, shows here);
- the newest checkpoint for the group is older than the bound: the connector stopped, or the
  group is filtered out of ``groups``;
- a source topic has no copy on the replica, or a copy with another partition count;
- a copy stamps records with the replica's clock (``message.timestamp.type=LogAppendTime``): a
  failover recognises copies by their original timestamps;
- while failed over under ``replication_policy: default``, the replica's own topic of the spec's
  name (``orders`` next to MM2's ``primary.orders``) holds records: producers write there, and the
  route reads the copy only, so those records are not ingested (docs/disaster-recovery.md);
- after a failback, a reverse-copy record is a copy of an origin record the route also reads:
  MM2's forward and reverse flows both run, and each new record lands twice
  (``ingestion.dr.failback.flow_loop``).

Each failure names its fix; messages name topics and groups, never ages or offsets (those are in
the metadata), so one cause keeps one fingerprint. The check does not block ingestion (it is
about the standby).

The facts are read by :func:`read_replica_facts` from the source and replica clusters, read
only: nothing here writes to either cluster or joins a group: checkpoints are read with the
engine's ``assign()`` reader (``ingestion.kafka.consumer``), topic shapes and group offsets
with the admin API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion.dr.failback.flow_loop import LoopedRecord
from ingestion.dr.mm2 import Checkpoint, ReplicationPolicy, checkpoints_topic, decode_checkpoint
from ingestion.dr.mm2 import replica_topic as copy_name
from ingestion.health.checks import Finding, failed, passed
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import iter_range, open_consumer
from ingestion.kafka.ranges import OffsetRange
from ingestion.kafka.topics import read_topic_ends

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


@dataclass(frozen=True)
class ReplicaFacts:
    """What was read from both clusters for one pipeline and one replica (None: not found)."""

    replica: str
    source_alias: str
    group: str
    checkpoint_partitions: int | None
    checkpoint_cleanup_policy: str | None
    group_has_source_offsets: bool
    newest_checkpoint_age_s: float | None
    # source topic -> (its partitions on the source, its copy's name, the copy's partitions)
    topics: dict[str, tuple[int, str, int | None]] = field(default_factory=dict)
    # copy topic -> its message.timestamp.type (a failover matches copies by timestamp)
    timestamp_types: dict[str, str | None] = field(default_factory=dict)
    # while on the replica: its own topics named like the spec's, not read -> records they hold
    unread_local: dict[str, int] = field(default_factory=dict)
    # after a failback: reverse-copy records that copy origin records the route also reads
    looped: list[LoopedRecord] = field(default_factory=list)


def check_replica(facts: ReplicaFacts, max_checkpoint_age_s: float) -> Finding:
    """Every readiness problem of one replica, each with its fix; passes when there is none.

    Example:
        >>> facts = ReplicaFacts("dr", "primary", "g", 1, "compact", True, 12.0,
        ...     {"orders": (3, "primary.orders", 3)})
        >>> check_replica(facts, 300).passed
        True
        >>> late = ReplicaFacts("dr", "primary", "g", 3, "delete", False, None, {})
        >>> check_replica(late, 300).message[:60]
        "replica 'dr' is not ready for a failover: checkpoints topic "
    """
    topic = checkpoints_topic(facts.source_alias)
    problems: list[str] = []
    if facts.checkpoint_partitions is None:
        problems.append(
            f"checkpoints topic {topic!r} does not exist on the replica: run MM2's "
            "MirrorCheckpointConnector for this source (emit.checkpoints.enabled=true), or check "
            "the source alias in the pipeline's replica settings"
        )
    else:
        if facts.checkpoint_partitions != 1:
            problems.append(
                f"checkpoints topic {topic!r} has {facts.checkpoint_partitions} partitions; MM2 "
                "needs exactly 1: delete it and let MM2 create it (or create it with 1 "
                "partition and cleanup.policy=compact)"
            )
        if "compact" not in (facts.checkpoint_cleanup_policy or ""):
            problems.append(
                f"checkpoints topic {topic!r} has cleanup.policy="
                f"{facts.checkpoint_cleanup_policy}; it must be compact, or old checkpoints "
                "expire and a failover finds none: set cleanup.policy=compact"
            )
    if not facts.group_has_source_offsets:
        problems.append(
            f"group {facts.group!r} has no committed offsets on the source cluster, so MM2's "
            "checkpoint connector finds no group to checkpoint and emits no checkpoints for "
            "it: let a run commit (the platform mirrors the table's offsets to the group after "
            "each commit), and make sure MM2's groups filter includes the group"
        )
    elif facts.newest_checkpoint_age_s is None:
        problems.append(
            f"no checkpoint for group {facts.group!r} in {topic!r}: check that MM2's groups "
            "filter includes it and that the checkpoint connector is running"
        )
    elif facts.newest_checkpoint_age_s > max_checkpoint_age_s:
        problems.append(
            f"the newest checkpoint for group {facts.group!r} is older than "
            f"{max_checkpoint_age_s:.0f} s (its age is in the metadata): the checkpoint "
            "connector is stopped or lagging; restart it"
        )
    for source, (partitions, copy, copy_partitions) in sorted(facts.topics.items()):
        if copy_partitions is None:
            problems.append(
                f"topic {source!r} has no copy {copy!r} on the replica: add it to MM2's topics "
                "filter, or fix the replication policy in the pipeline's replica settings"
            )
        elif copy_partitions != partitions:
            problems.append(
                f"copy {copy!r} has {copy_partitions} partitions, source {source!r} has "
                f"{partitions}: let MM2 sync partitions (sync.topic.configs / refresh.topics) "
                "before a failover"
            )
    for copy, kind in sorted(facts.timestamp_types.items()):
        if kind == "LogAppendTime":
            problems.append(
                f"copy {copy!r} has message.timestamp.type=LogAppendTime: the replica stamps "
                "copies with its own clock, so a failover cannot recognise them; set it to "
                "CreateTime on the copy"
            )
    problems += _route_problems(facts)
    metadata = {
        "replica": facts.replica,
        "checkpoints_topic": topic,
        "checkpoint_age_s": facts.newest_checkpoint_age_s,
        "topics_checked": len(facts.topics),
        "unread_local_records": sum(facts.unread_local.values()) or None,
        "looped_records": [
            f"{r.copy_topic}[{r.partition}]@{r.copy_offset} = {r.origin_topic}@{r.origin_offset}"
            for r in facts.looped[:5]
        ]
        or None,
    }
    if problems:
        return failed(
            "ERROR",
            f"replica {facts.replica!r} is not ready for a failover: {'; '.join(problems)}.",
            {k: v for k, v in metadata.items() if v is not None},
        )
    return passed(
        f"replica {facts.replica!r} is ready: a checkpoint for {facts.group!r} within "
        f"{max_checkpoint_age_s:.0f} s, a compacted one-partition checkpoints topic, and a copy "
        "of every topic",
        {k: v for k, v in metadata.items() if v is not None},
    )


def _route_problems(facts: ReplicaFacts) -> list[str]:
    """What the route in force misses or reads twice (module docstring, last two items).

    Example:
        >>> facts = ReplicaFacts("primary", "dr", "g", 1, "compact", True, 1.0,
        ...     unread_local={"orders": 7}, looped=[LoopedRecord("dr.orders", 0, 9, "orders", 4)])
        >>> [p[:40] for p in _route_problems(facts)]
        ["topic 'orders' on the cluster the pipeli", "records of 'orders' come back through 'd"]
    """
    problems = [
        f"topic {topic!r} on the cluster the pipeline reads now holds records it does not "
        "ingest: under replication_policy: default the route reads MM2's copy, not the "
        "cluster's own topic, so records producers wrote there are not in the table. Point "
        "producers that fail over at the copy, or fail back and switch to replication_policy: "
        "identity (producers and MM2 then share one topic name)"
        for topic in sorted(facts.unread_local)
    ]
    pairs = sorted({(r.origin_topic, r.copy_topic) for r in facts.looped})
    problems += [
        f"records of {origin!r} come back through {copy!r}: MirrorMaker 2's forward and reverse "
        "flows both run, so each new record is ingested twice under two names (examples in the "
        "metadata). Stop the reverse flow (replica -> primary) now, then check the table for "
        "the duplicates"
        for origin, copy in pairs
    ]
    return problems


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
    # with auto.create.topics.enable (Kafka's default): a check must not create what it checks.
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
    from ingestion.pipeline.mirror import read_group_offsets

    return bool(read_group_offsets(admin, group, timeout_s))


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

    source = AdminClient(client_properties(source_config, "admin"))
    replica = AdminClient(client_properties(target.kafka_config, "admin"))
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
    listed = (
        AdminClient(client_properties(kafka_config, "admin")).list_topics(timeout=timeout_s).topics
    )
    present = [t for t in topics if t in listed and listed[t].error is None]
    found = read_topic_ends(kafka_config, present, timeout_s, open_transactions=False)
    spans = {topic: ends.record_span for topic in present if (ends := found.get(topic))}
    return {topic: span for topic, span in spans.items() if span > 0}
