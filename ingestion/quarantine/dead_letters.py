"""The optional dead-letter topic: a Kafka copy of quarantined records, at least once.

The quarantine table is the exactly-once home of a bad record; Kafka Connect users also expect
a dead-letter topic. The copy is produced after the data commit and before the group mirror,
with Kafka Connect's context headers, so a consumer can recognise repeats. Because the mirror
only moves after the copy is out, a commit whose offsets are ahead of the mirror may not have
been copied yet. Before copying such a commit again, the run counts its copies already in the
topic (by the ``__ingestion.commit.id`` header, from the commit's time on): a commit whose
copies are all there is not sent twice, so a mirror that stays behind (foreign members in the
group) does not multiply the copies. A partial copy is sent again whole (at least once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.kafka.consumer import open_consumer
from ingestion.table.offsets import (
    COMMIT_ID,
    OFFSETS_PREFIX,
    QUARANTINED,
    decode_offsets,
    flatten,
    iter_ancestry,
    snapshot_properties,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

HEADERS = {  # quarantine column -> Kafka Connect's dead-letter context header
    "_kafka_topic": "__connect.errors.topic",
    "_kafka_partition": "__connect.errors.partition",
    "_kafka_offset": "__connect.errors.offset",
    "error_class": "__connect.errors.exception.class.name",
    "error_message": "__connect.errors.exception.message",
    "commit_id": "__ingestion.commit.id",
}
COMMIT_HEADER = HEADERS["commit_id"]


@dataclass(frozen=True)
class PendingCopy:
    """A commit with dead letters whose offsets are ahead of the Kafka group mirror."""

    commit_id: str
    committed_at_ms: int
    records: int


def unpublished_commits(
    table: Table, group_id: str, mirrored: dict[tuple[str, int], int]
) -> list[PendingCopy]:
    """Commits with dead letters whose offsets are ahead of the mirror (newest first)."""
    key = OFFSETS_PREFIX + group_id
    pending = []
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key not in properties:
            continue
        offsets = flatten(decode_offsets(properties[key]))
        if all(offset <= mirrored.get(tp, -1) for tp, offset in offsets.items()):
            break  # this commit and every older one were mirrored, hence copied
        if int(properties.get(QUARANTINED, "0")) > 0:
            pending.append(
                PendingCopy(
                    properties[COMMIT_ID], snapshot.timestamp_ms, int(properties[QUARANTINED])
                )
            )
    return pending


def count_copies(
    kafka_config: dict[str, Any],
    topic: str,
    pending: list[PendingCopy],
    pipeline: str,
    timeout_s: float = 30.0,
    idle_s: float = 1.0,
) -> dict[str, int]:
    """Copies of each pending commit already in ``topic``, counted by their commit-id header
    from the oldest pending commit's time until the topic has nothing more for ``idle_s``
    (joins no group, commits nothing). An undercount only means a copy is sent again."""
    from confluent_kafka import TopicPartition

    if not pending:
        return {}
    since = min(p.committed_at_ms for p in pending)
    counts = {p.commit_id: 0 for p in pending}
    with open_consumer(kafka_config, f"{pipeline}-dead-letter-count") as consumer:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        query = [TopicPartition(topic, p, since) for p in sorted(partitions)]
        starts = [s for s in consumer.offsets_for_times(query, timeout=timeout_s) if s.offset >= 0]
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while starts and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=1000, timeout=idle_s)
            if not batch:
                break
            for message in batch:
                value = dict(message.headers() or []).get(COMMIT_HEADER)
                commit = value.decode() if isinstance(value, bytes) else value
                if message.error() is None and commit in counts:
                    counts[commit] += 1
    return counts


def publish_dead_letters(
    kafka_config: dict[str, Any],
    topic: str,
    quarantine: Table,
    commit_ids: list[str],
    timeout_s: float = 30.0,
) -> int:
    """Produce the quarantined records of ``commit_ids`` to ``topic``; return how many.

    Raises:
        KafkaException: a record was not acknowledged (the mirror then stays behind, so the
            next run copies again).
    """
    from confluent_kafka import KafkaException, Producer

    if not commit_ids:
        return 0
    listed = ", ".join(f"'{commit_id}'" for commit_id in commit_ids)  # hex ids: safe to quote
    rows = quarantine.scan(row_filter=f"commit_id IN ({listed})").to_arrow().to_pylist()
    failures: list[Any] = []
    producer = Producer({**kafka_config, "enable.idempotence": True, "acks": "all"})
    for row in rows:
        headers: list[tuple[str, str | bytes | None]] = [
            (name, str(row[column]).encode()) for column, name in HEADERS.items()
        ]
        producer.produce(
            topic,
            key=row["_kafka_key"],
            value=row["value"],
            headers=headers,
            on_delivery=lambda error, _message: failures.append(error) if error else None,
        )
    remaining = producer.flush(timeout_s)
    if failures or remaining:
        raise KafkaException(failures[0] if failures else f"{remaining} records unacknowledged")
    return len(rows)
