"""What a group's reads leave out on purpose, in a table property that outlives snapshot expiry.

The full audit (:mod:`ingestion.audit.coverage`) expects, per partition, every record Kafka holds
from where the group's reading began to its committed offset, except what was left out on
purpose; the incremental audit's gap (:func:`ingestion.audit.incremental.audit_gap`) expects
every record between two positions. Two things leave records out on purpose, and only their
snapshots used to say so:

- **where reading began**: a partition's first commit (``kafka.range-starts``), or a reset of a
  partition that had no committed offset; nothing below it is expected (``starting_position``
  ``latest``, a timestamp, explicit offsets);
- **an operator's forward reset** (``--to-latest``, a forward ``--to-datetime``, ``--shift-by
  +N``): it skips exactly ``[old committed offset, new offset)`` per partition.

Once those snapshots are expired (our maintenance, another engine's ``expire_snapshots``, R56),
the skipped records read as lost, and a ``starting_position`` edited since reads as where
reading began. So every commit that sets a group's offsets (a run, a reset, a migration, a
switch) also sets, in the same atomic metadata commit as its snapshot and its position
(:func:`ingestion.table.offsets.record_position`), the table property
``kafka.left-out.<group>`` (:func:`record_left_out`): per partition, under its topic's id,
where reading began (when the record saw it) and the ranges resets skipped, each naming its
reset (when, who, why, commit, snapshot). Whatever a commit moves back to reads again: a
skipped range at or after a partition's new offset is cut out of the record.

**Whose history it tells.** Table properties are not versioned: a rollback by another tool
leaves the record ahead of the table, naming resets the head's history no longer holds. So the
record names the snapshot of the commit that wrote it, and is used (:func:`find_left_out`) only
when that commit is the group's committed state of the head (the newest ancestor with the
group's offsets, or the proven position, R56): every reset it names is then in the head's
history. A commit carries the record on only from such a head, else it starts a new one from
its own snapshot. A record dropped that way, or facts about another topic id (a recreated
topic, a switch's replica topics), only make the audit expect more records (an alarm naming
them), never fewer: no range is ever excused that a reset in the head's history did not skip.

**Retries.** The record is a pure function of the head a commit is made on and of the commit's
own staged snapshot (its offsets, its ``kafka.range-starts``, a reset's who and why): it is
computed inside the transaction, so each attempt of a compare-and-set loop
(:func:`ingestion.ops.action.commit_action`, :func:`ingestion.pipeline.commit.commit_data`)
recomputes it on the head it reloaded and re-checked. A commit replayed after an unknown
outcome is first looked up by its commit id: found, nothing is written again; absent, the
catalog applied none of it (the record included). A reset's skip is recorded once, with its
reset, or not at all, and then neither is the reset.

**Bound.** Adjacent or overlapping skipped ranges of a partition merge into one, which names at
most two of its resets and counts them all; a reset drops the ranges Kafka's retention deleted
(below the log start it was planned against: no audit reads there); and at most
:data:`MAX_SPANS` ranges are kept per group: beyond, the partition with the most loses its
lowest, and records below which its record is cut (``cut-below``: the audit names the cut
beside the records it finds missing there, and still fails on them). Who and why are kept to
:data:`MAX_TEXT` characters each, so the property stays under ~40 KB; without resets it holds
one offset per partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from ingestion.kafka.ranges import Key
from ingestion.table.offsets import (
    COMMIT_ID,
    MIGRATED_FROM,
    OFFSETS_PREFIX,
    RANGE_STARTS,
    RESET_BY,
    RESET_REASON,
    CommittedState,
    OffsetMap,
    decode_offsets,
    decode_starts,
    find_committed_state,
    snapshot_properties,
    table_has_rows,
)
from ingestion.table.route import ROUTE_ENDED, route_of

if TYPE_CHECKING:
    from pyiceberg.table import Table, Transaction

# Table property (not snapshot): what the group's reads left out on purpose (:class:`LeftOut`).
LEFT_OUT_PREFIX = "kafka.left-out."
MAX_SPANS = 64
"""Skipped ranges one group's record keeps, all partitions together (after merging)."""
MAX_TEXT = 200
"""Characters of a reset's ``requested_by`` and ``reason`` the record keeps."""


