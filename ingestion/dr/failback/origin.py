"""Failback to the pipeline's own cluster: where each origin topic resumes (the RPO tail).

MirrorMaker 2 copies asynchronously: when the primary went down, its ``orders`` may have held
records MM2 had not copied yet. The failover (``ingestion.dr.failover``) moved the pipeline to the
replica's copy, which lacks them. When the primary is back they are still in ``orders``, after
the position the table had committed there before the failover (``N``, recorded in the
failover switch's plan) and after the records whose copies the table ingested on the replica.
A failback to the primary therefore reads the origin topics again, next to the reverse copies
(``docs/reliability.md``, R49).

Every partition the origin topic has now is planned. One the failover's plan lacks (added to the
origin after the table's last commit there) has ``N`` = its log start: the table read none of it
on the primary, and what the route read of its copy on the replica is aligned like the others
(no copy partition on the replica: everything in it is tail).

Per origin partition: the origin's records from ``N`` are aligned, in order, with the replica
copy from the failover's start position to the replica's end now
(:func:`~ingestion.dr.align.split_tail`): the records still in Kafka there, ingested or not
(the reverse copy delivers those not ingested; MM2's forward flow may have copied tail records
there after the failover), compared byte for byte (timestamp, key, value and headers), and the
table's rows where retention deleted them (timestamp and key). MM2's newest forward offset sync
``U -> D`` at or after ``N`` (``mm2-offset-syncs.<target_alias>.internal`` on the primary, when
the replica names its ``target_alias``) pins the prefix up to ``U``. The records with a copy form
a prefix (MM2 copies in order) and the first one without is the start of the unreplicated tail,
read from there exactly once. Never a guess: refused
(:class:`~ingestion.exceptions.FailoverRefusedError`, nothing changed) when the evidence
contradicts or does not single out the position: the origin topic was recreated or truncated
below ``N`` by retention, its record before ``N`` is not the one the table holds, a record after
the first uncopied one has a copy, a match by timestamp and key alone repeats, the sync is not
borne out by the records, or the replica does not answer (unless the operator asserts it is
lost: ``ingestion.dr.failback.lost``).

Under MM2's ``identity`` naming the replica copy has the origin's name, and after a
``--source-lost`` failover the table read offsets of it on both clusters: the origin's rows are
then the ones recording ``primary`` (or null), the copy's those recording the replica
(``_kafka_cluster``, ``ingestion.dr.cluster_rows``). Refused while rows written before that column
leave them ambiguous. Reads only; retrying is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ingestion.dr.align import split_tail
from ingestion.dr.failback.copies import copy_exists, replica_copies
from ingestion.dr.failback.lost import LostReplica
from ingestion.dr.failover import live_syncs
from ingestion.dr.mm2 import OffsetSync
from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import Records, ingested_tail_where
from ingestion.dr.scanned_rows import Floors, ScannedRows, Scans, scan_rows
from ingestion.exceptions import FailoverRefusedError
from ingestion.kafka.ranges import Key
from ingestion.table.offsets import (
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    OffsetMap,
    decode_offsets,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.route import REPLACED_SNAPSHOT, SWITCH_SNAPSHOT, active_switch
from ingestion.table.schema import PRIMARY

if TYPE_CHECKING:
    from pyiceberg.table import Table

FAILOVER_PLAN = "kafka.failover-plan"  # the switch's per-partition plan (ingestion.dr.switch)


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
    anchor: str = ""  # MM2's forward offset sync that pinned the copied prefix, if any
    in_plan: bool = True  # False: the failover's plan lacked it (N is the origin's log start)


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
            (
                snapshot_properties(s)[key]
                for s in ancestry[index + 1 :]
                if key in snapshot_properties(s)
            ),
            None,
        )
        plans = orjson.loads(properties.get(FAILOVER_PLAN, "[]"))
        offsets = decode_offsets(before) if before is not None else None
        return UndoneSwitch(snapshot.snapshot_id, list(plans), offsets)
    return None


def _refuse(where: str, what: str) -> FailoverRefusedError:
    return FailoverRefusedError(
        f"{where}: {what}; the unreplicated tail cannot be placed. Nothing was changed: the "
        "pipeline keeps reading the replica"
    )


def _check_anchor(
    tables: list[Table],
    reader: Replica,
    key: Key,
    before: int,
    where: str,
    cluster: str | None = None,
) -> None:
    """The table's last record of ``key`` below ``before`` (read on ``cluster``, if given) is
    still the origin's record at that offset (the origin was not recreated or rewritten since
    it was read)."""
    span = 16
    while True:
        low = max(0, before - span)
        rows = ingested_tail_where(
            tables, key, f"_kafka_offset >= {low} AND _kafka_offset < {before}", cluster
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


def _anchor(syncs: list[OffsetSync], before: int, high: int) -> tuple[int, int] | None:
    """MM2's newest live forward offset sync ``U -> D`` with ``before <= U < high``."""
    usable = [s for s in live_syncs(syncs) if before <= s.upstream < high]
    newest = max(usable, key=lambda s: s.upstream, default=None)
    return None if newest is None else (newest.upstream, newest.downstream)


