"""The production oracle, incremental (R45-R47): every commit since a cursor, against Kafka.

The expected set in production is an independent ``read_committed`` recount of each committed
offset range (docs/reliability.md, the oracle). For every snapshot after the cursor (the last
snapshot already audited), oldest first:

- an ingestion commit of the group: its offsets never go down nor drop a partition; the rows
  its own files add lie in its ranges, once each; and its snapshot summary's ``added-records``
  plus its ``kafka.quarantined`` (and the MM2 late copies it skipped, ``kafka.late-copies``:
  ``ingestion.task.spec``) equal the visible records Kafka holds in its ranges. A range
  starts at the previous commit's offset; for a partition absent from it (a new partition or
  topic, or the group's first commit) at the start recorded in ``kafka.range-starts``; after a
  range recorded in ``kafka.lost-ranges``, at the end of that range. Where the start is not
  known (commits older than ``kafka.range-starts``) or Kafka no longer holds the start
  (retention), the recount starts at the log start and only a commit that added fewer records
  than Kafka still holds is flagged: no false alarm either way;
- an operator's rewind: the rows at or after each rewound offset are gone in that snapshot;
- a compaction: it adds as many records as it deletes (``replace`` or our compaction's
  marker: :func:`ingestion.audit.snapshots.check_maintenance`);
- commits another tool expired before they were audited (R56: the cursor's snapshot is gone,
  ``cursor_offsets`` remembers where it stood): the ranges from the cursor's offsets to those of
  the oldest commit left (or the position the table property keeps) are audited as one: the
  rows the head holds there (and the quarantine table's) once each, as many as Kafka's visible
  records (:func:`audit_gap`), but for the ranges an operator's forward reset among them
  skipped, which the table's record of what the group's reads left out names
  (``kafka.left-out.<group>``, :mod:`ingestion.table.left_out`);
- any other snapshot that adds or deletes rows, or commits another group's offsets: a writer
  outside the pipeline.

Cost: metadata of the new snapshots, the rows of their own files, and a recount of their
ranges, at most ``max_offsets`` per evaluation (the rest is the backlog: ``pending`` commits,
``backlog_offsets``, ``oldest_unaudited_ms``): O(new commits). Without a cursor only the newest
commits within that budget are audited; the full audit (``ingestion.audit.oracle.audit_table`` plus
this over every commit) is available on demand. The cursor moves only over snapshots audited
clean: not past a snapshot with a finding (a failure stays visible), nor past a commit whose
recount failed (Kafka unreachable, a read error: ``unrecounted``); the evaluation stops there
and the next one retries it (R47).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.audit.recount import plan_recount
from ingestion.audit.snapshots import (
    CommitAudit,
    check_count,
    check_other,
    check_rewind,
    check_rows,
)
from ingestion.kafka.consumer import iter_batches, open_consumer
from ingestion.kafka.ranges import Key, OffsetRange
from ingestion.table.left_out import belongs_to, is_offset_reset, read_left_out, skipped_spans
from ingestion.table.offsets import (
    COMMIT_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    RESET_BY,
    decode_offsets,
    find_committed_state,
    flatten,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.route import route_of
from ingestion.table.schema import CLUSTER_COLUMN, PRIMARY, labels_cluster

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


MAX_RECOUNT_ATTEMPTS = 6
"""Evaluations in a row a commit may fail to be recounted before the audit fails (ERROR): 30
minutes at ``run_checks_every_5_minutes``; before that each failure is a WARN, retried."""
BACKLOG_BOUND_SECONDS = 1800
"""The audit WARNs when its oldest unaudited commit is older than this (it falls behind), or
when its backlog exceeds one evaluation's budget (the next one cannot clear it)."""


@dataclass(frozen=True)
class AuditMemory:
    """What one evaluation of the audit leaves for the next (kept in the check's metadata):
    where to start (``cursor``), and the commit it could not recount with the number of
    evaluations in a row that failed to (``attempts``)."""

    cursor: int | None = None
    unrecounted_snapshot: int | None = None
    attempts: int = 0
    group: str | None = None  # the consumer group audited (a cursor under another says nothing)
    cursor_offsets: dict[Key, int] | None = None  # the group's offsets at the cursor (R56)


