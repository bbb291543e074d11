"""Plan a failover of a pipeline to its MirrorMaker 2 replica: where to resume, per partition.

For each source partition the table has offsets for (next offset ``N``):

1. **Nothing ingested** (``N == 0``): the replica partition is read from its log start.
2. **Exact anchor** when the offset syncs are readable (they live on the source cluster by
   default, so often not after a disaster): the newest live sync ``U -> D`` with ``U <= N``
   (syncs before a backward step are dead, as MM2 drops them). If ``U == N`` the replica resumes
   at ``D``; otherwise the table's records after ``U`` (data and quarantine tables) must be the
   replica's records after ``D``, one for one (:func:`~ingestion.dr.align.align_exact`).
3. **Checkpoint** otherwise: the group's newest checkpoint ``U -> D`` (``U <= N``). MM2 translated
   it conservatively, so every replica record before ``D`` is a copy of a record before ``U``,
   which the table holds. The planner takes the last replica record before ``D``, finds the
   table's record with the same identity (Kafka timestamp and key; when several match, the one
   whose successors verify), and from there aligns exactly as in 2. No window, however far
   MM2's sparse syncs put ``D`` back.

The quarantine table is synced first (its rows trail the data commit), so the table's tail is
complete. Nothing is written: the plan is what ``--dry-run`` shows and what the switch commits.
Delivery: each replica partition resumes after the last copy of an ingested record, verified
record by record; when the evidence does not single out one position the plan is refused
(:class:`~ingestion.exceptions.FailoverRefusedError`), never guessed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingestion.dr.align import (
    Alignment,
    RecordId,
    align_exact,
    uncopied_records,
)
from ingestion.dr.mm2 import OffsetSync
from ingestion.dr.replica_check import ReplicaTarget, StampedCheckpoint, newest_checkpoints
from ingestion.dr.replica_reader import Replica
from ingestion.dr.rows import holds_rows, ingested_tail, ingested_tail_where
from ingestion.dr.scanned_rows import Floors, ScannedRows, Scans, scan_rows
from ingestion.exceptions import FailoverRefusedError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from ingestion.spec.pipeline import PipelineSpec

# A failback's way to align from a copy of a record the table holds under the origin's name
# (read before the failover): ingestion.dr.failback.link.
Fallback = Callable[[list["Table"], "Replica", tuple[int, RecordId]], Alignment]


@dataclass(frozen=True)
class PartitionPlan:
    """Where one partition resumes on the replica, and the evidence."""

    source_topic: str
    partition: int
    source_next: int
    replica_topic: str
    replica_topic_id: str
    replica_start: int
    skipped: int
    anchor: str
    uncopied: int = 0  # ingested from the source, never copied (MM2 behind; the source down)
    # Those records as (source offset, timestamp, key digest): ingestion.dr.late_copies.guard
    uncopied_records: tuple[tuple[int, int, str | None], ...] = ()


def live_syncs(syncs: list[OffsetSync]) -> list[OffsetSync]:
    """The syncs after the last backward step of the source offset (MM2's ``OffsetSyncStore``
    drops all earlier ones: the source was truncated or recreated, their mapping is dead).

    Example:
        >>> syncs = [OffsetSync("t", 0, u, d) for u, d in ((0, 0), (50, 50), (10, 60))]
        >>> [s.upstream for s in live_syncs(syncs)]
        [10]
    """
    live: list[OffsetSync] = []
    for sync in syncs:
        if live and sync.upstream < live[-1].upstream:
            live = []
        live.append(sync)
    return live


def locate(
    tables: list[Table],
    key: tuple[str, int],
    record: RecordId,
    until: int,
    cluster: str | None = None,
) -> list[int]:
    """Source offsets below ``until`` of the table's records with ``record``'s identity (read
    on ``cluster``, if given)."""
    stamp = record.timestamp_ms
    near = ingested_tail_where(
        tables,
        key,
        f"_kafka_timestamp >= '{_iso(stamp)}' AND _kafka_timestamp <= '{_iso(stamp)}'",
        cluster,
    )
    return [offset for offset, found in near if offset < until and found.matches(record)]


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")


def _verified(
    tables: list[Table],
    replica: Replica,
    key: tuple[str, int],
    after: tuple[int, int],
    source_next: int,
    replica_topic: str,
    where: str,
    source_down: bool = False,
    cluster: str | None = None,
    scanned: ScannedRows | None = None,
) -> Alignment:
    """Align from a known pair: source offset ``after[0]`` was copied to replica ``after[1]``
    (``source_down``: see :func:`~ingestion.dr.align.align_exact`; ``cluster``: the
    source's rows only; ``scanned``: the topic's rows read once for the plan, if any)."""
    tail = scanned.window(key[1], after[0] + 1, source_next) if scanned is not None else None
    if tail is None:
        tail = ingested_tail(tables, key[0], key[1], after[0] + 1, source_next, cluster)
    count = sys.maxsize if source_down else len(tail) + 1  # to the end: later copies refuse
    copies, end = replica.read(replica_topic, key[1], after[1] + 1, count)
    aligned = align_exact([r for _, r in tail], copies, end, where, source_down)
    if aligned.uncopied:
        uncopied = uncopied_records(tail[len(tail) - aligned.uncopied :])
        return dataclasses.replace(aligned, uncopied_records=uncopied)
    return aligned


def plan_partition(
    tables: list[Table],
    replica: Replica,
    key: tuple[str, int],
    source_next: int,
    replica_topic: str,
    syncs: list[OffsetSync],
    checkpoint: StampedCheckpoint | None,
    fallback: Fallback | None = None,
    source_down: bool = False,
    cluster: str | None = None,
    scanned: ScannedRows | None = None,
) -> tuple[Alignment, str]:
    """Where ``key`` resumes on the replica, and how that was established (module docstring).

    ``fallback`` (a failback) aligns from an anchor whose record the table holds under the
    origin topic's name rather than ``key``'s (it was read before the failover). ``cluster``:
    read only the table's rows of the source cluster (``ingestion.dr.cluster_rows``); ``scanned``:
    the rows of ``key``'s topic read once for the plan (``ingestion.dr.rows``), if any."""
    topic, partition = key
    where = f"{topic}[{partition}] -> {replica_topic}[{partition}]"

    def verify(pair: tuple[int, int]) -> Alignment:
        args = (source_next, replica_topic, where, source_down, cluster, scanned)
        return _verified(tables, replica, key, pair, *args)

    usable = [s for s in live_syncs(syncs) if s.upstream <= source_next]
    if source_next == 0:
        low, _ = replica.watermarks(replica_topic, partition)
        return Alignment(low, 0), "nothing ingested from this partition: the replica's log start"
    if usable:
        anchor = max(usable, key=lambda s: s.upstream)
        how = f"offset sync {anchor.upstream} -> {anchor.downstream}"
        if anchor.upstream == source_next:
            return Alignment(anchor.downstream, 0), how
        pair = (anchor.upstream, anchor.downstream)
        up_to = f"_kafka_offset <= {anchor.upstream}"
        held = scanned.holds_until(partition, anchor.upstream) if scanned is not None else None
        if fallback is not None and not (held or holds_rows(tables, key, up_to, cluster)):
            # the anchor is before the failover's start
            copy, _ = replica.read(replica_topic, partition, anchor.downstream, 1)
            if copy and copy[0][0] == anchor.downstream:
                return fallback(tables, replica, copy[0]), f"{how}, read before the failover"
        return verify(pair), how
    if checkpoint is None:
        raise FailoverRefusedError(
            f"{where}: no offset sync is readable and the group has no checkpoint for this "
            "partition: MM2 cannot place the group on the replica (see the replica check's "
            "findings); nothing was changed"
        )
    c = checkpoint.checkpoint
    if c.upstream > source_next:
        raise FailoverRefusedError(
            f"{where}: the checkpoint says group offset {c.upstream}, ahead of the table's "
            f"{source_next}: something other than this platform moved the group; nothing was "
            "changed"
        )
    before = replica.last_record_before(replica_topic, partition, c.downstream)
    if before is None:
        raise FailoverRefusedError(
            f"{where}: the replica holds no record before checkpoint offset {c.downstream}, so "
            "no copy ties it to the table; fail over while the offset syncs are readable, or "
            "reset the pipeline's offsets on the replica explicitly; nothing was changed"
        )
    offset, record = before
    matches = locate(tables, key, record, source_next, cluster)
    if fallback is not None and not matches:
        how = (
            f"checkpoint {c.upstream} -> {c.downstream}; replica {offset} read before the failover"
        )
        return fallback(tables, replica, before), how
    how = f"checkpoint {c.upstream} -> {c.downstream}; replica {offset} = source"
    if len(matches) == 1:  # the usual case: its refusal, if any, says exactly what is wrong
        pair = (matches[0], offset)
        aligned = verify(pair)
        return aligned, f"{how} {matches[0]}"
    found: list[tuple[Alignment, int]] = []
    for source_offset in matches:
        try:
            pair = (source_offset, offset)
            aligned = verify(pair)
        except FailoverRefusedError:
            continue
        found.append((aligned, source_offset))
    if len({aligned.start for aligned, _ in found}) == 1 and len(found) > 1:
        # Records repeat around the anchor (a keyless burst in one millisecond), but every
        # reading puts the replica at the same resume offset, the only thing committed.
        aligned, source_offset = found[0]
        return aligned, (
            f"checkpoint {c.upstream} -> {c.downstream}; replica {offset} = one of "
            f"{len(found)} repeated source records, all resuming at {aligned.start}"
        )
    if len(found) != 1:
        seen = "no record" if not matches else f"{len(matches)} record(s) at {matches}"
        raise FailoverRefusedError(
            f"{where}: replica offset {offset} (before checkpoint offset {c.downstream}) matches "
            f"{seen} of the table, and {len(found)} of them continue like the replica: the "
            "replica is not a copy of what the table ingested, or records repeat (same "
            "timestamp and key); nothing was changed"
        )
    ((aligned, source_offset),) = found
    return (
        aligned,
        f"checkpoint {c.upstream} -> {c.downstream}; replica {offset} = source {source_offset}",
    )