@dataclass(frozen=True)
class ResetNote:
    """The operator's reset that skipped a range: its commit, snapshot, time, who and why."""

    commit_id: str
    snapshot_id: int
    at_ms: int
    by: str
    reason: str

    def describe(self) -> str:
        """Name the reset for a message.

        Example:
            >>> ResetNote("c1", 7, 1795000000000, "ops", "skip a bad burst").describe()
            "offset reset on 2026-11-18 11:06:40 UTC by 'ops' (reason 'skip a bad burst'; ..."
        """
        when = datetime.fromtimestamp(self.at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"offset reset on {when} by {self.by!r} (reason {self.reason!r}; commit "
            f"{self.commit_id}, snapshot {self.snapshot_id})"
        )


def note_reset(snapshot_id: int, at_ms: int, properties: dict[str, str]) -> ResetNote:
    """The :class:`ResetNote` of a reset's snapshot (its properties and commit time)."""
    return ResetNote(
        properties.get(COMMIT_ID, ""),
        snapshot_id,
        at_ms,
        properties.get(RESET_BY, ""),
        properties.get(RESET_REASON, ""),
    )


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


@dataclass(frozen=True)
class Skip:
    """``[start, end)`` of one partition, skipped on purpose by ``merged`` resets, of which
    ``resets`` names at most two by commit id (the lowest range's and the highest's)."""

    start: int
    end: int
    resets: tuple[str, ...]
    merged: int = 1


@dataclass(frozen=True)
class PartitionLeftOut:
    """One partition's record, for the topic id ``topic_id``: where reading began (None: not
    seen by this record), what resets skipped, and below which skipped ranges were dropped by
    the bound (``cut_below``)."""

    topic_id: str
    began: int | None = None
    skipped: tuple[Skip, ...] = ()
    cut_below: int | None = None

    @property
    def empty(self) -> bool:
        return self.began is None and not self.skipped and self.cut_below is None


@dataclass(frozen=True)
class LeftOut:
    """A group's record of what its reads left out on purpose, as written by the commit of
    snapshot ``snapshot_id`` (the table property ``kafka.left-out.<group>``)."""

    snapshot_id: int
    partitions: dict[Key, PartitionLeftOut] = field(default_factory=dict)
    resets: dict[str, ResetNote] = field(default_factory=dict)

    def encode(self) -> str:
        """Compact JSON for the table property: per topic its id and partitions.

        Example:
            >>> note = ResetNote("c1", 6, 1795000000000, "ops", "why")
            >>> part = PartitionLeftOut("id1", 0, (Skip(10, 20, ("c1",)),))
            >>> record = LeftOut(7, {("t", 0): part}, {"c1": note})
            >>> record.encode()
            '{"snapshot-id":7,"topics":{"t":{"id":"id1","partitions":{"0":{"began":0,"skipped":[[10,20,["c1"],1]]}}}},"resets":{"c1":{"snapshot-id":6,"at-ms":1795000000000,"by":"ops","reason":"why"}}}'
            >>> LeftOut.decode(record.encode()) == record
            True
        """
        topics: dict[str, dict[str, Any]] = {}
        for (topic, partition), part in sorted(self.partitions.items()):
            entry = topics.setdefault(topic, {"id": part.topic_id, "partitions": {}})
            fields: dict[str, Any] = {}
            if part.began is not None:
                fields["began"] = part.began
            if part.skipped:
                fields["skipped"] = [
                    [s.start, s.end, list(s.resets), s.merged] for s in part.skipped
                ]
            if part.cut_below is not None:
                fields["cut-below"] = part.cut_below
            entry["partitions"][str(partition)] = fields
        resets = {
            commit: {"snapshot-id": n.snapshot_id, "at-ms": n.at_ms, "by": n.by, "reason": n.reason}
            for commit, n in sorted(self.resets.items())
        }
        return orjson.dumps(
            {"snapshot-id": self.snapshot_id, "topics": topics, "resets": resets}
        ).decode()

    @staticmethod
    def decode(text: str) -> LeftOut:
        """Decode :meth:`encode` output (anything else raises ``ValueError``, ``KeyError``,
        ``TypeError``, ``AttributeError`` or ``IndexError``)."""
        document = orjson.loads(text)
        partitions = {}
        for topic, entry in document["topics"].items():
            for partition, fields in entry["partitions"].items():
                skipped = tuple(
                    Skip(int(a), int(b), tuple(str(r) for r in refs), int(n))
                    for a, b, refs, n in fields.get("skipped", [])
                )
                began, cut = fields.get("began"), fields.get("cut-below")
                partitions[(str(topic), int(partition))] = PartitionLeftOut(
                    str(entry["id"]),
                    None if began is None else int(began),
                    skipped,
                    None if cut is None else int(cut),
                )
        resets = {
            str(commit): ResetNote(
                str(commit), int(n["snapshot-id"]), int(n["at-ms"]), str(n["by"]), str(n["reason"])
            )
            for commit, n in document.get("resets", {}).items()
        }
        return LeftOut(int(document["snapshot-id"]), partitions, resets)

    def describe_skip(self, skip: Skip) -> str:
        """Why ``skip`` is not expected, naming its reset(s) (when, who, why).

        Example:
            >>> note = ResetNote("c1", 6, 1795000000000, "ops", "why")
            >>> LeftOut(7, resets={"c1": note}).describe_skip(Skip(10, 20, ("c1",)))
            "skipped by the offset reset on 2026-11-18 11:06:40 UTC by 'ops' (reason 'why'; ..."
        """
        named = [
            self.resets[c].describe() if c in self.resets else f"commit {c}" for c in skip.resets
        ]
        if skip.merged <= 1 and len(named) == 1:
            return f"skipped by the {named[0]}"
        return f"skipped by {skip.merged} offset resets, among them the {' and the '.join(named)}"