def _log_starts(
    kafka_config: dict[str, Any], keys: set[Key], role: str, timeout_s: float
) -> dict[Key, int]:
    """Each partition's log start now (a partition Kafka cannot describe is left out: its
    recount then starts at offset 0, and fails or is a lower bound)."""
    from confluent_kafka import KafkaException, TopicPartition

    starts = {}
    with open_consumer(kafka_config, role) as consumer:
        for key in sorted(keys):
            try:
                found = consumer.get_watermark_offsets(TopicPartition(*key), timeout=timeout_s)
                starts[key] = found[0]
            except KafkaException:
                continue
    return starts


@dataclass
class _Window:
    """The snapshots to audit (oldest first) and the group's offsets just before them."""

    snapshots: list[Snapshot]
    base: dict[Key, int] | None
    notes: list[str]


def _select_window(
    table: Table, group_id: str, after_snapshot_id: int | None, max_offsets: int | None
) -> _Window:
    key = OFFSETS_PREFIX + group_id
    ancestry = list(iter_ancestry(table))  # newest first
    ids = [s.snapshot_id for s in ancestry]
    notes = []
    if after_snapshot_id is not None and after_snapshot_id not in ids:
        notes.append(
            f"cursor snapshot {after_snapshot_id} is no longer in the lineage (rolled back "
            "or expired): auditing from the newest commits"
        )
        after_snapshot_id = None
    if after_snapshot_id is not None:
        cut = ids.index(after_snapshot_id)
        older = ancestry[cut:]
        base = next((_offsets(s, key) for s in older if key in snapshot_properties(s)), None)
        return _Window(list(reversed(ancestry[:cut])), base, notes)
    carriers = [i for i, s in enumerate(ancestry) if key in snapshot_properties(s)]
    if not carriers:  # rows but no commit of the group: every snapshot is someone else's
        return _Window(list(reversed(ancestry)), None, notes)
    first = carriers[-1]  # the group's oldest commit in the lineage
    if max_offsets is not None:  # no cursor: the newest commits within the budget
        budget, offsets = 0, [_offsets(ancestry[i], key) for i in carriers]
        for n, (after, before) in enumerate(itertools.pairwise(offsets)):
            budget += sum(max(0, o - before.get(k, o)) for k, o in after.items())
            if budget > max_offsets:
                first = carriers[n]
                notes.append(
                    f"{len(carriers) - n - 1} older commits not recounted (no cursor, budget "
                    f"{max_offsets} offsets): run a full audit to include them"
                )
                break
    older = ancestry[first + 1 :]
    base = next((_offsets(s, key) for s in older if key in snapshot_properties(s)), None)
    return _Window(list(reversed(ancestry[: first + 1])), base, notes)


def _count_backlog(
    left: list[Snapshot], previous: dict[Key, int] | None, key: str, audit: CommitAudit
) -> None:
    """Record the commits not audited by this evaluation (oldest first): how many, how many
    offsets they cover (from their offsets, metadata only), and the oldest one's time."""
    audit.pending = len(left)
    audit.oldest_unaudited_ms = left[0].timestamp_ms if left else None
    for snapshot in left:
        current = _offsets(snapshot, key)
        if RESET_BY not in snapshot_properties(snapshot):
            base = previous or {}
            audit.backlog_offsets += sum(max(0, o - base.get(k, o)) for k, o in current.items())
        previous = current


def clusters_by_snapshot(table: Table, group_id: str) -> dict[int, str]:
    """The cluster each snapshot's group offsets refer to: ``primary`` until a failover commit
    (``kafka.failover-to``), or a commit carrying its route, names another, then that one
    (metadata only)."""
    current, clusters = "primary", {}
    for snapshot in reversed(list(iter_ancestry(table))):
        properties = snapshot_properties(snapshot)
        route = route_of(properties) if properties.get(GROUP_ID) == group_id else None
        if route is not None:  # a switch, or a commit carrying it (the switch may be expired)
            current = route[FAILOVER_TO]
        clusters[snapshot.snapshot_id] = current
    return clusters


def _offsets(snapshot: Snapshot, key: str) -> dict[Key, int]:
    return flatten(decode_offsets(snapshot_properties(snapshot)[key]))


