"""The optional dead-letter topic: a Kafka copy of quarantined records, at least once.

The quarantine table is the exactly-once home of a bad record; Kafka Connect users also expect
a dead-letter topic. The copy is produced after the data commit and before the group mirror,
with Kafka Connect's context headers, so a consumer can recognise repeats. Because the mirror
only moves after the copy is out, a commit whose offsets are ahead of the mirror may not have
been copied yet: the next run copies it again (at least once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingestion.offsets import (
    COMMIT_ID,
    DEAD_LETTERED,
    OFFSETS_PREFIX,
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


def unpublished_commits(
    table: Table, group_id: str, mirrored: dict[tuple[str, int], int]
) -> list[str]:
    """Commit ids with dead letters whose offsets are ahead of the mirror (newest first)."""
    key = OFFSETS_PREFIX + group_id
    pending = []
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key not in properties:
            continue
        offsets = flatten(decode_offsets(properties[key]))
        if all(offset <= mirrored.get(tp, -1) for tp, offset in offsets.items()):
            break  # this commit and every older one were mirrored, hence copied
        if int(properties.get(DEAD_LETTERED, "0")) > 0:
            pending.append(properties[COMMIT_ID])
    return pending


def publish_dead_letters(
    kafka_config: dict[str, Any], topic: str, quarantine: Table, commit_ids: list[str],
    timeout_s: float = 30.0,
) -> int:  # fmt: skip
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
            topic, key=row["_kafka_key"], value=row["value"], headers=headers,
            on_delivery=lambda error, _message: failures.append(error) if error else None,
        )  # fmt: skip
    remaining = producer.flush(timeout_s)
    if failures or remaining:
        raise KafkaException(failures[0] if failures else f"{remaining} records unacknowledged")
    return len(rows)
