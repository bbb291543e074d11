"""Plan a failover of a pipeline to its MirrorMaker 2 replica: where to resume, per partition.

For each source partition the table has offsets for (next offset ``N``):

1. **Exact anchor** when the offset syncs are readable (they live on the source cluster by
   default, so often not after a disaster): the newest sync ``U -> D`` with ``U <= N``. If
   ``U == N`` the replica resumes at ``D``; otherwise the table's records after ``U`` (data and
   quarantine tables) must be the replica's records after ``D``, one for one
   (:func:`~ingestion.failover_align.align_exact`).
2. **Checkpoint** otherwise: the group's newest checkpoint ``U -> D`` for the partition (``U <=
   N``, MM2 translated it conservatively). The replica is scanned from ``D - 1`` and aligned by
   content (:func:`~ingestion.failover_align.align_by_content`).

Nothing is written: the plan is what ``--dry-run`` shows and what the switch commits. Delivery:
the plan resumes each replica partition after the last copy of an ingested record, verified
record by record; when the evidence does not single out one position the plan is refused
(:class:`~ingestion.exceptions.FailoverRefusedError`), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.consumer import iter_range, open_consumer
from ingestion.exceptions import FailoverRefusedError
from ingestion.failover_align import Alignment, RecordId, align_by_content, align_exact
from ingestion.mm2 import OffsetSync, decode_offset_sync, translate_downstream
from ingestion.ranges import OffsetRange
from ingestion.replica_facts import ReplicaTarget, StampedCheckpoint, newest_checkpoints

if TYPE_CHECKING:
    from pyiceberg.table import Table

TAIL_WINDOW = 10_000  # table records compared before a checkpoint's source offset, at most


@dataclass(frozen=True)
class PartitionPlan:
    """Where one partition resumes on the replica, and the evidence."""

    source_topic: str
    partition: int
    source_next: int
    replica_topic: str
    replica_start: int
    skipped: int
    anchor: str


@dataclass
class Replica:
    """An open view of the replica cluster for one plan (records by offset, watermarks)."""

    kafka_config: dict[str, Any]
    timeout_s: float = 30.0

    def read(
        self, topic: str, partition: int, start: int, count: int
    ) -> tuple[list[tuple[int, RecordId]], int]:
        """Up to ``count`` records from ``start`` as (offset, RecordId), and the end offset."""
        from confluent_kafka import TopicPartition

        found: list[tuple[int, RecordId]] = []
        with open_consumer(self.kafka_config, "failover-reader") as consumer:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.timeout_s
            )
            if start < low:
                raise FailoverRefusedError(
                    f"{topic}[{partition}]: replica offset {start} is below the log start {low} "
                    "(retention deleted it): the alignment cannot be verified"
                )
            rng = OffsetRange(topic, partition, start, high)
            for message in iter_range(consumer, rng, self.timeout_s, f"replica {topic}"):
                found.append((int(message.offset() or 0), _identity(message)))
                if len(found) >= count:
                    break
        return found, high


def _identity(message: Any) -> RecordId:
    return RecordId(int(message.timestamp()[1]), message.key())


def read_offset_syncs(
    source_config: dict[str, Any], topic: str, timeout_s: float
) -> dict[tuple[str, int], list[OffsetSync]]:
    """Every offset sync in ``topic`` on the source, per source partition; {} if unreadable."""
    from confluent_kafka import KafkaException, TopicPartition

    syncs: dict[tuple[str, int], list[OffsetSync]] = {}
    try:
        with open_consumer(source_config, "failover-syncs-reader") as consumer:
            if topic not in consumer.list_topics(timeout=timeout_s).topics:
                return {}
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout_s)
            for message in iter_range(consumer, OffsetRange(topic, 0, low, high), timeout_s, topic):
                key, value = message.key(), message.value()
                if key is not None and value is not None:
                    sync = decode_offset_sync(key, value)
                    syncs.setdefault((sync.topic, sync.partition), []).append(sync)
    except KafkaException:
        return {}  # the source is down: fall back to checkpoints
    return syncs


def ingested_tail(
    tables: list[Table], topic: str, partition: int, from_offset: int, until: int
) -> list[tuple[int, RecordId]]:
    """Records of ``topic[partition]`` with ``from_offset <= offset < until`` that the data or
    quarantine table holds, in offset order, as (offset, RecordId)."""
    import pyarrow as pa

    rows: dict[int, RecordId] = {}
    # Kafka topic names are [a-zA-Z0-9._-]: safe inside a quoted literal.
    row_filter = (
        f"_kafka_topic = '{topic}' AND _kafka_partition = {partition} AND "
        f"_kafka_offset >= {from_offset} AND _kafka_offset < {until}"
    )
    fields = ("_kafka_offset", "_kafka_timestamp", "_kafka_key")
    for table in tables:
        scanned = table.scan(row_filter=row_filter, selected_fields=fields).to_arrow()
        offsets = scanned.column("_kafka_offset").to_pylist()
        micros = scanned.column("_kafka_timestamp").cast(pa.int64()).to_pylist()
        keys = scanned.column("_kafka_key").to_pylist()
        for offset, stamp, key in zip(offsets, micros, keys, strict=True):
            raw = key.encode() if isinstance(key, str) else key
            rows[int(offset)] = RecordId(int(stamp) // 1000, raw)
    return sorted(rows.items())


def plan_partition(
    tables: list[Table],
    replica: Replica,
    key: tuple[str, int],
    source_next: int,
    replica_topic: str,
    syncs: list[OffsetSync],
    checkpoint: StampedCheckpoint | None,
) -> PartitionPlan:
    """Where ``key`` resumes on the replica (see the module docstring)."""
    topic, partition = key
    where = f"{topic}[{partition}] -> {replica_topic}[{partition}]"
    usable = [s for s in syncs if s.upstream <= source_next]
    if usable:
        anchor = max(usable, key=lambda s: s.upstream)
        if anchor.upstream == source_next:
            aligned = Alignment(anchor.downstream, 0)
        else:
            tail = ingested_tail(tables, topic, partition, anchor.upstream + 1, source_next)
            copies, end = replica.read(
                replica_topic, partition, anchor.downstream + 1, len(tail) + 1
            )
            aligned = align_exact([r for _, r in tail], copies, end, where)
        how = f"offset sync {anchor.upstream} -> {anchor.downstream}"
    elif checkpoint is not None and checkpoint.checkpoint.downstream > 0:
        c = checkpoint.checkpoint
        if c.upstream > source_next:
            raise FailoverRefusedError(
                f"{where}: the checkpoint says group offset {c.upstream}, ahead of the table's "
                f"{source_next}: the group was moved by something else than this platform"
            )
        after = ingested_tail(tables, topic, partition, c.upstream, source_next)
        before = ingested_tail(
            tables, topic, partition, max(0, c.upstream - TAIL_WINDOW), c.upstream
        )
        window = [r for _, r in before + after]
        copies, end = replica.read(replica_topic, partition, c.downstream - 1, len(window) + 1)
        complete = c.upstream - TAIL_WINDOW <= 0
        aligned = align_by_content(window, copies, end, 1 + len(after), complete, where)
        how = f"checkpoint {c.upstream} -> {c.downstream}, aligned by content"
    else:
        raise FailoverRefusedError(
            f"{where}: no offset sync is readable and no usable checkpoint exists for this "
            "partition: MM2 cannot place the group on the replica. Check the replica check's "
            "findings; nothing was changed."
        )
    return PartitionPlan(
        topic, partition, source_next, replica_topic, aligned.start, aligned.skipped, how
    )


def plan_failover(
    tables: list[Table],
    offsets: dict[tuple[str, int], int],
    group: str,
    target: ReplicaTarget,
    checkpoints: list[StampedCheckpoint],
    syncs: dict[tuple[str, int], list[OffsetSync]],
    replica_topics: dict[str, str],
) -> list[PartitionPlan]:
    """A plan for every partition in ``offsets`` (the table's next offsets of ``group``)."""
    replica = Replica(target.kafka_config)
    newest = newest_checkpoints(checkpoints, group)
    return [
        plan_partition(
            tables,
            replica,
            key,
            offsets[key],
            replica_topics[key[0]],
            syncs.get(key, []),
            newest.get((replica_topics[key[0]], key[1])),
        )
        for key in sorted(offsets)
    ]


__all__ = ["PartitionPlan", "plan_failover", "read_offset_syncs", "translate_downstream"]