def audit_commits(
    table: Table,
    group_id: str,
    kafka_config: dict[str, Any],
    pipeline: str,
    *,
    after_snapshot_id: int | None = None,
    max_offsets: int | None = 3_000_000,
    timeout_s: float = 30.0,
    cluster_configs: dict[str, dict[str, Any]] | None = None,
    cursor_offsets: dict[Key, int] | None = None,
    quarantine: Table | None = None,
) -> CommitAudit:
    """Audit the snapshots after ``after_snapshot_id`` (see the module docstring).

    ``max_offsets`` bounds the recount of one call (None: no bound, the full audit). Reads
    only; safe to run at any time and repeatedly. Across a failover each commit is recounted
    on the cluster it read (:func:`clusters_by_snapshot`), through ``cluster_configs`` (by
    cluster name; ``kafka_config`` for a cluster not in it); a failover commit itself is a
    switch, not a rewind (its offsets are another cluster's). ``cursor_offsets`` (the group's
    offsets at the cursor) and ``quarantine`` (the pipeline's quarantine table) let it audit
    commits another tool expired (R56).
    """
    key = OFFSETS_PREFIX + group_id
    window = _select_window(table, group_id, after_snapshot_id, max_offsets)
    audit = CommitAudit(cursor=after_snapshot_id, notes=list(window.notes))
    audit.cursor_offsets = cursor_offsets
    covered: set[int] = set()  # carriers the gap audit covered (R56)
    if window.notes and after_snapshot_id is not None:
        audit.cursor = None
        if table.metadata.snapshot_by_id(after_snapshot_id) is None:  # expired, not rolled back
            gap = _expired_window(table, group_id, cursor_offsets)
            if gap is None:
                audit.cursor_expired = after_snapshot_id
            else:
                window, end, covered, at = gap
                audit.notes = [
                    f"commits after snapshot {after_snapshot_id} (the audit's cursor) were "
                    "expired by another tool: their ranges are audited as one (R56)"
                ]
                audit_gap(
                    table,
                    quarantine,
                    cursor_offsets or {},
                    end,
                    at,
                    kafka_config,
                    pipeline,
                    timeout_s,
                    audit,
                    skipped=find_gap_skips(table, group_id),
                )
                audit.cursor = after_snapshot_id  # moves on below, over the covered commits
                if audit.findings or audit.unrecounted is not None:  # stays, and says so again
                    if audit.unrecounted is not None:
                        audit.unrecounted_snapshot = after_snapshot_id  # retried, then ERROR
                    return audit
    carriers = [
        s
        for s in window.snapshots
        if key in snapshot_properties(s) and s.snapshot_id not in covered
    ]
    clusters = clusters_by_snapshot(table, group_id)  # also what each commit's rows record

    def config_of(snapshot: Snapshot) -> dict[str, Any]:
        name = clusters.get(snapshot.snapshot_id, PRIMARY)
        return (cluster_configs or {}).get(name, kafka_config)

    # Per cluster: under MM2's identity naming a failback reads a topic with the same name on
    # the other cluster (``primary.orders`` on both), whose log start is its own.
    log_starts: dict[int, dict[Key, int]] = {}
    for config in {id(config_of(s)): config_of(s) for s in carriers}.values():
        keys = {k for s in carriers if config_of(s) is config for k in _offsets(s, key)}
        log_starts[id(config)] = (
            _log_starts(config, keys, f"{pipeline}-audit", min(10.0, timeout_s)) if keys else {}
        )
    previous, clean = window.base, True
    # One commit may take several snapshots (a reset's delete is pyiceberg's DELETE then
    # OVERWRITE, both with its commit id): only the last one is the commit's outcome.
    ids = [snapshot_properties(s).get(COMMIT_ID) for s in window.snapshots]
    for index, snapshot in enumerate(window.snapshots):
        properties = snapshot_properties(snapshot)
        found = len(audit.findings)
        if ids[index] is not None and ids[index] in ids[index + 1 :]:
            continue  # an intermediate snapshot of a commit that continues later
        if snapshot.snapshot_id in covered:  # audited with the expired commits (R56)
            previous = _offsets(snapshot, key)
        elif key not in properties:
            check_other(snapshot, properties, group_id, audit)
        elif RESET_BY in properties:
            current = _offsets(snapshot, key)
            if FAILOVER_TO not in properties:
                cluster = clusters.get(snapshot.snapshot_id, PRIMARY)
                check_rewind(table, snapshot, previous or {}, current, audit, cluster)
            previous = current
        else:
            current = _offsets(snapshot, key)
            starts = log_starts.get(id(config_of(snapshot)), {})
            recount = plan_recount(previous, current, properties, starts)
            size = sum(r.size for r in recount.ranges)
            over = max_offsets is not None and audit.offsets_recounted + size > max_offsets
            if over and audit.recounted:  # the budget is spent: the rest is the backlog
                _count_backlog(carriers[carriers.index(snapshot) :], previous, key, audit)
                break
            read_on = clusters.get(snapshot.snapshot_id, PRIMARY)
            check_rows(table, snapshot, previous, current, properties, audit, read_on)
            config = config_of(snapshot)
            check_count(snapshot, properties, recount, config, pipeline, timeout_s, audit)
            if audit.unrecounted is not None:  # retried next evaluation: the cursor stays
                _count_backlog(carriers[carriers.index(snapshot) :], previous, key, audit)
                break
            previous = current
        clean = clean and len(audit.findings) == found
        if clean:
            audit.cursor = snapshot.snapshot_id
            audit.cursor_offsets = previous
    return audit


