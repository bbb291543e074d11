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
- a compaction: it adds as many records as it deletes;
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingestion.audit.recount import plan_recount
from ingestion.audit.snapshots import (
    CommitAudit,
    check_count,
    check_other,
    check_rewind,
    check_rows,
)
from ingestion.kafka.consumer import open_consumer
from ingestion.kafka.ranges import Key
from ingestion.table.offsets import (
    COMMIT_ID,
    FAILOVER_TO,
    GROUP_ID,
    OFFSETS_PREFIX,
    RESET_BY,
    decode_offsets,
    flatten,
    iter_ancestry,
    snapshot_properties,
)
from ingestion.table.route import route_of
from ingestion.table.schema import PRIMARY

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
) -> CommitAudit:
    """Audit the snapshots after ``after_snapshot_id`` (see the module docstring).

    ``max_offsets`` bounds the recount of one call (None: no bound, the full audit). Reads
    only; safe to run at any time and repeatedly. Across a failover each commit is recounted
    on the cluster it read (:func:`clusters_by_snapshot`), through ``cluster_configs`` (by
    cluster name; ``kafka_config`` for a cluster not in it); a failover commit itself is a
    switch, not a rewind (its offsets are another cluster's).
    """
    key = OFFSETS_PREFIX + group_id
    window = _select_window(table, group_id, after_snapshot_id, max_offsets)
    audit = CommitAudit(cursor=after_snapshot_id, notes=list(window.notes))
    if window.notes and after_snapshot_id is not None:
        audit.cursor = None
        if table.metadata.snapshot_by_id(after_snapshot_id) is None:  # expired, not rolled back
            audit.cursor_expired = after_snapshot_id
    carriers = [s for s in window.snapshots if key in snapshot_properties(s)]
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
        if key not in properties:
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
    return audit
