"""Offset maps and their home: properties of the Iceberg snapshots that commit them.

Each ingestion snapshot carries, under ``kafka.offsets.<group id>``, the next offset to read per
topic-partition together with each topic's id. The committed offsets of a group are those of the
newest snapshot in the current snapshot's ancestry that carries that key; snapshots of other
writers (compaction, other groups) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

OFFSETS_PREFIX = "kafka.offsets."
COMMIT_ID = "kafka.commit-id"
GROUP_ID = "kafka.group-id"
CLUSTER_ID = "kafka.cluster-id"
RUN_ID = "kafka.run-id"
PIPELINE = "kafka.pipeline"
RECORDS = "kafka.records"
DEAD_LETTERED = "kafka.dead-lettered"
VALID_THROUGH_MS = "kafka.valid-through-ms"
LOST_RANGES = "kafka.lost-ranges"
RESET_BY = "kafka.reset-by"  # an operator's explicit offset change (reset or group migration)
RESET_REASON = "kafka.reset-reason"
MIGRATED_FROM = "kafka.migrated-from"

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class TopicOffsets:
    """Next offsets to read per partition of one topic, with the topic's id."""

    topic_id: str
    next_offsets: dict[int, int]


OffsetMap = dict[str, TopicOffsets]


def encode_offsets(offsets: OffsetMap) -> str:
    """Encode an offset map as compact, sorted JSON for a snapshot property.

    Example:
        >>> encode_offsets({"orders": TopicOffsets("id1", {1: 7, 0: 5})})
        '{"orders":{"id":"id1","next":{"0":5,"1":7}}}'
    """
    document = {}
    for topic, value in sorted(offsets.items()):
        parts = {str(p): value.next_offsets[p] for p in sorted(value.next_offsets)}
        document[topic] = {"id": value.topic_id, "next": parts}
    return orjson.dumps(document).decode()


def decode_offsets(text: str) -> OffsetMap:
    """Decode :func:`encode_offsets` output.

    Example:
        >>> decode_offsets('{"orders":{"id":"id1","next":{"0":5}}}')
        {'orders': TopicOffsets(topic_id='id1', next_offsets={0: 5})}
    """
    document = orjson.loads(text)
    return {
        topic: TopicOffsets(str(value["id"]), {int(p): int(o) for p, o in value["next"].items()})
        for topic, value in document.items()
    }


def flatten(offsets: OffsetMap) -> dict[TopicPartition, int]:
    """(topic, partition) -> next offset."""
    return {(t, p): o for t, v in offsets.items() for p, o in v.next_offsets.items()}


@dataclass(frozen=True)
class CommittedState:
    """A group's offsets as of the snapshot that committed them."""

    snapshot_id: int
    offsets: OffsetMap
    commit_id: str | None
    cluster_id: str | None


def iter_ancestry(table: Table) -> Iterator[Snapshot]:
    """Yield the current snapshot and its ancestors, newest first (stops at an expired parent)."""
    from pyiceberg.table.snapshots import ancestors_of

    yield from ancestors_of(table.current_snapshot(), table.metadata)


def snapshot_properties(snapshot: Snapshot) -> dict[str, str]:
    """The snapshot's summary properties (operation excluded)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def find_committed_state(table: Table, group_id: str) -> CommittedState | None:
    """Return the group's offsets from the newest ancestor snapshot that carries them."""
    key = OFFSETS_PREFIX + group_id
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key in properties:
            return CommittedState(
                snapshot.snapshot_id,
                decode_offsets(properties[key]),
                properties.get(COMMIT_ID),
                properties.get(CLUSTER_ID),
            )
    return None


def find_groups(table: Table) -> set[str]:
    """Every group id that has offsets somewhere in the current ancestry."""
    return {
        key.removeprefix(OFFSETS_PREFIX)
        for snapshot in iter_ancestry(table)
        for key in snapshot_properties(snapshot)
        if key.startswith(OFFSETS_PREFIX)
    }


def find_commit(table: Table, commit_id: str) -> Snapshot | None:
    """Return the ancestor snapshot committed with ``commit_id``, if any."""
    for snapshot in iter_ancestry(table):
        if snapshot_properties(snapshot).get(COMMIT_ID) == commit_id:
            return snapshot
    return None


def table_has_rows(table: Table) -> bool:
    """Whether the current snapshot holds any row (by its summary, no scan)."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return False
    return int(snapshot.summary.get("total-records", "0") or 0) > 0