def _expired_window(
    table: Table, group_id: str, cursor_offsets: dict[Key, int] | None
) -> tuple[_Window, dict[Key, int], set[int], int | None] | None:
    """After another tool expired the cursor's snapshot: every snapshot left in the lineage
    (oldest first), where the expired commits' ranges end (the oldest carrier left, else the
    position the table property keeps), the carriers up to it, and the snapshot to read their
    rows at (None: the head). None when the gap cannot be audited as one range: the cursor's
    offsets are unknown (an evaluation before R56); offsets moved back or dropped a partition
    in between; the end is an operator's reset; or the group reads a replica (a switch among
    the expired commits would compare one cluster's offsets with another's)."""
    if cursor_offsets is None:
        return None
    key = OFFSETS_PREFIX + group_id
    snapshots = list(reversed(list(iter_ancestry(table))))
    first = next((s for s in snapshots if key in snapshot_properties(s)), None)
    if first is not None:
        end, covered, properties = (
            _offsets(first, key),
            {first.snapshot_id},
            snapshot_properties(first),
        )
    else:
        state = find_committed_state(table, group_id)
        if state is None:
            return None
        end, covered, properties = flatten(state.offsets), set(), state.properties
    if any(k not in end or end[k] < o for k, o in cursor_offsets.items()):
        return None
    if RESET_BY in properties or route_of(properties) is not None:
        return None
    at = first.snapshot_id if first is not None else None
    return _Window(snapshots, end, []), end, covered, at


def find_gap_skips(table: Table, group_id: str) -> dict[Key, list[tuple[int, int, str]]]:
    """The ranges resets skipped, per partition, as the table's record of what the group's
    reads left out names them (:mod:`ingestion.table.left_out`), for a gap that ends at the
    oldest commit left: only when the record belongs to the head's history and no reset is
    left in the lineage (the newest reset, the last to change the record, is then among the
    expired commits, so the record tells the gap as it was); empty otherwise (nothing is
    excused)."""
    key = OFFSETS_PREFIX + group_id
    record = read_left_out(table.metadata.properties, group_id)
    if record is None:
        return {}
    for snapshot in iter_ancestry(table):
        properties = snapshot_properties(snapshot)
        if key in properties and is_offset_reset(properties):
            return {}
    state = find_committed_state(table, group_id)
    if state is None or not belongs_to(record, state):
        return {}
    return {
        (topic, partition): [
            (skip.start, skip.end, why)
            for skip, why in skipped_spans(record, (topic, partition), offsets.topic_id)
        ]
        for topic, offsets in state.offsets.items()
        for partition in offsets.next_offsets
    }


def split_skipped(
    ranges: list[OffsetRange], skipped: dict[Key, list[tuple[int, int, str]]]
) -> tuple[list[OffsetRange], list[tuple[OffsetRange, str]]]:
    """``ranges`` cut around the ``skipped`` ones: the parts left to recount, and the parts
    skipped, each with why (pure).

    Example:
        >>> kept, cut = split_skipped([OffsetRange("t", 0, 0, 30)], {("t", 0): [(10, 20, "r")]})
        >>> [(r.start, r.end) for r in kept], [(r.start, r.end, why) for r, why in cut]
        ([(0, 10), (20, 30)], [(10, 20, 'r')])
    """
    kept: list[OffsetRange] = []
    cut: list[tuple[OffsetRange, str]] = []
    for rng in ranges:
        at = rng.start
        for a, b, why in sorted(skipped.get((rng.topic, rng.partition), [])):
            a, b = max(a, at), min(b, rng.end)
            if a >= b:
                continue
            if a > at:
                kept.append(OffsetRange(rng.topic, rng.partition, at, a))
            cut.append((OffsetRange(rng.topic, rng.partition, a, b), why))
            at = b
        if at < rng.end:
            kept.append(OffsetRange(rng.topic, rng.partition, at, rng.end))
    return kept, cut


