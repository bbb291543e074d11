"""Failback to the pipeline's own cluster: where each origin topic resumes (the RPO tail).

MirrorMaker 2 copies asynchronously: when the primary went down, its ``orders`` may have held
records MM2 had not copied yet. The failover (``ingestion.failover``) moved the pipeline to the
replica's copy, which lacks them. When the primary is back they are still in ``orders``, after
the position the table had committed there before the failover (``N``, recorded in the
failover switch's plan) and after the records whose copies the table ingested on the replica.
A failback to the primary therefore reads the origin topics again, next to the reverse copies
(``docs/reliability.md``, R49).

Per origin partition: the origin's records from ``N`` are aligned, in order, with the replica
copy from the failover's start position to the replica's end now (Kafka timestamp and key, as
``ingestion.failover_align`` does): the table's rows up to where it read, then the records in
Kafka on the replica, which the reverse copy delivers after the failback
(``ingestion.failback_copies``: MM2's forward flow may have copied tail records there after the
failover). The records with a copy form a prefix (MM2 copies in order) and the first one without
is the start of the unreplicated tail, read from there exactly once. Refused
(:class:`~ingestion.exceptions.FailoverRefusedError`, nothing changed) when the evidence
contradicts: the origin topic was recreated or truncated below ``N`` by retention, its record
before ``N`` is not the one the table holds, a record after the first uncopied one has a copy,
or the replica does not answer. Reads only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ingestion.exceptions import FailoverRefusedError
from ingestion.failback_copies import replica_copies
from ingestion.failover import Records, Replica, ingested_tail_where
from ingestion.failover_align import RecordId
from ingestion.offsets import (
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    OffsetMap,
    decode_offsets,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.ranges import Key
from ingestion.route_state import REPLACED_SNAPSHOT, SWITCH_SNAPSHOT, active_switch

if TYPE_CHECKING:
    from pyiceberg.table import Table

FAILOVER_PLAN = "kafka.failover-plan"  # the switch's per-partition plan (ingestion.failover_commit)


@dataclass(frozen=True)
class OriginPlan:
    """Where one origin partition resumes after a failback, and the evidence."""

    topic: str
    partition: int
    topic_id: str
    committed_before: int  # the table's next offset there before the failover
    resume: int
    copies_ingested: int  # origin records from committed_before the table ingested as copies
    tail: int  # records from resume to the origin's end when planned (the unreplicated tail)
    replica_topic: str
    replica_start: int
    copies_pending: int  # origin records copied to the replica, not ingested yet (reverse copy)
    replica_end: int  # the replica partition's end when planned (recheck_copies)


@dataclass(frozen=True)
class UndoneSwitch:
    """The failover a failback undoes: its snapshot, plan and the offsets it replaced."""

    snapshot_id: int
    plans: list[dict[str, Any]]
    offsets_before: OffsetMap | None


def find_switch(table: Table, group_id: str, replica: str) -> UndoneSwitch | None:
    """The newest switch of ``group_id`` to ``replica``: by the ids the active route carries
    (expiry keeps those two snapshots, not the history between them), else in the ancestry."""
    key = OFFSETS_PREFIX + group_id
    route = active_switch(table, group_id)
    if route is not None and route.get(FAILOVER_TO) == replica and SWITCH_SNAPSHOT in route:
        switch = table.metadata.snapshot_by_id(int(route[SWITCH_SNAPSHOT]))
        replaced = (
            table.metadata.snapshot_by_id(int(route[REPLACED_SNAPSHOT]))
            if REPLACED_SNAPSHOT in route
            else None
        )
        if switch is not None:
            text = snapshot_properties(replaced).get(key) if replaced is not None else None
            plans = orjson.loads(snapshot_properties(switch).get(FAILOVER_PLAN, "[]"))
            offsets = decode_offsets(text) if text is not None else None
            return UndoneSwitch(switch.snapshot_id, list(plans), offsets)
    ancestry = list(iter_ancestry(table))
    for index, snapshot in enumerate(ancestry):
        properties = snapshot_properties(snapshot)
        if properties.get(GROUP_ID) != group_id or properties.get(FAILOVER_TO) != replica:
            continue
        before = next(
            (snapshot_properties(s)[key] for s in ancestry[index + 1 :] if key in
             snapshot_properties(s)),
            None,
        )  # fmt: skip
        plans = orjson.loads(properties.get(FAILOVER_PLAN, "[]"))
        offsets = decode_offsets(before) if before is not None else None
        return UndoneSwitch(snapshot.snapshot_id, list(plans), offsets)
    return None


def split_tail(
    origin: Sequence[tuple[int, RecordId]],
    copies: Sequence[tuple[int, RecordId]],
    origin_end: int,
    where: str,
) -> tuple[int, list[int]]:
    """The origin offset where the unreplicated tail starts, and the replica offsets of the
    copies of the origin records before it.

    ``origin`` is the origin partition's records from the pre-failover position, ``copies``
    the replica copy from the failover's start (``ingestion.failback_copies``), both in offset
    order. The copied records are a prefix of ``origin`` whose copies appear in ``copies`` in
    the same order (other records were produced on the replica); a record after that prefix
    with a copy contradicts the order MM2 copies in: refused.

    Example:
        >>> ids = [RecordId(t, b"k") for t in (1, 2, 3, 9)]
        >>> split_tail([(5, ids[0]), (6, ids[1]), (7, ids[2])], [(40, ids[0]), (41, ids[3]),
        ...     (42, ids[1])], 8, "p")
        (7, [40, 42])
    """
    positions: dict[tuple[int, bytes | None], list[int]] = {}
    for position, (_, record) in enumerate(copies):
        positions.setdefault((record.timestamp_ms, record.key), []).append(position)
    last, matched = -1, []
    for _, record in origin:
        after = [p for p in positions.get((record.timestamp_ms, record.key), []) if p > last]
        if not after:
            break
        last = after[0]
        matched.append(copies[last][0])
    for offset, record in origin[len(matched) :]:
        found = positions.get((record.timestamp_ms, record.key))
        if found:
            raise FailoverRefusedError(
                f"{where}: origin offset {offset} has a copy on the replica (offset "
                f"{copies[found[0]][0]}) although origin offset {origin[len(matched)][0]} before "
                "it has none: the copies are not in the origin's order (records repeat with "
                "the same timestamp and key, or the replica is not a copy of this topic), so "
                "the unreplicated tail cannot be told apart. Nothing was changed; the pipeline "
                "keeps reading the replica. Inspect both partitions from these offsets."
            )
    resume = origin[len(matched)][0] if len(matched) < len(origin) else origin_end
    return resume, matched


def _refuse(where: str, what: str) -> FailoverRefusedError:
    return FailoverRefusedError(
        f"{where}: {what}; the unreplicated tail cannot be placed. Nothing was changed: the "
        "pipeline keeps reading the replica"
    )


def _check_anchor(tables: list[Table], reader: Replica, key: Key, before: int, where: str) -> None:
    """The table's last record of ``key`` below ``before`` is still the origin's record at
    that offset (the origin was not recreated or rewritten since it was read)."""
    span = 16
    while True:
        low = max(0, before - span)
        rows = ingested_tail_where(
            tables, key, f"_kafka_offset >= {low} AND _kafka_offset < {before}"
        )
        if rows or low == 0:
            break
        span *= 4
    if not rows:
        return
    offset, mine = rows[-1]
    start, _ = reader.watermarks(*key)
    if offset < start:
        return  # retention deleted it; the position itself is still in the log
    found, _ = reader.read(key[0], key[1], offset, 1)
    if not found or found[0][0] != offset or not found[0][1].matches(mine):
        theirs = found[0] if found else "nothing"
        raise _refuse(
            where,
            f"the table's record at origin offset {offset} ({mine}) is not the origin's "
            f"({theirs}): the topic was recreated or rewritten since the failover",
        )


def plan_origin_partition(
    tables: list[Table],
    reader: Replica,
    replica: Replica,
    entry: dict[str, Any],
    replica_next: int,
    pipeline: str,
) -> OriginPlan:
    """Where one origin partition resumes; ``entry`` is its line of the failover's plan,
    ``replica_next`` the table's next offset of its replica copy now, ``reader`` reads the
    primary and ``replica`` the replica cluster."""
    topic, partition = str(entry["source_topic"]), int(entry["partition"])
    before, copy, start = int(entry["source_next"]), entry["replica_topic"], entry["replica_start"]
    where = f"pipeline {pipeline!r}: failback of origin {topic}[{partition}] (offset {before})"
    if copy == topic and start < before:
        raise _refuse(
            where,
            f"the replica copy has the origin's name and the table read offsets {start}.."
            f"{before} of it on both clusters (rows do not record the cluster)",
        )
    low, high = reader.watermarks(topic, partition)
    if low > before:
        raise _refuse(
            where,
            f"the origin's log starts at {low}: retention deleted offsets {before}..{low - 1}, "
            "which may hold records never copied",
        )
    if high < before:
        raise _refuse(where, f"the origin ends at {high}: it was truncated or recreated")
    _check_anchor(tables, reader, (topic, partition), before, where)
    origin: Records = (
        reader.read(topic, partition, before, high - before)[0] if high > before else []
    )
    copies, end = replica_copies(tables, replica, (copy, partition), start, replica_next, where)
    resume, matched = split_tail(origin, copies, high, where)
    tail = sum(1 for offset, _ in origin if offset >= resume)
    pending = sum(1 for offset in matched if offset >= replica_next)
    return OriginPlan(
        topic, partition, "", before, resume, len(matched) - pending, tail, copy, int(start),
        pending, end,
    )  # fmt: skip


def plan_origin(
    tables: list[Table],
    reader: Replica,
    replica: Replica,
    switch: UndoneSwitch,
    origins: list[str],
    replica_next: dict[Key, int],
    pipeline: str,
) -> list[OriginPlan]:
    """A plan for every partition of the ``origins`` topics the undone failover moved
    (``reader`` reads the primary, ``replica`` the replica cluster the failback leaves)."""
    plans: list[OriginPlan] = []
    for topic in origins:
        entries = [e for e in switch.plans if e.get("source_topic") == topic]
        if not entries:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: the failover in snapshot {switch.snapshot_id} did not "
                f"record a position for origin topic {topic!r}, so its unreplicated tail cannot "
                "be placed; nothing was changed"
            )
        try:
            topic_id = reader.topic_id(topic)
        except FailoverRefusedError as exc:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: origin topic {topic!r} on the primary cannot be "
                f"described ({exc}); nothing was changed"
            ) from exc
        recorded = (switch.offsets_before or {}).get(topic)
        if recorded is not None and recorded.topic_id != topic_id:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: origin topic {topic!r} has id {topic_id}, the table read "
                f"id {recorded.topic_id} before the failover: it was deleted and recreated, its "
                "unreplicated tail is gone. Nothing was changed; decide with the producers' "
                "owners what the table must hold, then fail back"
            )
        for entry in sorted(entries, key=lambda e: int(e["partition"])):
            key = (str(entry["replica_topic"]), int(entry["partition"]))
            at = replica_next.get(key, int(entry["replica_start"]))
            plan = plan_origin_partition(tables, reader, replica, entry, at, pipeline)
            plans.append(OriginPlan(**{**plan.__dict__, "topic_id": topic_id}))
    return plans