def read_left_out(properties: dict[str, str], group_id: str) -> LeftOut | None:
    """The group's record as the table ``properties`` hold it, whoever wrote it (None: none,
    or unreadable); :func:`find_left_out` says whether it belongs to the head's history."""
    raw = properties.get(LEFT_OUT_PREFIX + group_id)
    if raw is None:
        return None
    try:
        return LeftOut.decode(raw)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None  # not ours, or damaged: nothing is excused by it, and no commit fails on it


def find_left_out(table: Table, group_id: str) -> LeftOut | None:
    """The group's record when it belongs to the head's history (:func:`belongs_to`, against
    the group's committed state); None otherwise (none, a rollback past the commit that wrote
    it, or a writer without it since)."""
    record = read_left_out(table.metadata.properties, group_id)
    if record is None:
        return None
    return record if belongs_to(record, find_committed_state(table, group_id)) else None


def belongs_to(record: LeftOut, state: CommittedState | None) -> bool:
    """Whether ``record`` was written by the commit that is the group's committed ``state``
    (its newest ancestor with the group's offsets, or the proven position, R56): only then is
    every reset it names in the head's history.

    Example:
        >>> from ingestion.table.offsets import CommittedState
        >>> belongs_to(LeftOut(7), CommittedState(7, {}, "c7", None))
        True
        >>> belongs_to(LeftOut(9), CommittedState(7, {}, "c7", None)), belongs_to(LeftOut(7), None)
        (False, False)
    """
    return state is not None and state.snapshot_id == record.snapshot_id


def is_offset_reset(properties: dict[str, str]) -> bool:
    """Whether a snapshot with these properties is an operator's offset reset (``platform
    reset`` or ``rollback``): not a migration, a switch or a failback's completion, which carry
    offsets over without skipping any on purpose.

    Example:
        >>> is_offset_reset({RESET_BY: "ops"}), is_offset_reset({RESET_BY: "o", MIGRATED_FROM: "g"})
        (True, False)
    """
    moved = MIGRATED_FROM in properties or ROUTE_ENDED in properties
    return RESET_BY in properties and not moved and route_of(properties) is None


