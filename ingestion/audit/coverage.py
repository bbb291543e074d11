"""The full audit's recount of every partition's committed range, record by record (R47, R56).

The per-commit audit (:mod:`ingestion.audit.incremental`) compares each commit the table still
holds with Kafka through its snapshot's summary. The commits whose snapshots were expired, by
our maintenance or by another engine's ``expire_snapshots`` (R56), have no summary left, and
the oldest commit left has no known start: a full audit of such a table recounted nothing and
passed. So the full audit also recounts, for every partition the group has committed, the whole
range from where reading began to the committed offset, by coordinates
(:func:`recount_committed_ranges`): every record Kafka still holds there (``read_committed``, as
the per-commit recount reads: transaction markers and aborted records are no records) is a row
of the table or of its quarantine table (by ``_kafka_topic``, ``_kafka_partition``,
``_kafka_offset``), and every such row there is a record Kafka holds. The expired commits are
covered by it although their summaries are gone. A coordinate held twice, and a row at or after
the committed offset, are the row scan's findings (:func:`ingestion.audit.oracle.audit_table`).

Where a partition's range starts (:func:`choose_range_start`): at the lowest of where reading
began and the lowest offset the table's rows, its quarantine table's rows or a reset the
snapshots left record, never below Kafka's log start. Where reading began is exact when a
commit left in the lineage recorded it (``kafka.range-starts``: the partition's first commit)
or the table's record of what the group's reads left out does (``kafka.left-out.<group>``,
:mod:`ingestion.table.left_out`: it outlives the expiry of that commit); otherwise the
pipeline's ``starting_position`` says it (``earliest``: the log start then, at most today's;
``offsets``: the offset given), and for ``latest`` and ``timestamp`` nothing does. Records
left out on purpose are not expected, each range named with why: the ranges an operator's
forward reset skipped, from the reset's snapshot or, once that is expired, from the table's
record (a backward reset after it reads them again: then they are expected); the ranges
recorded as lost (R12); nor are the dead letters of commits the quarantine sync has not applied
yet, up to the number each commit quarantined, in that commit's own range only (from the commit
before it, or its own ``kafka.range-starts``): where neither is left nothing is excused, and
records missing below its committed offset that may be its dead letters are a doubt (a WARN:
lost, or not synced yet), never excused. The record is used only when it belongs to the
head's history (written by the group's committed state's commit: a rollback by another tool
past it leaves it unused, and said so), so no range is excused that a reset in the head's
history did not skip. In ``mode: upsert`` a record whose key changed again, or was deleted,
has no row: only the rows are checked against Kafka's records. On a topic with
``cleanup.policy=compact`` a row whose record Kafka's log compaction removed is not a finding
(R14); where the policy cannot be read (no ``DescribeConfigs`` on the topic), such rows are a
doubt naming the missing ACL.

What it cannot check it names (``unchecked``), and never counts as checked: offsets Kafka's
retention deleted before the audit; offsets below the table's lowest row where nothing records
where reading began (the pass then says "passed, partly"); a topic whose id is not the one the
offsets were committed for (deleted and recreated: its records are another topic's); offsets
retention deleted during the audit (each partition's log start is read just before its range,
and once more when the read is out of range); every partition when the group's offsets are not
proven. What it cannot
know: a forward reset among the expired commits that the table's record does not hold (one
from before the record existed, or before a rollback or a writer without it dropped the
record) reads as records missing; the finding says so.

Cost: one scan of the coordinates of the table and its quarantine table, and a read of every
committed range in Kafka (~100,000 offsets/s, docs/operate.md); memory: the rows' offsets, not
Kafka's records (the two are compared as sorted streams, :func:`compare_partition`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ingestion import exceptions
from ingestion.audit.clusters import read_labelled
from ingestion.audit.recount import parse_lost_spans
from ingestion.kafka.clients import client_properties
from ingestion.kafka.consumer import iter_batches, open_consumer
from ingestion.kafka.ranges import Key, OffsetRange
from ingestion.kafka.topics import query_watermarks
from ingestion.quarantine.sync import FOLLOWS, SYNCED_SEQUENCE
from ingestion.table.left_out import (
    LEFT_OUT_PREFIX,
    MAX_SPANS,
    ResetNote,
    belongs_to,
    note_reset,
    read_left_out,
    skipped_spans,
)
from ingestion.table.offsets import (
    FAILOVER_TO,
    LOST_RANGES,
    OFFSETS_PREFIX,
    QUARANTINED,
    RANGE_STARTS,
    RESET_BY,
    CommittedState,
    decode_offsets,
    decode_starts,
    find_committed_state,
    flatten,
    iter_ancestry,
    snapshot_properties,
    table_has_rows,
)
from ingestion.table.rewind import retired_groups

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from ingestion.spec.pipeline import StartingPosition

EXAMPLES = 20
"""Offsets a finding lists per partition (it counts them all)."""


@dataclass
class RangeRecount:
    """What the recount of every partition's committed range found; ``ok`` when no record is
    missing and no row lies where Kafka holds no record. ``unchecked`` names what could not be
    checked, ``notes`` what was excused and why, ``doubts`` what the recount cannot decide
    (records that are lost or dead letters not synced yet; rows whose records log compaction
    may have removed): not a pass, not a loss."""

    partitions: int = 0  # partitions whose range was read in Kafka
    offsets: int = 0  # offsets those ranges cover
    visible: int = 0  # records Kafka holds there
    left_out: int = 0  # of those, not expected: left out on purpose (each range in ``notes``)
    ranges: list[OffsetRange] = field(default_factory=list)
    expired_snapshots: int | None = 0  # snapshots older than the oldest left (None: unknown)
    oldest_snapshot: int | None = None  # the oldest snapshot left in the head's lineage
    findings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unrecounted: str | None = None  # the range Kafka could not be read for, and why
    doubts: list[str] = field(default_factory=list)  # neither a pass nor a loss: a WARN
    rows_only: bool = False  # mode: upsert: only the rows were checked against the records
    # A pipeline with replicas: no range is recounted, by design (``unchecked`` says why); its
    # commits are recounted one by one and its rows scanned, as before the range recount.
    by_commit_only: bool = False

    @property
    def ok(self) -> bool:
        """No finding, and every range was read."""
        return not self.findings and self.unrecounted is None


class LeftOutSpan(NamedTuple):
    """``[start, end)`` of a partition, not expected: why, and what names it once (a reset's
    commit id, a lost range's snapshot), so a reset read both from its snapshot and from the
    table's record is named once."""

    start: int
    end: int
    why: str
    ref: str


class PendingCommit(NamedTuple):
    """A commit whose dead letters the quarantine table does not reflect yet: its ranges (by
    partition, ``[start, end)``) and how many records it quarantined. ``unplaced``: its
    partitions whose range start nothing records (the commit before it expired and it recorded
    no ``kafka.range-starts`` there): their range is empty here, nothing is excused there."""

    snapshot_id: int
    spans: dict[Key, tuple[int, int]]
    quarantined: int
    unplaced: dict[Key, int]  # partition -> the commit's end offset there


@dataclass
class RetainedHistory:
    """What the snapshots left in the head's lineage, and the table's record of what the
    group's reads left out (``kafka.left-out.<group>``), say about each partition's reads
    (metadata only, :func:`read_retained_history`)."""

    recorded: dict[Key, int] = field(default_factory=dict)  # reading began (exact)
    floors: dict[Key, int] = field(default_factory=dict)  # the lowest offset a reset moved to
    skipped: dict[Key, list[LeftOutSpan]] = field(default_factory=dict)  # left out on purpose
    cut: dict[Key, int] = field(default_factory=dict)  # the record's bound dropped ranges below
    expired_below: dict[Key, int] = field(default_factory=dict)  # below: commits expired
    pending: list[PendingCommit] = field(default_factory=list)
    complete: bool = True  # the lineage reaches the table's first snapshot
    syncable: bool = False  # a quarantine table exists: pending dead letters may still arrive
    notes: list[str] = field(default_factory=list)


def read_retained_history(
    table: Table,
    group_id: str,
    quarantine: Table | None,
    ends: dict[Key, int],
    committed: CommittedState | None = None,
) -> RetainedHistory:
    """The group's commits left in the lineage, oldest first (and those of the groups a
    migration there retired: the same offsets, carried on), then the table's record of what
    the group's reads left out (when it belongs to ``committed``, the group's committed state:
    :func:`ingestion.table.left_out.belongs_to`; otherwise a note says it was not used).

    ``recorded``: where a partition's first range began (``kafka.range-starts``, or the
    record's). ``floors``: the offsets resets moved the group to (reads restart there).
    ``skipped``: the ranges an operator's forward reset skipped, cut where a later backward
    reset reads them again (the record's, for resets whose snapshots are expired), and the
    ranges recorded as lost. ``cut``: below where the record's bound dropped ranges.
    ``expired_below``: when the lineage does not reach the table's first snapshot, the offsets
    of the oldest commit left (``ends`` when none is left): the ranges below were committed by
    commits whose snapshots are gone. ``pending``: the commits whose dead letters the quarantine
    table does not reflect yet (after its recorded ``synced-sequence``), each range from the
    previous commit's offset, or from the commit's own ``kafka.range-starts`` when no previous
    commit is left; a partition where neither says where it began is ``unplaced``: none of
    its records is excused (a range from offset 0 would excuse a loss anywhere below)."""
    history = RetainedHistory(syncable=quarantine is not None)
    lineage = list(reversed(list(iter_ancestry(table))))
    history.complete = not lineage or is_table_first(lineage[0])
    groups = {group_id}
    for snapshot in lineage:
        groups |= retired_groups(snapshot_properties(snapshot))
    keys = [OFFSETS_PREFIX + group_id, *(OFFSETS_PREFIX + g for g in sorted(groups - {group_id}))]
    synced = read_synced_sequence(table, quarantine)
    previous: dict[Key, int] | None = None
    for snapshot in lineage:
        properties = snapshot_properties(snapshot)
        key = next((k for k in keys if k in properties), None)
        if key is None or FAILOVER_TO in properties:
            continue
        current = flatten(decode_offsets(properties[key]))
        if previous is None and not history.complete:
            history.expired_below.update(current)
        if RESET_BY in properties:
            note = note_reset(snapshot.snapshot_id, snapshot.timestamp_ms, properties)
            _record_reset(history, previous or {}, current, note)
        else:
            starts = decode_starts(properties[RANGE_STARTS]) if RANGE_STARTS in properties else {}
            for part, offset in starts.items():
                history.recorded[part] = min(history.recorded.get(part, offset), offset)
            for part, (a, b) in parse_lost_spans(properties.get(LOST_RANGES, "")).items():
                why = f"recorded as lost by snapshot {snapshot.snapshot_id} (on_data_loss: skip)"
                lost = LeftOutSpan(a, b, why, f"lost:{snapshot.snapshot_id}")
                history.skipped.setdefault(part, []).append(lost)
            quarantined = int(properties.get(QUARANTINED, "0") or 0)
            if quarantined and (snapshot.sequence_number or 0) > synced:
                history.pending.append(
                    place_pending(snapshot.snapshot_id, quarantined, previous, starts, current)
                )
        previous = current
    if previous is None and not history.complete:  # every commit expired: the position's
        history.expired_below.update(ends)
    _read_record(history, table, group_id, committed)
    return history


def place_pending(
    snapshot_id: int,
    quarantined: int,
    previous: dict[Key, int] | None,
    starts: dict[Key, int],
    current: dict[Key, int],
) -> PendingCommit:
    """The ranges of a commit whose dead letters are not synced yet (pure): each partition's
    from the previous commit's offset there, else from the commit's own recorded range start;
    where neither is known the range is empty and the partition ``unplaced``.

    Example:
        >>> pending = place_pending(7, 1, None, {("t", 1): 4}, {("t", 0): 30, ("t", 1): 9})
        >>> pending.spans, pending.unplaced
        ({('t', 0): (30, 30), ('t', 1): (4, 9)}, {('t', 0): 30})
    """
    spans: dict[Key, tuple[int, int]] = {}
    unplaced: dict[Key, int] = {}
    for part, offset in current.items():
        began = (previous or {}).get(part, starts.get(part))
        if began is None:
            unplaced[part] = offset
            began = offset
        spans[part] = (began, offset)
    return PendingCommit(snapshot_id, spans, quarantined, unplaced)


def _record_reset(
    history: RetainedHistory, before: dict[Key, int], after: dict[Key, int], note: ResetNote
) -> None:
    """An operator's reset from ``before`` to ``after``: forward, it skips a range; backward,
    its delete and the reads after it cover again what an earlier forward reset skipped."""
    for part, offset in after.items():
        history.floors[part] = min(history.floors.get(part, offset), offset)
        was = before.get(part)
        if was is None or was == offset:
            continue
        spans = history.skipped.setdefault(part, [])
        if offset > was:
            spans.append(
                LeftOutSpan(was, offset, f"skipped by the {note.describe()}", note.commit_id)
            )
        else:
            spans[:] = [s._replace(end=min(s.end, offset)) for s in spans if s.start < offset]


def _read_record(
    history: RetainedHistory, table: Table, group_id: str, committed: CommittedState | None
) -> None:
    """Add what the table's record of the group's reads says (:mod:`ingestion.table.left_out`),
    for the partitions read under the topic ids of ``committed``, when it belongs to it."""
    record = read_left_out(table.metadata.properties, group_id)
    if record is None or committed is None:
        return
    if not belongs_to(record, committed):
        history.notes.append(
            f"the table's record of what group {group_id!r}'s reads left out on purpose "
            f"({LEFT_OUT_PREFIX}{group_id}) was written by snapshot {record.snapshot_id}, not by "
            f"the group's committed state (snapshot {committed.snapshot_id}: a rollback, or a "
            "writer without it, since): not used, nothing is excused by it"
        )
        return
    for topic, offsets in committed.offsets.items():
        for partition in offsets.next_offsets:
            key = (topic, partition)
            part = record.partitions.get(key)
            if part is None or part.topic_id != offsets.topic_id:
                continue
            if part.began is not None:
                history.recorded[key] = min(history.recorded.get(key, part.began), part.began)
            for skip, why in skipped_spans(record, key, offsets.topic_id):
                span = LeftOutSpan(skip.start, skip.end, why, ",".join(skip.resets))
                history.skipped.setdefault(key, []).append(span)
            if part.cut_below is not None:
                history.cut[key] = part.cut_below


def merge_left_out(spans: Iterable[LeftOutSpan]) -> list[tuple[int, int, tuple[str, ...]]]:
    """Disjoint ranges from ``spans``, overlapping or adjacent ones merged, each with the
    reasons of the spans it merges (one per ``ref``) (pure).

    Example:
        >>> merge_left_out([LeftOutSpan(10, 20, "by r1", "c1"), LeftOutSpan(12, 20, "r1", "c1"),
        ...                 LeftOutSpan(20, 25, "by r2", "c2"), LeftOutSpan(40, 41, "lost", "s")])
        [(10, 25, ('by r1', 'by r2')), (40, 41, ('lost',))]
    """
    merged: list[tuple[int, int, dict[str, str]]] = []
    for span in sorted(spans, key=lambda s: (s.start, s.end)):
        if span.end <= span.start:
            continue
        if merged and span.start <= merged[-1][1]:
            start, end, whys = merged[-1]
            whys.setdefault(span.ref, span.why)
            merged[-1] = (start, max(end, span.end), whys)
        else:
            merged.append((span.start, span.end, {span.ref: span.why}))
    return [(start, end, tuple(whys.values())) for start, end, whys in merged]


def is_table_first(snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` is the table's first: no parent and the first sequence number (an
    expiry clears the parent id of the oldest snapshot it keeps, so the id alone says
    nothing)."""
    return snapshot.parent_snapshot_id is None and snapshot.sequence_number == 1


def read_synced_sequence(table: Table, quarantine: Table | None) -> int:
    """The sequence number of the last data commit the quarantine table reflects (0: none, or
    no quarantine table, or one that follows another table)."""
    if quarantine is None:
        return 0
    state = quarantine.metadata.properties
    uuid = str(table.metadata.table_uuid)
    if state.get(FOLLOWS, uuid) != uuid:
        return 0
    return int(state.get(SYNCED_SEQUENCE, "0") or 0)


def count_expired_snapshots(table: Table) -> tuple[int | None, int | None]:
    """(how many snapshots older than the oldest one left in the head's lineage were
    expired, that oldest snapshot's id). By sequence numbers, which every commit of a format
    v2 table takes in turn: 0 when the lineage reaches the table's first snapshot, None when
    the table has none (format v1)."""
    lineage = list(iter_ancestry(table))
    if not lineage:
        return 0, None
    oldest = lineage[-1]
    if is_table_first(oldest):
        return 0, oldest.snapshot_id
    sequence = oldest.sequence_number or 0
    if sequence <= 0:
        return None, oldest.snapshot_id
    kept = sum(1 for s in table.metadata.snapshots if 0 < (s.sequence_number or 0) < sequence)
    return sequence - 1 - kept, oldest.snapshot_id


def assume_start(position: StartingPosition | None, key: Key, log_start: int) -> int | None:
    """Where the pipeline's ``starting_position`` says reading of ``key`` began: for
    ``earliest`` today's log start (the log start then was at most that), for ``offsets`` the
    offset given (a partition not listed starts at its earliest); None for ``latest`` and
    ``timestamp`` (the offset they resolved to is not kept).

    Example:
        >>> from ingestion.spec.pipeline import StartingPosition
        >>> given = StartingPosition(mode="offsets", offsets={"t:0": 40})
        >>> assume_start(given, ("t", 0), 5), assume_start(given, ("t", 1), 5)
        (40, 5)
        >>> assume_start(StartingPosition(mode="latest"), ("t", 0), 5) is None
        True
    """
    mode = position.mode if position is not None else "earliest"
    if mode == "earliest":
        return log_start
    if mode == "offsets" and position is not None:
        return (position.offsets or {}).get(f"{key[0]}:{key[1]}", log_start)
    return None


def choose_range_start(
    key: Key, end: int, log_start: int, begin: int | None, origin: str, lowest: int | None
) -> tuple[int, list[str]]:
    """Where the recount of ``key`` up to ``end`` starts, and what below it is not checked.

    ``begin`` is where reading began: recorded by a commit left (``origin`` ``recorded``),
    else as ``starting_position`` says (``origin`` its mode; None for ``latest`` and
    ``timestamp``). ``lowest`` is the lowest offset below ``end`` that a row or a reset shows
    was read (None: none). The range starts at the lower of the two, raised to Kafka's
    ``log_start``; offsets below it that may hold records the pipeline read are named.

    Example:
        >>> choose_range_start(("t", 0), 30, 0, 0, "recorded", 0)
        (0, [])
        >>> start, (note,) = choose_range_start(("t", 0), 30, 12, 0, "recorded", 0)
        >>> start, note
        (12, "t[0] offsets [0, 12) were deleted by Kafka's retention before this audit ...")
        >>> choose_range_start(("t", 0), 30, 12, 12, "earliest", 14)[1]
        ['t[0]: the commits that read below offset 12 were expired and Kafka no longer ...']
        >>> start, (note,) = choose_range_start(("t", 0), 30, 0, None, "latest", 20)
        >>> start, note
        (20, "t[0] offsets [0, 20), below the table's lowest row: where reading began is ...")
        >>> choose_range_start(("t", 0), 30, 0, None, "latest", None)[0]
        30
    """
    where = f"{key[0]}[{key[1]}]"
    known = [offset for offset in (begin, lowest) if offset is not None]
    if not known:
        if end > log_start:
            return end, [
                f"{where} offsets [{log_start}, {end}): where reading began is not recorded in "
                f"the snapshots left (starting_position {origin!r}) and the table holds no row "
                "there: not recounted"
            ]
        return end, [] if end <= 0 else [_retention_note(where, log_start)]
    first = min(known)
    notes = []
    if first < log_start:
        notes.append(
            f"{where} offsets [{first}, {min(log_start, end)}) were deleted by Kafka's retention "
            f"before this audit (its log starts at {log_start}): not recounted"
        )
    elif origin == "earliest" and log_start > 0:
        notes.append(_retention_note(where, log_start))
    if begin is None and first > log_start:
        notes.append(
            f"{where} offsets [{log_start}, {first}), below the table's lowest row: where reading "
            f"began is not recorded in the snapshots left (starting_position {origin!r}): not "
            "recounted"
        )
    return min(max(first, log_start), end), notes


def _retention_note(where: str, log_start: int) -> str:
    return (
        f"{where}: the commits that read below offset {log_start} were expired and Kafka no "
        f"longer holds offsets < {log_start} (retention): not recounted"
    )


@dataclass(frozen=True)
class PartitionCheck:
    """One partition's range compared with the rows there (:func:`compare_partition`)."""

    visible: int  # records Kafka holds in the range
    missing: int  # of those, held by no row and not left out on purpose
    missing_examples: tuple[int, ...]
    left_out: int  # held by no row, in a range skipped on purpose
    awaiting: dict[int, int]  # held by no row, in a pending commit's range: its index -> count
    outside: int  # rows in the range at offsets where Kafka holds no record
    outside_examples: tuple[int, ...]
    left_out_by: dict[tuple[int, int], int] = field(default_factory=dict)  # per skipped range
    missing_last: int = -1  # the highest missing offset (-1: none)


def compare_partition(
    start: int,
    end: int,
    visible: Iterable[int],
    held: Sequence[int],
    skipped: Sequence[tuple[int, int]] = (),
    pending: Sequence[tuple[int, int]] = (),
    upsert: bool = False,
) -> PartitionCheck:
    """Compare the offsets of the records Kafka holds in ``[start, end)`` (``visible``, in
    increasing order, as Kafka yields them) with the offsets of the rows (``held``, sorted):
    a record held by no row is missing unless a range of ``skipped`` (disjoint:
    :func:`merge_left_out`) holds it (left out on purpose: counted per range in
    ``left_out_by``) or the n-th range of ``pending`` does (a dead letter not synced yet:
    counted per range in ``awaiting``); in ``upsert`` mode none is (a later change of its key
    replaced it). A row there at an offset Kafka holds no record at is ``outside``. Pure;
    memory: the examples only.

    Example:
        >>> check = compare_partition(0, 10, [0, 1, 2, 4, 5, 6, 7], [0, 1, 3, 4, 7, 12],
        ...                           skipped=[(5, 6)], pending=[(6, 7)])
        >>> check.visible, check.missing_examples, check.left_out, check.awaiting
        (7, (2,), 1, {0: 1})
        >>> check.left_out_by
        {(5, 6): 1}
        >>> check.outside_examples
        (3,)
        >>> compare_partition(0, 10, [0, 1, 2], [1], upsert=True).missing
        0
    """
    rows = sorted(set(o for o in held if start <= o < end))
    skips = sorted(skipped)
    index = count = left_out = missing = outside = 0
    missing_last = -1
    missing_examples: list[int] = []
    outside_examples: list[int] = []
    awaiting: dict[int, int] = {}
    left_out_by: dict[tuple[int, int], int] = {}
    for offset in visible:
        count += 1
        while index < len(rows) and rows[index] < offset:
            outside += 1
            if len(outside_examples) < EXAMPLES:
                outside_examples.append(rows[index])
            index += 1
        if index < len(rows) and rows[index] == offset:
            index += 1
            continue
        if upsert:
            continue
        at = bisect.bisect_right(skips, (offset, float("inf"))) - 1
        if at >= 0 and skips[at][0] <= offset < skips[at][1]:
            left_out += 1
            span = (skips[at][0], skips[at][1])
            left_out_by[span] = left_out_by.get(span, 0) + 1
            continue
        waiting = next((n for n, (a, b) in enumerate(pending) if a <= offset < b), None)
        if waiting is not None:
            awaiting[waiting] = awaiting.get(waiting, 0) + 1
            continue
        missing += 1
        missing_last = offset
        if len(missing_examples) < EXAMPLES:
            missing_examples.append(offset)
    for offset in rows[index:]:
        outside += 1
        if len(outside_examples) < EXAMPLES:
            outside_examples.append(offset)
    return PartitionCheck(
        count,
        missing,
        tuple(missing_examples),
        left_out,
        awaiting,
        outside,
        tuple(outside_examples),
        left_out_by,
        missing_last,
    )


def describe_offsets(examples: Sequence[int], total: int) -> str:
    """Offsets as runs, with how many there are in all when the examples are fewer.

    Example:
        >>> describe_offsets([3, 7, 8, 9, 12], 5), describe_offsets([0, 1], 40)
        ('3, 7-9, 12', '0-1 (40 in all)')
    """
    runs: list[list[int]] = []
    for offset in sorted(examples):
        if runs and offset == runs[-1][1] + 1:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return text if total <= len(examples) else f"{text} ({total} in all)"


def _read_held(tables: list[Table], ends: dict[Key, int]) -> dict[Key, list[int]]:
    """Per committed partition, the sorted offsets of the rows of ``tables`` there."""
    held: dict[Key, list[int]] = {}
    for table in tables:
        for (topic, partition, offset), _ in read_labelled(table):
            if (topic, partition) in ends and offset is not None:
                held.setdefault((topic, partition), []).append(offset)
    for offsets in held.values():
        offsets.sort()
    return held


def read_cleanup_policies(
    kafka_config: dict[str, Any], topics: set[str], timeout_s: float
) -> dict[str, str | None]:
    """Each of ``topics``' ``cleanup.policy`` (``delete``, ``compact``, ``compact,delete``),
    None when it cannot be read (the principal lacks ``DescribeConfigs`` on the topic, or the
    cluster did not answer): then whether log compaction removed records is not known."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(client_properties(kafka_config, "admin"))
    policies: dict[str, str | None] = {}
    for topic in sorted(topics):
        try:
            (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
            policy = future.result(timeout_s).get("cleanup.policy")
        except (KafkaException, TimeoutError, ValueError):
            policies[topic] = None
            continue
        policies[topic] = "delete" if policy is None else str(policy.value or "delete")
    return policies


def read_topic_ids(
    kafka_config: dict[str, Any], topics: set[str], timeout_s: float
) -> dict[str, str | None]:
    """Each of ``topics``' id on the cluster now (it changes when a topic is deleted and
    recreated), None for a topic that does not exist. Reads only (describe, never metadata:
    no topic is created).

    Raises:
        KafkaException: a topic could not be described for another reason.
    """
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    if not topics:
        return {}
    admin = AdminClient(client_properties(kafka_config, "admin"))
    ids: dict[str, str | None] = {}
    for topic, future in admin.describe_topics(TopicCollection(sorted(topics))).items():
        try:
            ids[topic] = str(future.result(timeout_s).topic_id)
        except KafkaException as exc:
            if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":
                raise
            ids[topic] = None
    return ids


def drop_recreated_topics(
    committed: CommittedState, live: dict[str, str | None], ends: dict[Key, int]
) -> list[str]:
    """Remove from ``ends`` the partitions of the topics whose id now (``live``) is not the
    one the table's offsets were committed for (the topic was deleted and recreated, or is
    gone): Kafka's records there are another topic's, nothing to compare the rows with. Return
    what was left unchecked, each topic named with both ids (pure)."""
    unchecked = []
    for topic, offsets in sorted(committed.offsets.items()):
        now = live.get(topic, offsets.topic_id)
        if now == offsets.topic_id:
            continue
        for key in [k for k in ends if k[0] == topic]:
            del ends[key]
        unchecked.append(
            f"{topic}: no longer exists (the table's offsets are for topic id "
            f"{offsets.topic_id}): not recounted"
            if now is None
            else f"{topic}: recreated: topic id {now}, the table's offsets are for "
            f"{offsets.topic_id} (the pipeline refuses it until its offsets are reset): its "
            "records are another topic's, not recounted"
        )
    return unchecked


def recount_committed_ranges(
    table: Table,
    group_id: str,
    kafka_config: dict[str, Any],
    pipeline: str,
    *,
    quarantine: Table | None = None,
    starting_position: StartingPosition | None = None,
    upsert: bool = False,
    timeout_s: float = 30.0,
) -> RangeRecount:
    """Recount every partition the group has committed in ``table`` from where its reading
    began to its committed offset (see the module docstring). Reads only.

    ``quarantine`` (the pipeline's quarantine table) is best loaded before ``table``: every
    commit it reflects is then in the lineage read after it, and the dead letters of newer
    commits count as not synced yet (ingestion.quarantine.sync). A range Kafka cannot be read
    for (the cluster unreachable, a read error) leaves ``unrecounted`` set: not a pass. A
    topic whose id is not the one the offsets were committed for (recreated) is named, not
    recounted. Each partition's log start is read just before its range
    (:func:`recount_partition`), so retention running during the audit is named, not an error.
    """
    from confluent_kafka import KafkaException

    result = RangeRecount(rows_only=upsert)
    result.expired_snapshots, result.oldest_snapshot = count_expired_snapshots(table)
    committed = find_committed_state(table, group_id)
    if committed is None:
        if table_has_rows(table):
            result.unchecked.append(
                f"no partition recounted: the offsets of group {group_id!r} are not proven "
                "(every snapshot with them was expired and the position's witness row is gone, "
                "or the table was rolled back past it): offsets_watermark_reachable says more"
            )
        return result
    ends = flatten(committed.offsets)
    history = read_retained_history(table, group_id, quarantine, ends, committed)
    result.notes += history.notes
    held = _read_held([table] + ([quarantine] if quarantine is not None else []), ends)
    role = f"{pipeline}-audit"
    where = "its topics' ids"
    checks: dict[Key, PartitionCheck] = {}
    left_out = {key: merge_left_out(spans) for key, spans in history.skipped.items()}
    try:
        live = read_topic_ids(kafka_config, set(committed.offsets), min(10.0, timeout_s))
        result.unchecked += drop_recreated_topics(committed, live, ends)
        with open_consumer(kafka_config, role) as consumer:
            for key, end in sorted(ends.items()):
                where = f"{key[0]}[{key[1]}]"
                offsets = held.get(key, [])

                def plan(log_start: int, key: Key = key, end: int = end) -> tuple[int, list[str]]:
                    return _plan_start(
                        key, end, log_start, history, held.get(key, []), starting_position
                    )

                pending = [commit.spans.get(key, (0, 0)) for commit in history.pending]
                skips = [(a, b) for a, b, _ in left_out.get(key, [])]
                recounted = recount_partition(
                    consumer,
                    key,
                    end,
                    plan,
                    offsets,
                    skips,
                    pending,
                    upsert=upsert,
                    timeout_s=timeout_s,
                    role=role,
                )
                result.unchecked += recounted.unchecked
                if recounted.check is not None and recounted.range is not None:
                    checks[key] = recounted.check
                    result.ranges.append(recounted.range)
    except (exceptions.ReadError, KafkaException, TimeoutError) as exc:
        result.unrecounted = f"could not recount {where} ({exc})"
        return result
    result.partitions = len(result.ranges)
    result.offsets = sum(r.size for r in result.ranges)
    result.visible = sum(c.visible for c in checks.values())
    result.left_out = sum(c.left_out for c in checks.values())
    _judge(result, history, checks, left_out, kafka_config, upsert, timeout_s)
    return result


@dataclass(frozen=True)
class PartitionRecount:
    """One partition's recount (:func:`recount_partition`): the range read and its comparison
    (None when nothing was left to read), and what below it was not checked."""

    range: OffsetRange | None
    check: PartitionCheck | None
    unchecked: list[str]


def recount_partition(
    consumer: Consumer,
    key: Key,
    end: int,
    plan: Callable[[int], tuple[int, list[str]]],
    held: Sequence[int],
    skipped: Sequence[tuple[int, int]] = (),
    pending: Sequence[tuple[int, int]] = (),
    *,
    upsert: bool = False,
    timeout_s: float = 30.0,
    role: str = "audit",
    log_start: int | None = None,
) -> PartitionRecount:
    """Read ``key``'s range up to ``end`` in Kafka and compare it with the rows' offsets
    (``held``: :func:`compare_partition`). The partition's log start is queried just before
    (``log_start``: one queried earlier, to start from), and ``plan`` turns it into where the
    range starts and what below is not checked (:func:`choose_range_start`). When the read
    fails and the log start has since moved past where it began (Kafka's retention deleted
    the segment meanwhile: the read is out of range), the log start is queried once more and
    the range read again from there, the retention cut named; any other failure is raised.

    Raises:
        ReadError, KafkaException: the range could not be read.
    """
    from confluent_kafka import KafkaException

    probe = min(10.0, timeout_s)
    if log_start is None:
        log_start = query_watermarks(consumer, *key, probe)[0]
    retried = False
    while True:
        start, unchecked = plan(log_start)
        if start >= end:
            return PartitionRecount(None, None, unchecked)
        rng = OffsetRange(key[0], key[1], start, end)
        visible = (
            int(m.offset() or 0)
            for batch in iter_batches(consumer, rng, timeout_s, f"{role} {rng}")
            for m in batch
        )
        try:
            check = compare_partition(start, end, visible, held, skipped, pending, upsert)
        except (exceptions.ReadError, KafkaException):
            consumer.unassign()
            moved = query_watermarks(consumer, *key, probe)[0]
            if retried or moved <= start:
                raise
            retried, cut = True, log_start
            log_start = moved
            continue
        if retried:
            unchecked.append(
                f"{key[0]}[{key[1]}]: Kafka's retention deleted offsets [{cut}, {log_start}) "
                f"during this audit (the log start moved from {cut} to {log_start} before the "
                "range was read): recounted from the new log start"
            )
        return PartitionRecount(rng, check, unchecked)


def _plan_start(
    key: Key,
    end: int,
    log_start: int,
    history: RetainedHistory,
    held: list[int],
    starting_position: StartingPosition | None,
) -> tuple[int, list[str]]:
    """:func:`choose_range_start` for ``key``, from what the snapshots left record, the
    spec's ``starting_position`` and the lowest row ``held`` (sorted)."""
    read_at = [history.floors.get(key), *held[:1]]
    lowest = min((o for o in read_at if o is not None and o < end), default=None)
    begin: int | None
    if key in history.recorded:
        begin, origin = history.recorded[key], "recorded"
    else:
        origin = starting_position.mode if starting_position is not None else "earliest"
        begin = assume_start(starting_position, key, log_start)
    return choose_range_start(key, end, log_start, begin, origin, lowest)


def _judge(
    result: RangeRecount,
    history: RetainedHistory,
    checks: dict[Key, PartitionCheck],
    left_out: dict[Key, list[tuple[int, int, tuple[str, ...]]]],
    kafka_config: dict[str, Any],
    upsert: bool,
    timeout_s: float,
) -> None:
    """Turn each partition's comparison into findings, notes (each range left out on
    purpose, named with why) and what was not checked."""
    ranges = {(r.topic, r.partition): r for r in result.ranges}
    awaiting: dict[int, int] = {}
    for check in checks.values():
        for index, count in check.awaiting.items():
            awaiting[index] = awaiting.get(index, 0) + count
    for index, count in sorted(awaiting.items()):
        snapshot_id, _, quarantined, _ = history.pending[index]
        if count <= quarantined:
            result.notes.append(
                f"snapshot {snapshot_id}: {count} record(s) of its ranges are its dead letters, "
                "not yet synced into the quarantine table"
            )
        else:
            result.findings.append(
                f"snapshot {snapshot_id}: {count} record(s) of its ranges are in neither the "
                f"table nor its quarantine table, more than the {quarantined} it quarantined "
                "(its dead letters are not synced yet)"
            )
    outside = {key for key, check in checks.items() if check.outside}
    policies = (
        read_cleanup_policies(kafka_config, {key[0] for key in outside}, min(10.0, timeout_s))
        if outside
        else {}
    )
    budgets = {
        n: commit.quarantined - awaiting.get(n, 0) for n, commit in enumerate(history.pending)
    }
    for key, check in sorted(checks.items()):
        rng, where = ranges[key], f"{key[0]}[{key[1]}]"
        if check.missing:
            missing = (
                f"{where}: {check.missing} record(s) Kafka holds in [{rng.start}, {rng.end}) are "
                "in neither the table nor its quarantine table"
            )
            at = f"at offsets {describe_offsets(check.missing_examples, check.missing)}"
            unplaced = _find_unplaced(key, check, history, budgets)
            if unplaced is None:
                result.findings.append(
                    f"{missing} (lost), {at}" + _expired_caveat(key, check, history)
                )
            else:
                snapshot_id, quarantined = unplaced
                result.doubts.append(
                    f"{missing}, {at}: lost, or dead letters of snapshot {snapshot_id} (it "
                    f"quarantined {quarantined}, not yet synced into the quarantine table, and "
                    "where its range began is not recorded: the commit before it was expired), "
                    "which cannot tell them apart; the pipeline's next run syncs its dead "
                    "letters: audit again then"
                )
        whys = {(a, b): why for a, b, why in left_out.get(key, [])}
        for (a, b), count in sorted(check.left_out_by.items()):
            why = "; ".join(whys.get((a, b), ("left out on purpose",)))
            result.notes.append(f"{where} [{a}, {b}): {count} record(s) not expected: {why}")
        if not check.outside:
            continue
        rows = (
            f"{where}: {check.outside} row(s) in [{rng.start}, {rng.end}) at offsets where "
            f"Kafka holds no record, at offsets "
            f"{describe_offsets(check.outside_examples, check.outside)}"
        )
        policy = policies.get(key[0], "delete")
        if policy is None:
            result.doubts.append(
                f"{rows}: the topic's cleanup.policy could not be read (grant the principal "
                f"DescribeConfigs on topic {key[0]!r}), so whether Kafka's log compaction "
                "removed their records is not known"
            )
        elif "compact" in policy:
            result.unchecked.append(
                f"{where}: {check.outside} row(s) at offsets Kafka's log compaction removed "
                "(cleanup.policy=compact): not checked"
            )
        else:
            result.findings.append(
                f"{rows} (an aborted record or a transaction marker read as one, or a row "
                "another writer made up)"
            )
    if upsert and checks:
        result.notes.append(
            "mode: upsert: a record whose key changed again or was deleted has no row, so only "
            "the rows were checked against Kafka's records"
        )


def _find_unplaced(
    key: Key, check: PartitionCheck, history: RetainedHistory, budgets: dict[int, int]
) -> tuple[int, int] | None:
    """The pending commit whose dead letters the missing records of ``check`` may be, when its
    range start in ``key`` is not recorded: (its snapshot id, its quarantined count), its
    ``budgets`` entry (the dead letters not yet accounted for) reduced by them. None when the
    missing records are more than any such commit quarantined, or lie above its end, or when
    no quarantine table exists to sync them into (lost)."""
    if not history.syncable:
        return None
    highest = check.missing_last
    for index, commit in enumerate(history.pending):
        end = commit.unplaced.get(key)
        if end is None or highest >= end or check.missing > budgets.get(index, 0):
            continue
        budgets[index] -= check.missing
        return commit.snapshot_id, commit.quarantined
    return None


def _expired_caveat(key: Key, check: PartitionCheck, history: RetainedHistory) -> str:
    """What else could leave the missing records of ``check`` out, where the table no longer
    records it (empty when nothing could: the table's record saw where reading began, so it
    holds every reset since)."""
    lowest = min(check.missing_examples)
    cut = history.cut.get(key)
    if cut is not None and lowest < cut:
        return (
            f" (below offset {cut} the table's record of the ranges resets skipped was cut to "
            f"its bound of {MAX_SPANS} ranges: a reset that skipped them is no longer named)"
        )
    below = history.expired_below.get(key)
    if below is None or key in history.recorded or lowest >= below:
        return ""
    return (
        f" (below offset {below} no snapshot is left to say where each commit's range began: "
        "only an operator's forward reset among the expired commits that the table's record "
        f"({LEFT_OUT_PREFIX}<group>) does not hold, one from before that record, or a first run "
        "that began later than starting_position says, would leave records out on purpose)"
    )
