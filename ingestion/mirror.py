"""Step 4, publish (driver, best effort): mirror committed offsets into the Kafka group.

The group is an informational, monotonic mirror so standard Kafka tooling shows progress and
lag; it is never read to plan (rule 5). It stores the planned end offsets (so a quiet
transactional topic shows lag 0, R26) and only ever moves forward (R8). A failure here never
fails the ingestion: the table is the source of truth and the next run repairs the mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


@dataclass(frozen=True)
class MirrorOutcome:
    """What the mirror did: partitions moved forward, and why it failed if it did."""

    group_id: str
    advanced: dict[tuple[str, int], int] = field(default_factory=dict)
    foreign_members: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the group now holds offsets at or past the committed ones."""
        return self.error is None


def read_group_offsets(
    admin: AdminClient, group_id: str, timeout_s: float = 10.0
) -> dict[tuple[str, int], int]:
    """Return the group's committed offsets (empty when the group does not exist)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)])
    result = future[group_id].result(timeout_s)
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions or []
        if tp.offset >= 0 and tp.error is None
    }


def mirror_offsets(
    admin: AdminClient, group_id: str, offsets: dict[tuple[str, int], int], timeout_s: float = 10.0
) -> MirrorOutcome:
    """Commit ``offsets`` to ``group_id`` where they are ahead of the group's own (never back).

    Kafka rejects a commit from a non-member while the group has active members
    (UNKNOWN_MEMBER_ID): that is reported as ``foreign_members``, not raised (R23).
    """
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    try:
        current = read_group_offsets(admin, group_id, timeout_s)
        ahead = {k: o for k, o in offsets.items() if o > current.get(k, -1)}
        if not ahead:
            return MirrorOutcome(group_id)
        request = ConsumerGroupTopicPartitions(
            group_id, [TopicPartition(t, p, o) for (t, p), o in sorted(ahead.items())]
        )
        result = admin.alter_consumer_group_offsets([request])[group_id].result(timeout_s)
        failed = [tp for tp in result.topic_partitions or [] if tp.error is not None]
        if failed:
            raise KafkaException(failed[0].error)
    except KafkaException as exc:
        error = exc.args[0]
        foreign = isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_MEMBER_ID
        message = (
            f"group {group_id!r} has active members that are not this pipeline (someone else "
            "consumes with this group id); the mirror commit was rejected"
            if foreign
            else f"mirroring offsets to group {group_id!r} failed: {error}"
        )
        return MirrorOutcome(group_id, foreign_members=foreign, error=message)
    return MirrorOutcome(group_id, advanced=ahead)