def amend_left_out(
    base: LeftOut | None,
    snapshot_id: int,
    after: OffsetMap,
    *,
    before: OffsetMap | None = None,
    reset: ResetNote | None = None,
    starts: dict[Key, int] | None = None,
    log_starts: dict[Key, int] | None = None,
    fresh: bool = True,
) -> LeftOut:
    """The record after the commit of ``snapshot_id``, which sets the offsets ``after`` on a
    head whose record is ``base`` (None: none that belongs to it) (pure).

    Per partition of ``after``, under its topic id (facts about another id are dropped): the
    commit's ``starts`` (``kafka.range-starts``) say where reading began; a ``reset`` from the
    offsets ``before`` skips ``[before, after)`` moving forward, and a partition it sets that
    had no offset of that topic id begins there (only when ``fresh``: the group had proven
    offsets, or the table no row, else the history below is not known); every commit cuts what
    lies at or after its new offset (read again); a reset's ``log_starts`` drop what retention
    deleted. Partitions ``after`` does not hold are dropped. Then the bound (module docstring).

    Example:
        >>> from ingestion.table.offsets import TopicOffsets
        >>> at_10, at_20 = {"t": TopicOffsets("id1", {0: 10})}, {"t": TopicOffsets("id1", {0: 20})}
        >>> first = amend_left_out(None, 5, at_10, starts={("t", 0): 0})  # began at 0
        >>> note = ResetNote("c1", 6, 0, "ops", "why")
        >>> skipped = amend_left_out(first, 6, at_20, before=at_10, reset=note)  # 10 -> 20
        >>> skipped.partitions[("t", 0)].began, skipped.partitions[("t", 0)].skipped
        (0, (Skip(start=10, end=20, resets=('c1',), merged=1),))
        >>> at_15, again = {"t": TopicOffsets("id1", {0: 15})}, ResetNote("c2", 8, 0, "ops", "")
        >>> back = amend_left_out(skipped, 8, at_15, before=at_20, reset=again)  # 20 -> 15
        >>> back.partitions[("t", 0)].skipped, sorted(back.resets)
        ((Skip(start=10, end=15, resets=('c1',), merged=1),), ['c1'])
    """
    old_parts = base.partitions if base is not None else {}
    notes = dict(base.resets) if base is not None else {}
    if reset is not None:  # who and why kept to MAX_TEXT characters: the bound
        notes[reset.commit_id] = replace(
            reset, by=_shorten(reset.by), reason=_shorten(reset.reason)
        )
    parts: dict[Key, PartitionLeftOut] = {}
    for topic, offsets in after.items():
        prior_ids = (before or {}).get(topic)
        for partition, offset in offsets.next_offsets.items():
            key = (topic, partition)
            old = old_parts.get(key)
            if old is not None and old.topic_id != offsets.topic_id:
                old = None  # another topic under the name: none of its facts hold
            began = old.began if old else None
            spans = list(old.skipped) if old else []
            cut = old.cut_below if old else None
            start = (starts or {}).get(key)
            if start is not None:
                began = start if began is None else min(began, start)
            if reset is not None:
                same = prior_ids is not None and prior_ids.topic_id == offsets.topic_id
                was = prior_ids.next_offsets.get(partition) if same and prior_ids else None
                if was is None:
                    if fresh:
                        began = offset if began is None else min(began, offset)
                elif offset > was:
                    spans.append(Skip(was, offset, (reset.commit_id,)))
                elif offset < was and began is not None:
                    began = min(began, offset)
            spans = [replace(s, end=min(s.end, offset)) for s in spans if s.start < offset]
            floor = (log_starts or {}).get(key)
            if reset is not None and floor is not None:
                spans = [s for s in spans if s.end > floor]
                cut = None if cut is not None and cut <= floor else cut
            if cut is not None and cut > offset:
                cut = offset
            part = PartitionLeftOut(offsets.topic_id, began, merge_skips(spans), cut)
            if not part.empty:
                parts[key] = part
    parts = _bound(parts)
    used = {c for part in parts.values() for s in part.skipped for c in s.resets}
    return LeftOut(snapshot_id, parts, {c: n for c, n in notes.items() if c in used})