def plan_failover(
    catalog: Catalog,
    spec: PipelineSpec,
    offsets: dict[tuple[str, int], int],
    target: ReplicaTarget,
    checkpoints: list[StampedCheckpoint],
    syncs: dict[tuple[str, int], list[OffsetSync]],
    replica_topics: dict[str, str],
    fallbacks: dict[tuple[str, int], Fallback] | None = None,
    source_down: bool = False,
    cluster: str | None = None,
    scan_from: dict[str, Floors] | None = None,
    scans: Scans | None = None,
) -> list[PartitionPlan]:
    """A plan for every partition in ``offsets`` (the table's next offsets of the group);
    ``fallbacks`` per partition: see :func:`plan_partition`. ``source_down``: the source
    cluster does not answer, so MM2 copies nothing more while the plan holds, and a table ahead
    of the replica is accepted (:func:`~ingestion.dr.align.align_exact`). ``cluster``:
    the source cluster's name, to read only its rows (None: every row of the topic names).
    ``scan_from``: per source topic, the offsets per partition from which the table's rows are
    read once for the whole plan (a failback: the failover's starts), instead of once per
    partition, kept in ``scans`` for the rest of the plan (``ingestion.dr.scanned_rows``).

    The quarantine table is synced first (no Kafka needed): its rows trail the data commits,
    and a record missing from the tail would be read again on the replica.
    """
    from ingestion.quarantine.sync import sync_quarantine, unsynced_snapshot_ids

    sync_quarantine(catalog, spec)
    tables = [catalog.load_table(spec.table)]
    if spec.quarantine_table and catalog.table_exists(spec.quarantine_table):
        quarantine = catalog.load_table(spec.quarantine_table)
        if unsynced_snapshot_ids(tables[0], quarantine):
            raise FailoverRefusedError(
                f"pipeline {spec.name!r}: the quarantine table {spec.quarantine_table} is behind "
                "the data table; run `platform maintain` (it syncs it) and plan again"
            )
        tables.append(quarantine)
    replica = Replica(target.kafka_config)
    newest = newest_checkpoints(checkpoints, spec.consumer_group_id)
    ids = {topic: replica.topic_id(topic) for topic in set(replica_topics.values())}
    scanned = {
        t: scan_rows(tables, t, floors, cluster, scans) for t, floors in (scan_from or {}).items()
    }
    plans = []
    for key in sorted(offsets):
        copy = replica_topics[key[0]]
        aligned, how = plan_partition(
            tables,
            replica,
            key,
            offsets[key],
            copy,
            syncs.get(key, []),
            newest.get((copy, key[1])),
            (fallbacks or {}).get(key),
            source_down,
            cluster,
            scanned.get(key[0]),
        )
        plans.append(
            PartitionPlan(
                key[0],
                key[1],
                offsets[key],
                copy,
                ids[copy],
                aligned.start,
                aligned.skipped,
                how,
                aligned.uncopied,
                aligned.uncopied_records,
            )
        )
    return plans
