"""Offset maps and their home: properties of the Iceberg snapshots that commit them, and a copy
in a table property that survives any maintenance tool.

Each ingestion snapshot carries, under ``kafka.offsets.<group id>``, the next offset to read per
topic-partition together with each topic's id. The committed offsets of a group are those of the
newest snapshot in the current snapshot's ancestry that carries that key; snapshots of other
writers (compaction, other groups) are skipped.

**When another tool expired them (R56).** Spark's ``expire_snapshots``, Trino's or a managed
optimizer may expire every snapshot that carries the offsets (a compaction is the head, its
parents expire). So the same commit also sets the table property ``kafka.position.<group id>``:
the offsets, the commit's identity, and a *witness*, one row the newest commit with rows wrote
(topic, partition, offset, cluster). Table properties are kept by every maintenance tool and are
not versioned, so a rollback leaves the property ahead of the table. The property is used only
when it is proven to belong to the head's history: the ancestry walk found no snapshot with the
group's offsets and did not reach the table's first snapshot (it ended at an expired parent), and
the head still holds the witness row. Rows reach the head only through its ancestry, so the commit
that wrote the witness is an ancestor; the commits after it up to the property's changed no row
and no dead letter (only such a commit carries the witness on: :func:`previous_witness`), so a
rollback between them cannot make the property skip a record. Otherwise the group has no proven
offsets and ingestion refuses by name (``MissingOffsetsError``), never re-reading from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from ingestion.kafka.ranges import Key

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction
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
# Table property (not snapshot): a group's last committed position, kept by every maintenance
# tool (R56): {"snapshot-id", "offsets", "properties", "witness"} (:class:`Position`).
POSITION_PREFIX = "kafka.position."
# The Kafka group's offsets an operator action found and replaced, as a JSON object
# {"topic:partition": offset}: a position the table vouches for, so the mirror may move the group
# back from it to the table's offsets (ingestion/table/rewind.py).
GROUP_OFFSETS_BEFORE = "kafka.group-offsets-before"
# The snapshot properties a position leaves out: its offsets (kept apart) and the lists that
# grow with a commit (late copies, dead-letter files, lost ranges, a switch's plan). It keeps the
# rest: what names and describes the commit, and the route it carries (ingestion.table.route).
POSITION_LEAVES_OUT = frozenset(
    {
        "kafka.quarantine-files",
        "kafka.failover-plan",  # ingestion.quarantine.sync, ingestion.dr
        RANGE_STARTS,
        SKIPPED,
        LOST_RANGES,
        GROUP_OFFSETS_BEFORE,
    }
)


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
    """A group's offsets as of the snapshot that committed them (``from_position``: read from
    the table property because another tool expired that snapshot, R56)."""

    snapshot_id: int
    offsets: OffsetMap
    commit_id: str | None
    cluster_id: str | None
    properties: dict[str, str] = field(default_factory=dict)
    from_position: bool = False

    def describe(self) -> str:
        """The commit that set these offsets, named for a message (:func:`describe_commit`)."""
        expired = " (expired; its offsets kept by the table property)" if self.from_position else ""
        return describe_commit(self.snapshot_id, self.properties) + expired


@dataclass(frozen=True)
class Witness:
    """One row a commit wrote, by its Kafka coordinates and the cluster it was read on (None:
    the pipeline's own): the proof that the commit is an ancestor of a head that holds it."""

    topic: str
    partition: int
    offset: int
    cluster: str | None = None


@dataclass(frozen=True)
class Position:
    """A group's last committed position as the table property ``kafka.position.<group>``
    keeps it (R56)."""

    snapshot_id: int
    offsets: OffsetMap
    properties: dict[str, str]
    witness: Witness | None

    def encode(self) -> str:
        """Compact JSON for the table property.

        Example:
            >>> p = Position(7, {"t": TopicOffsets("id1", {0: 5})}, {COMMIT_ID: "c1"},
            ...              Witness("t", 0, 4))
            >>> p.encode()
            '{"snapshot-id":7,"offsets":{"t":{"id":"id1","next":{"0":5}}},"properties":{"kafka.commit-id":"c1"},"witness":["t",0,4,null]}'
            >>> Position.decode(p.encode()) == p
            True
        """
        w = self.witness
        return orjson.dumps(
            {
                "snapshot-id": self.snapshot_id,
                "offsets": orjson.loads(encode_offsets(self.offsets)),
                "properties": self.properties,
                "witness": None if w is None else [w.topic, w.partition, w.offset, w.cluster],
            }
        ).decode()

    @staticmethod
    def decode(text: str) -> Position:
        """Decode :meth:`encode` output."""
        document = orjson.loads(text)
        w = document.get("witness")
        return Position(
            int(document["snapshot-id"]),
            decode_offsets(orjson.dumps(document["offsets"]).decode()),
            {str(k): str(v) for k, v in document.get("properties", {}).items()},
            None if w is None else Witness(str(w[0]), int(w[1]), int(w[2]), w[3]),
        )


def read_position(properties: dict[str, str], group_id: str) -> Position | None:
    """The group's position from the table's ``properties`` (None: never recorded)."""
    raw = properties.get(POSITION_PREFIX + group_id)
    return None if raw is None else Position.decode(raw)


def record_position(transaction: Transaction, group_id: str, witness: Witness | None) -> None:
    """In ``transaction``, whose snapshot with the group's offsets is staged: set the table
    property that keeps them (R56) in the same atomic commit, with ``witness``: a row this
    commit wrote, or :func:`previous_witness` when it wrote and deleted none."""
    snapshot = transaction.table_metadata.current_snapshot()
    assert snapshot is not None, "record_position follows the commit's snapshot"
    properties = snapshot_properties(snapshot)
    assert OFFSETS_PREFIX + group_id in properties, "the staged snapshot commits the group"
    position = Position(
        snapshot.snapshot_id,
        decode_offsets(properties[OFFSETS_PREFIX + group_id]),
        {
            key: value
            for key, value in properties.items()
            if key not in POSITION_LEAVES_OUT and not key.startswith(OFFSETS_PREFIX)
        },
        witness,
    )
    transaction.set_properties({POSITION_PREFIX + group_id: position.encode()})


def previous_witness(properties: dict[str, str], group_id: str) -> Witness | None:
    """The witness of ``group_id``'s position in the table ``properties``. Only a commit that
    wrote no row, deleted none and set no record aside (a switch, a forward reset, a commit
    over markers or skipped copies) may carry it on: the proof needs every commit after the
    witness's to have changed no row and no dead letter."""
    previous = read_position(properties, group_id)
    return previous.witness if previous else None


def find_witness(
    schema: Schema, results: list[TaskResult], cluster: str | None = None
) -> Witness | None:
    """A row this run's tasks wrote: the highest ``_kafka_offset`` of a data file of the
    first task with one (a task reads one partition; the file's upper bound is a row's
    offset). None when no file was written or the column keeps no bounds."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    field_id = schema.find_field("_kafka_offset").field_id
    for result in results:
        bounds = [
            f.upper_bounds[field_id]
            for f in result.data_files
            if field_id in (f.upper_bounds or {})
        ]
        if bounds:
            offset = max(int(from_bytes(LongType(), b)) for b in bounds)
            return Witness(result.range.topic, result.range.partition, offset, cluster)
    return None


def holds_witness(table: Table, witness: Witness) -> bool:
    """Whether the head holds the witness row (a scan pruned by column bounds: few files)."""
    from ingestion.table.schema import CLUSTER_COLUMN, PRIMARY, labels_cluster

    key = (table.metadata_location, witness)
    if key in _HELD:
        return _HELD[key]
    labelled = labels_cluster(table.schema())
    rows = table.scan(
        row_filter=(  # Kafka topic names hold no quote
            f"_kafka_topic = '{witness.topic}' and _kafka_partition = {witness.partition} "
            f"and _kafka_offset = {witness.offset}"
        ),
        selected_fields=("_kafka_offset", CLUSTER_COLUMN) if labelled else ("_kafka_offset",),
    ).to_arrow()
    names = rows.column(CLUSTER_COLUMN).to_pylist() if labelled else [None] * rows.num_rows
    held = any((name or PRIMARY) == (witness.cluster or PRIMARY) for name in names)
    if len(_HELD) >= 1024:
        _HELD.clear()
    _HELD[key] = held
    return held


# (metadata location, witness) -> held: a metadata file never changes, so neither does this.
_HELD: dict[tuple[str, Witness], bool] = {}


def iter_ancestry(table: Table) -> Iterator[Snapshot]:
    """Yield the current snapshot and its ancestors, newest first (stops at an expired parent)."""
    from pyiceberg.table.snapshots import ancestors_of

    yield from ancestors_of(table.current_snapshot(), table.metadata)


def snapshot_properties(snapshot: Snapshot) -> dict[str, str]:
    """The snapshot's summary properties (operation excluded)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def find_committed_state(table: Table, group_id: str) -> CommittedState | None:
    """Return the group's offsets from the newest ancestor snapshot that carries them, else
    from the table property when it is proven to belong to the head's history (module
    docstring, R56); None when neither."""
    key = OFFSETS_PREFIX + group_id
    oldest = None
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
        oldest = snapshot
    position = read_position(table.metadata.properties, group_id)
    if position is None or oldest is None or _is_first(oldest):
        return None  # no copy; an empty table; or the walk reached the table's first snapshot
    if table.metadata.snapshot_by_id(position.snapshot_id) is not None:
        return None  # its snapshot is there but not in the head's history: rolled back past it
    if position.witness is None:
        if table_has_rows(table):
            return None  # nothing proves the position belongs to this history
    elif not holds_witness(table, position.witness):
        return None  # rolled back past the witness's commit, or its row was deleted
    return CommittedState(
        position.snapshot_id,
        position.offsets,
        position.properties.get(COMMIT_ID),
        position.properties.get(CLUSTER_ID),
        position.properties,
        from_position=True,
    )


def _is_first(snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` is the table's first: no parent and the first sequence number. A
    parent id alone does not tell: pyiceberg's expiry clears the parent id of a snapshot
    whose parent it removes (Java keeps it)."""
    return snapshot.parent_snapshot_id is None and snapshot.sequence_number == 1


def find_landed_commit(table: Table, commit_id: str, group_ids: Iterable[str]) -> int | None:
    """The snapshot id of the commit ``commit_id``, which sets the offsets of ``group_ids``,
    if it is in the head's history: an ancestor, or a group's committed state (its snapshot
    possibly expired by another tool, R56). Used before a retry and after an ambiguous
    catalog error."""
    found = find_commit(table, commit_id)
    if found is not None:
        return found.snapshot_id
    for group_id in group_ids:
        state = find_committed_state(table, group_id)
        if state is not None and state.commit_id == commit_id:
            return state.snapshot_id
    return None


def offset_groups(properties: dict[str, str]) -> list[str]:
    """The groups whose offsets a commit with these snapshot ``properties`` sets.

    Example:
        >>> offset_groups({"kafka.offsets.g": "{}", "kafka.commit-id": "c"})
        ['g']
    """
    return [k.removeprefix(OFFSETS_PREFIX) for k in properties if k.startswith(OFFSETS_PREFIX)]


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
