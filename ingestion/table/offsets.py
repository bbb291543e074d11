"""Offset maps and their home: properties of the Iceberg snapshots that commit them.

Each ingestion snapshot carries, under ``kafka.offsets.<group id>``, the next offset to read per
topic-partition together with each topic's id. The committed offsets of a group are those of the
newest snapshot in the current snapshot's ancestry that carries that key; snapshots of other
writers (compaction, other groups) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from ingestion.task.spec import TaskResult

# Every property the platform writes (snapshot or table) starts with this.
TABLE_PREFIX = "kafka."
OFFSETS_PREFIX = "kafka.offsets."
COMMIT_ID = "kafka.commit-id"
GROUP_ID = "kafka.group-id"
CLUSTER_ID = "kafka.cluster-id"
RUN_ID = "kafka.run-id"
PIPELINE = "kafka.pipeline"
RECORDS = "kafka.records"
QUARANTINED = "kafka.quarantined"  # records set aside in the quarantine table
VALID_THROUGH_MS = "kafka.valid-through-ms"
LOST_RANGES = "kafka.lost-ranges"
RESET_BY = "kafka.reset-by"  # an operator's explicit offset change (reset or group migration)
RESET_REASON = "kafka.reset-reason"
# On a run commit: {"topic:partition": [offsets]} read and skipped by a task's record guard
# (ingestion.task.spec; so far MM2's late copies, whence the name). The audits count them.
SKIPPED = "kafka.late-copies"
FAILOVER_TO = "kafka.failover-to"  # a switch to another cluster (ingestion.dr.switch)
MIGRATED_FROM = "kafka.migrated-from"
# Comma-separated group ids a migration retired: their offsets need not stay reachable (expiry)
# and must not be planned from again. Written by the migration commit; the planner refuses a
# retired group until a later snapshot of the current ancestry commits offsets for it again (an
# explicit reset): ingestion.table.rewind.find_retirement.
RETIRED_GROUPS = "kafka.retired-groups"
RUN_DURATION_MS = "kafka.run-duration-ms"  # plan to commit: orphan removal waits longer than this
# Where the ranges of partitions new in this commit (absent from the previous offsets) start,
# as {"topic": {"partition": offset}}: the audit's recount of a new partition starts there.
RANGE_STARTS = "kafka.range-starts"
# The Kafka group's offsets an operator action found and replaced, as a JSON object
# {"topic:partition": offset}: a position the table vouches for, so the mirror may move the group
# back from it to the table's offsets (ingestion/table/rewind.py).
GROUP_OFFSETS_BEFORE = "kafka.group-offsets-before"


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


def encode_positions(offsets: dict[Key, int]) -> str:
    """Encode flat offsets as sorted JSON keyed ``topic:partition`` (topic names hold no colon).

    Example:
        >>> encode_positions({("orders", 1): 7, ("orders", 0): 5})
        '{"orders:0":5,"orders:1":7}'
    """
    return orjson.dumps({f"{t}:{p}": offsets[(t, p)] for t, p in sorted(offsets)}).decode()


def decode_positions(text: str) -> dict[Key, int]:
    """Decode :func:`encode_positions` output.

    Example:
        >>> decode_positions('{"orders:0":5}')
        {('orders', 0): 5}
    """
    document = orjson.loads(text)
    return {
        (key.rsplit(":", 1)[0], int(key.rsplit(":", 1)[1])): int(o) for key, o in document.items()
    }


def commit_properties(
    *,
    group_id: str,
    offsets: OffsetMap,
    commit_id: str,
    cluster_id: str,
    pipeline: str,
    records: int = 0,
    quarantined: int = 0,
    run_id: str | None = None,
    valid_through_ms: int | None = None,
    lost_ranges: list[str] | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    migrated_from: str | None = None,
    run_duration_ms: int | None = None,
    range_starts: dict[Key, int] | None = None,
    retired_groups: list[str] | None = None,
    group_offsets_before: dict[Key, int] | None = None,
) -> dict[str, str]:
    """The snapshot properties of every commit that sets a group's offsets: an ingestion run,
    an offset reset or a group migration (``requested_by`` marks an operator's action; a
    migration retires ``retired_groups``; ``group_offsets_before`` records the Kafka group's
    offsets an action replaced).

    No secrets go in: these properties are readable by anyone who can read the table.

    Example:
        >>> properties = commit_properties(
        ...     group_id="g", offsets={"t": TopicOffsets("id1", {0: 5})}, commit_id="c1",
        ...     cluster_id="k", pipeline="p", records=5)
        >>> properties["kafka.offsets.g"], properties["kafka.records"]
        ('{"t":{"id":"id1","next":{"0":5}}}', '5')
    """
    properties = {
        OFFSETS_PREFIX + group_id: encode_offsets(offsets),
        COMMIT_ID: commit_id,
        GROUP_ID: group_id,
        CLUSTER_ID: cluster_id,
        PIPELINE: pipeline,
        RECORDS: str(records),
        QUARANTINED: str(quarantined),
    }
    optional = {
        RUN_ID: run_id,
        VALID_THROUGH_MS: None if valid_through_ms is None else str(valid_through_ms),
        LOST_RANGES: ";".join(lost_ranges) if lost_ranges else None,
        RESET_BY: requested_by,
        RESET_REASON: reason,
        MIGRATED_FROM: migrated_from,
        RUN_DURATION_MS: None if run_duration_ms is None else str(run_duration_ms),
        RANGE_STARTS: encode_starts(range_starts) if range_starts else None,
        RETIRED_GROUPS: ",".join(retired_groups) if retired_groups else None,
        GROUP_OFFSETS_BEFORE: (
            None if group_offsets_before is None else encode_positions(group_offsets_before)
        ),
    }
    properties.update({key: value for key, value in optional.items() if value is not None})
    return properties


def encode_starts(starts: dict[Key, int]) -> str:
    """Encode per-partition offsets as compact, sorted JSON (``kafka.range-starts``).

    Example:
        >>> encode_starts({("t", 1): 7, ("t", 0): 0})
        '{"t":{"0":0,"1":7}}'
    """
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(starts.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return orjson.dumps(document).decode()


def decode_starts(text: str) -> dict[Key, int]:
    """Decode :func:`encode_starts` output.

    Example:
        >>> decode_starts('{"t":{"0":0,"1":7}}')
        {('t', 0): 0, ('t', 1): 7}
    """
    return {
        (topic, int(p)): int(o)
        for topic, parts in orjson.loads(text).items()
        for p, o in parts.items()
    }


def flatten(offsets: OffsetMap) -> dict[Key, int]:
    """(topic, partition) -> next offset."""
    return {(t, p): o for t, v in offsets.items() for p, o in v.next_offsets.items()}


def describe_commit(snapshot_id: int, properties: dict[str, str]) -> str:
    """Name a commit for a message: an operator action by who and why, or a run's commit.

    Example:
        >>> describe_commit(7, {RESET_BY: "ops", RESET_REASON: "replay", COMMIT_ID: "c1"})
        "offset reset by 'ops' (reason 'replay'; commit c1, snapshot 7)"
    """
    where = f"commit {properties.get(COMMIT_ID)}, snapshot {snapshot_id}"
    if RESET_BY in properties:
        origin = properties.get(MIGRATED_FROM)
        kind = (
            f"group migration from {origin!r} to {properties.get(GROUP_ID)!r}"
            if origin
            else "offset reset"
        )
        reason = properties.get(RESET_REASON) or ""
        return f"{kind} by {properties[RESET_BY]!r} (reason {reason!r}; {where})"
    if COMMIT_ID in properties:
        run = properties.get(RUN_ID)
        return f"commit {properties[COMMIT_ID]} of run {run} (snapshot {snapshot_id})"
    return f"snapshot {snapshot_id}"


@dataclass(frozen=True)
class CommittedState:
    """A group's offsets as of the snapshot that committed them."""

    snapshot_id: int
    offsets: OffsetMap
    commit_id: str | None
    cluster_id: str | None
    properties: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """The commit that set these offsets, named for a message (:func:`describe_commit`)."""
        return describe_commit(self.snapshot_id, self.properties)


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
                properties,
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