def plan_origin_partition(
    tables: list[Table],
    reader: Replica,
    replica: Replica | LostReplica,
    entry: dict[str, Any],
    replica_next: int | None,
    pipeline: str,
    syncs: list[OffsetSync] | None = None,
    replica_cluster: str | None = None,
    ambiguous: list[int] | None = None,
    copy_rows: ScannedRows | None = None,
) -> OriginPlan:
    """Where one origin partition resumes; ``entry`` is its line of the failover's plan (with
    ``"in_plan": False`` and no ``source_next`` for a partition the plan lacks),
    ``replica_next`` the table's next offset of its replica copy now (None: it has none),
    ``reader`` reads the primary, ``replica`` the replica cluster (a :class:`LostReplica`
    after ``--source-lost``: ``ingestion.dr.failback.lost``), ``syncs`` are MM2's forward
    offset syncs of this partition (on the primary). ``replica_cluster``: the replica's name
    when the rows tell the two clusters apart (``ingestion.dr.cluster_rows.labelled_cluster``):
    the origin's rows are then the primary's, the copy's the replica's, even under one name;
    ``ambiguous``: the offsets whose rows do not (written before ``_kafka_cluster``);
    ``copy_rows``: the table's rows of the replica copy's topic, when already scanned
    (:func:`copy_partitions`; a window they do not cover is scanned alone)."""
    topic, partition = str(entry["source_topic"]), int(entry["partition"])
    copy, start = str(entry["replica_topic"]), int(entry["replica_start"])
    planned = bool(entry.get("in_plan", True))
    low, high = reader.watermarks(topic, partition)
    before = int(entry["source_next"]) if planned else low
    where = f"pipeline {pipeline!r}: failback of origin {topic}[{partition}] (offset {before})"
    same_name = copy == topic and replica_cluster is not None
    if planned and copy == topic and start < before and not same_name:
        raise _refuse(
            where,
            f"the replica copy has the origin's name and the table read offsets {start}.."
            f"{before} of it on both clusters, and its rows do not tell the clusters apart "
            + (
                f"(rows at offsets {ambiguous[:5]} were written before the _kafka_cluster column)"
                if ambiguous
                else "(rows written before the _kafka_cluster column)"
            ),
        )
    origin_cluster = PRIMARY if same_name else None
    copy_cluster = replica_cluster if same_name else None
    if low > before:
        raise _refuse(
            where,
            f"the origin's log starts at {low}: retention deleted offsets {before}..{low - 1}, "
            "which may hold records never copied",
        )
    if high < before:
        raise _refuse(where, f"the origin ends at {high}: it was truncated or recreated")
    if planned:  # else the table read none of it on the primary
        _check_anchor(tables, reader, (topic, partition), before, where, origin_cluster)
    origin: Records = (
        reader.read(topic, partition, before, high - before)[0] if high > before else []
    )
    key = (copy, partition)
    copies: Records
    anchor = _anchor(syncs or [], before, high)
    if isinstance(replica, LostReplica):  # --source-lost: the table and the reverse copy
        replica_next = start if replica_next is None else replica_next
        copies, end = replica.copies(
            tables, key, start, replica_next, where, copy_cluster, copy_rows
        )
        anchor = anchor if replica.usable_anchor(anchor, replica_next) else None
    elif planned or copy_exists(replica, key, where):
        if replica_next is None:  # nothing ingested there: the reverse copy reads it all
            replica_next = start if planned else replica.watermarks(*key)[0]
        copies, end = replica_copies(
            tables, replica, key, start, replica_next, where, copy_cluster, copy_rows
        )
    else:
        copies, end, replica_next = [], 0, 0
    resume, matched = split_tail(origin, copies, high, where, anchor)
    tail = sum(1 for offset, _ in origin if offset >= resume)
    pending = sum(1 for offset in matched if offset >= replica_next)
    how = f"offset sync {anchor[0]} -> {anchor[1]}" if anchor else ""
    return OriginPlan(
        topic,
        partition,
        "",
        before,
        resume,
        len(matched) - pending,
        tail,
        copy,
        start,
        pending,
        end,
        how,
        planned,
    )