def audit_gap(
    table: Table,
    quarantine: Table | None,
    start: dict[Key, int],
    end: dict[Key, int],
    snapshot_id: int | None,
    kafka_config: dict[str, Any],
    pipeline: str,
    timeout_s: float,
    audit: CommitAudit,
    *,
    skipped: dict[Key, list[tuple[int, int, str]]] | None = None,
) -> None:
    """The ranges ``start`` -> ``end`` of commits whose snapshots are gone, audited as one
    (R56): the table's rows there at ``snapshot_id`` (the commit that ends the gap; None: the
    head) read on the pipeline's own cluster, and the quarantine table's rows there, each
    coordinate once, as many together as Kafka's visible records, but for the ranges in
    ``skipped`` (:func:`find_gap_skips`: an operator's forward reset among the expired commits
    skipped them), which are named and not expected. A partition new since ``start`` begins at
    its log start (a lower bound: only fewer rows than Kafka holds is a finding), as does a
    range retention has shortened. Cost: a scan pruned by the offset column's bounds to the
    gap's files, and a recount of the gap, however long (the budget does not split it). Late
    copies skipped by the expired commits (after a ``--source-lost`` failover, R54) are not
    known here: the audit then reports fewer rows than Kafka holds; a full audit tells."""
    from confluent_kafka import KafkaException

    keys = sorted(k for k, o in end.items() if o > start.get(k, 0) or k not in start)
    log_starts = _log_starts(kafka_config, set(keys), f"{pipeline}-audit", min(10.0, timeout_s))
    recount = plan_recount(start, end, {}, log_starts)  # the gap as one commit's ranges
    ranges, cut = split_skipped(list(recount.ranges), skipped or {})
    exact = recount.exact
    for part, why in cut:
        audit.notes.append(
            f"commits expired by another tool: {part.topic}[{part.partition}] [{part.start}, "
            f"{part.end}) not expected: {why}"
        )
    if not ranges:
        return
    rows = _rows_in(table, ranges, snapshot_id)
    rows += _rows_in(quarantine, ranges, None) if quarantine is not None else []
    twice = sorted(c for c, n in Counter(rows).items() if n > 1)
    visible, role, where = 0, f"{pipeline}-audit", ranges[0]
    try:
        with open_consumer(kafka_config, role) as consumer:
            for where in ranges:
                visible += sum(len(b) for b in iter_batches(consumer, where, timeout_s, role))
    except (exceptions.ReadError, KafkaException) as exc:
        audit.unrecounted = (
            f"commits expired by another tool: could not recount {where.topic}[{where.partition}] "
            f"[{where.start}, {where.end}) ({exc})"
        )
        return
    size = sum(r.size for r in ranges)
    audit.offsets_recounted += size
    found = len(set(rows))
    if twice:
        audit.findings.append(
            f"commits expired by another tool: {len(twice)} records held twice in their ranges, "
            f"e.g. {twice[:5]}"
        )
    if found < visible or (exact and found != visible):
        audit.findings.append(
            f"commits expired by another tool: the table and its quarantine table hold {found} "
            f"records of their ranges ({size} offsets) but Kafka holds {visible} visible records"
        )
    elif not twice:
        audit.notes.append(
            f"commits expired by another tool audited as one range: {size} offsets, {found} "
            f"records held once each{'' if exact else ' (a start is a lower bound)'}, as Kafka "
            "holds"
        )


def _rows_in(
    table: Table, ranges: list[OffsetRange], snapshot_id: int | None
) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of ``table``'s rows in ``ranges`` at ``snapshot_id`` (None:
    the head) read on the pipeline's own cluster (``_kafka_cluster`` null or ``primary``)."""
    clauses = " or ".join(
        f"(_kafka_topic = '{r.topic}' and _kafka_partition = {r.partition} and "
        f"_kafka_offset >= {r.start} and _kafka_offset < {r.end})"
        for r in ranges
    )
    labelled = labels_cluster(table.schema())
    columns = ("_kafka_topic", "_kafka_partition", "_kafka_offset")
    found = table.scan(
        row_filter=clauses,
        selected_fields=(*columns, CLUSTER_COLUMN) if labelled else columns,
        snapshot_id=snapshot_id,
    ).to_arrow()
    names = found.column(CLUSTER_COLUMN).to_pylist() if labelled else [None] * found.num_rows
    coordinates = zip(*(found.column(c).to_pylist() for c in columns), strict=True)
    return [c for c, name in zip(coordinates, names, strict=True) if (name or PRIMARY) == PRIMARY]