def merge_skips(spans: Iterable[Skip]) -> tuple[Skip, ...]:
    """Merge adjacent or overlapping ranges, each naming at most two of its resets (the
    lowest range's first and the highest's last) and counting them all (pure).

    Example:
        >>> merged = merge_skips([Skip(20, 30, ("b",)), Skip(10, 20, ("a",)), Skip(40, 50, ("c",))])
        >>> [(s.start, s.end, s.resets, s.merged) for s in merged]
        [(10, 30, ('a', 'b'), 2), (40, 50, ('c',), 1)]
    """
    merged: list[Skip] = []
    for span in sorted(spans, key=lambda s: (s.start, s.end)):
        if span.end <= span.start:
            continue
        if merged and span.start <= merged[-1].end:
            last = merged[-1]
            names = tuple(dict.fromkeys((last.resets[0], span.resets[-1])))
            merged[-1] = Skip(last.start, max(last.end, span.end), names, last.merged + span.merged)
        else:
            merged.append(span)
    return tuple(merged)


def _bound(parts: dict[Key, PartitionLeftOut]) -> dict[Key, PartitionLeftOut]:
    """At most :data:`MAX_SPANS` ranges in all: the partition with the most loses its lowest
    range, and its record is cut below that range's end."""
    parts = dict(parts)
    while sum(len(p.skipped) for p in parts.values()) > MAX_SPANS:
        key = max(sorted(parts), key=lambda k: len(parts[k].skipped))
        part = parts[key]
        lowest, rest = part.skipped[0], part.skipped[1:]
        cut = max(part.cut_below or lowest.end, lowest.end)
        parts[key] = replace(part, skipped=rest, cut_below=cut)
    return parts


def record_left_out(
    transaction: Transaction,
    table: Table,
    group_id: str,
    log_starts: dict[Key, int] | None = None,
) -> None:
    """In ``transaction`` on ``table``'s head, whose snapshot with ``group_id``'s offsets is
    staged: set ``kafka.left-out.<group_id>`` to the record after this commit (or remove it
    when it holds nothing), in the same atomic commit (module docstring). The base is the
    record of the head when it belongs to the head's history, for a migration the one of the
    group it migrates from (``kafka.migrated-from``); ``log_starts`` (a reset's) drop what
    retention deleted.

    Retries: a pure function of ``table``'s head and the staged snapshot, so each attempt on a
    reloaded head computes it again from that head; never read from the attempt before.
    """
    snapshot = transaction.table_metadata.current_snapshot()
    assert snapshot is not None, "record_left_out follows the commit's snapshot"
    properties = snapshot_properties(snapshot)
    after = decode_offsets(properties[OFFSETS_PREFIX + group_id])
    source = properties.get(MIGRATED_FROM, group_id)  # a migration carries the old group's on
    starts = decode_starts(properties[RANGE_STARTS]) if RANGE_STARTS in properties else {}
    reset = is_offset_reset(properties)
    key = LEFT_OUT_PREFIX + group_id
    held = LEFT_OUT_PREFIX + source in table.metadata.properties
    if not (held or starts or reset or key in table.metadata.properties):
        return  # nothing to carry, add or remove: no ancestry walk
    state = find_committed_state(table, source)
    base = read_left_out(table.metadata.properties, source) if held else None
    record = amend_left_out(
        base if base is not None and belongs_to(base, state) else None,
        snapshot.snapshot_id,
        after,
        before=state.offsets if state is not None else None,
        reset=note_reset(snapshot.snapshot_id, snapshot.timestamp_ms, properties)
        if reset
        else None,
        starts=starts,
        log_starts=log_starts if reset else None,
        fresh=state is not None or not table_has_rows(table),
    )
    if record.partitions:
        transaction.set_properties({key: record.encode()})
    elif key in table.metadata.properties:
        transaction.remove_properties(key)


def skipped_spans(record: LeftOut, key: Key, topic_id: str) -> list[tuple[Skip, str]]:
    """The ranges of ``key`` (read under ``topic_id``) that ``record`` says resets skipped,
    each with why it is not expected."""
    part = record.partitions.get(key)
    if part is None or part.topic_id != topic_id:
        return []
    return [(skip, record.describe_skip(skip)) for skip in part.skipped]