def copy_partitions(
    tables: list[Table],
    topic: str,
    copy: str,
    floors: Floors,
    replica_cluster: str | None,
    scans: Scans | None = None,
) -> ScannedRows:
    """The table's rows of the replica ``copy`` of origin ``topic`` from ``floors`` on (per
    partition in the failover's plan, its start there): one scan per table for the whole
    topic, where each partition's :func:`~ingestion.dr.failback.copies.replica_copies` would scan
    again; read on the replica when the copy has the origin's name and the rows tell the
    clusters apart, as :func:`plan_origin_partition` reads them; ``scans``: the plan's scans
    (the failback's alignment read the same rows). A partition the failover's plan lacks is
    not scanned here: it is read from offset 0, by itself (``ingestion.dr.scanned_rows``)."""
    cluster = replica_cluster if copy == topic and replica_cluster is not None else None
    return scan_rows(tables, copy, floors, cluster, scans)


def plan_origin(
    tables: list[Table],
    reader: Replica,
    replica: Replica | LostReplica,
    switch: UndoneSwitch,
    origins: list[str],
    replica_next: dict[Key, int],
    pipeline: str,
    syncs: dict[Key, list[OffsetSync]] | None = None,
    replica_cluster: str | None = None,
    ambiguous: dict[Key, list[int]] | None = None,
    scans: Scans | None = None,
) -> list[OriginPlan]:
    """A plan for every partition the ``origins`` topics have now (``reader`` reads the
    primary, ``replica`` the replica cluster the failback leaves; ``syncs``: MM2's forward
    offset syncs per origin partition, read on the primary, {} when unreadable;
    ``replica_cluster`` and ``ambiguous``: see :func:`plan_origin_partition`)."""
    plans: list[OriginPlan] = []
    for topic in origins:
        entries = {int(e["partition"]): e for e in switch.plans if e.get("source_topic") == topic}
        if not entries:
            raise FailoverRefusedError(
                f"pipeline {pipeline!r}: the failover in snapshot {switch.snapshot_id} did not "
                f"record a position for origin topic {topic!r}, so its unreplicated tail cannot "
                "be placed; nothing was changed"
            )
        try:
            topic_id, partitions = reader.describe(topic)
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
        copy = str(next(iter(entries.values()))["replica_topic"])
        every = sorted(set(partitions) | set(entries))
        floors = {p: int(e["replica_start"]) for p, e in entries.items()}
        rows = copy_partitions(tables, topic, copy, floors, replica_cluster, scans)
        for partition in every:
            entry = entries.get(partition) or {
                "source_topic": topic,
                "partition": partition,
                "replica_topic": copy,
                "replica_start": 0,
                "in_plan": False,
            }
            at = replica_next.get((str(entry["replica_topic"]), partition))
            plan = plan_origin_partition(
                tables,
                reader,
                replica,
                entry,
                at,
                pipeline,
                (syncs or {}).get((topic, partition)),
                replica_cluster,
                (ambiguous or {}).get((topic, partition)),
                rows,
            )
            plans.append(OriginPlan(**{**plan.__dict__, "topic_id": topic_id}))
    return plans