def skipped_property(results: list[TaskResult]) -> str:
    """The commit's record of the records its tasks' guards skipped:
    ``{"topic:partition": [offsets]}``."""
    skipped: dict[str, list[int]] = {}
    for result in results:  # a partition split into several tasks: one list
        if result.skipped:
            where = f"{result.range.topic}:{result.range.partition}"
            skipped.setdefault(where, []).extend(result.skipped)
    return orjson.dumps({where: sorted(offsets) for where, offsets in skipped.items()}).decode()


def count_skipped(properties: dict[str, str]) -> int:
    """The records a commit's guards skipped (0 without any).

    Example:
        >>> count_skipped({SKIPPED: '{"dr.t:0": [4, 9], "dr.t:1": [2]}'})
        3
    """
    raw = properties.get(SKIPPED)
    return sum(len(offsets) for offsets in orjson.loads(raw).values()) if raw else 0


def skipped_offsets(table: Table) -> set[tuple[str, int, int]]:
    """Every (topic, partition, offset) the table's commits skipped (read, not ingested)."""
    skipped: set[tuple[str, int, int]] = set()
    for snapshot in iter_ancestry(table):
        raw = snapshot_properties(snapshot).get(SKIPPED)
        for where, offsets in (orjson.loads(raw) if raw else {}).items():
            topic, _, partition = where.rpartition(":")
            skipped.update((topic, int(partition), int(offset)) for offset in offsets)
    return skipped
