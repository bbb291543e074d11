"""The checks of one snapshot for the incremental audit (``ingestion.audit.incremental``): its rows,
its count against Kafka, an operator's rewind, and snapshots that are not the group's commits.

Each check appends what it finds to a :class:`CommitAudit`: ``findings`` (the audit fails) or
``notes`` (what could not be verified, and why).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion import exceptions
from ingestion.audit.recount import Recount
from ingestion.kafka.consumer import iter_batches, open_consumer
from ingestion.kafka.ranges import Key
from ingestion.ops.compaction import MAINTENANCE
from ingestion.table.offsets import (
    MIGRATED_FROM,
    OFFSETS_PREFIX,
    QUARANTINED,
    RANGE_STARTS,
    RECORDS,
    count_skipped,
    decode_starts,
)
from ingestion.table.schema import CLUSTER_COLUMN, PRIMARY, labels_cluster
from ingestion.table.upsert import ChangeCounts, read_counts

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


@dataclass
class CommitAudit:
    """What the incremental audit found; ``cursor`` is the newest snapshot audited clean (it
    never passes an ``unrecounted`` commit: that one is retried by the next evaluation)."""

    cursor: int | None = None
    recounted: list[int] = field(default_factory=list)
    offsets_recounted: int = 0
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: int = 0  # commits after the cursor not audited by this evaluation (the backlog)
    backlog_offsets: int = 0  # offsets those commits cover
    oldest_unaudited_ms: int | None = None  # commit time of the oldest of them
    unrecounted: str | None = None  # the commit whose recount failed, where and why
    unrecounted_snapshot: int | None = None
    cursor_expired: int | None = None  # the cursor snapshot was expired: commits after it unaudited
    cursor_offsets: dict[Key, int] | None = None  # the group's offsets at the cursor (R56)

    @property
    def ok(self) -> bool:
        """No finding (notes are what could not be verified, and why)."""
        return not self.findings


def _count(snapshot: Snapshot, name: str) -> int:
    return int(snapshot.summary.get(name, "0") or 0) if snapshot.summary else 0


def _added_coordinates(
    table: Table, snapshot: Snapshot
) -> tuple[list[tuple[str, int, int]], list[str | None]]:
    """(topic, partition, offset) of the rows in the data files ``snapshot`` added, and each
    row's ``_kafka_cluster`` (None: not recorded)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.manifest import DataFileContent, ManifestEntryStatus
    from pyiceberg.table import FileScanTask

    files = [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.status == ManifestEntryStatus.ADDED
        and entry.data_file.content == DataFileContent.DATA
    ]
    if not files:
        return [], []
    columns = ["_kafka_topic", "_kafka_partition", "_kafka_offset"]
    labelled = labels_cluster(table.schema())
    schema = table.schema().select(*columns, *([CLUSTER_COLUMN] if labelled else []))
    rows = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table(
        [FileScanTask(f) for f in files]
    )
    coordinates = list(
        zip(
            rows.column("_kafka_topic").to_pylist(),
            rows.column("_kafka_partition").to_pylist(),
            rows.column("_kafka_offset").to_pylist(),
            strict=True,
        )
    )
    clusters = rows.column(CLUSTER_COLUMN).to_pylist() if labelled else [None] * len(coordinates)
    return coordinates, clusters


def check_rows(
    table: Table,
    snapshot: Snapshot,
    previous: dict[Key, int] | None,
    current: dict[Key, int],
    properties: dict[str, str],
    audit: CommitAudit,
    cluster: str | None = None,
) -> None:
    """Offsets never go down; the rows of the commit's own files lie in its ranges, once, and
    those recording their cluster (``_kafka_cluster``) name ``cluster``, the one the commit
    read (None: not checked)."""
    sid = snapshot.snapshot_id
    if previous is not None:
        dropped = sorted(set(previous) - set(current))
        backwards = sorted(k for k in previous if k in current and current[k] < previous[k])
        if dropped or backwards:
            audit.findings.append(
                f"snapshot {sid}: offsets moved backwards at {backwards[:5]} or dropped "
                f"partitions {dropped[:5]} without an operator's reset"
            )
    starts = decode_starts(properties[RANGE_STARTS]) if RANGE_STARTS in properties else {}
    low = {k: (previous or {}).get(k, starts.get(k)) for k in current}
    rows, clusters = _added_coordinates(table, snapshot)
    elsewhere = sorted({c for c in clusters if c is not None and c != (cluster or c)})
    if elsewhere:
        audit.findings.append(
            f"snapshot {sid}: rows record cluster(s) {elsewhere}, the commit read {cluster!r}: "
            "the run was not told the route's cluster; a failback under identity naming would "
            "trust these labels"
        )
    counts = read_counts(properties)
    if counts is not None:  # mode: upsert: it also rewrote rows of earlier commits
        _check_upsert_rows(snapshot, rows, current, low, counts, audit)
        return
    twice = sorted(c for c, n in Counter(rows).items() if n > 1)
    outside = sorted(
        c
        for c in set(rows)
        if (c[0], c[1]) not in current
        or c[2] >= current[(c[0], c[1])]
        or c[2] < (low[(c[0], c[1])] or 0)
    )
    if twice:
        audit.findings.append(f"snapshot {sid}: {len(twice)} records added twice, e.g. {twice[:5]}")
    if outside:
        audit.findings.append(
            f"snapshot {sid}: {len(outside)} records outside its offset ranges (committed "
            f"before, or beyond its offsets), e.g. {outside[:5]}"
        )


def _check_upsert_rows(
    snapshot: Snapshot,
    rows: list[tuple[str, int, int]],
    current: dict[Key, int],
    low: dict[Key, int | None],
    counts: ChangeCounts,
    audit: CommitAudit,
) -> None:
    """An upsert commit (``mode: upsert``, ingestion.table.upsert): the rows it added from its
    own ranges, once each, are its inserts and updates; the others are rows of earlier commits
    it carried over from the files it rewrote. By its summary, the rewritten files' records are
    the carried rows, the updated and the deleted ones: no row is dropped or kept twice."""
    sid = snapshot.snapshot_id

    def inside(c: tuple[str, int, int]) -> bool:
        end = current.get((c[0], c[1]))
        return end is not None and (low[(c[0], c[1])] or 0) <= c[2] < end

    mine = [c for c in rows if inside(c)]
    twice = sorted(c for c, n in Counter(mine).items() if n > 1)
    if twice:
        audit.findings.append(
            f"snapshot {sid}: {len(twice)} changes applied twice, e.g. {twice[:5]}"
        )
    inserts, updates, deletes = counts.inserts, counts.updates, counts.deletes
    carried = len(rows) - len(mine)
    if len(mine) != inserts + updates:
        audit.findings.append(
            f"snapshot {sid}: {len(mine)} rows from its ranges, but it counts {inserts} inserts "
            f"and {updates} updates"
        )
    # Rows read from the rewritten files (their delete files applied), else their count.
    removed = counts.rewritten_records
    if removed is None:
        removed = _count(snapshot, "deleted-records")
    if removed != carried + updates + deletes:
        audit.findings.append(
            f"snapshot {sid}: its rewritten files held {removed} records, but it carried "
            f"{carried} over, updated {updates} and deleted {deletes}: rows were dropped or "
            "kept twice"
        )


def check_count(
    snapshot: Snapshot,
    properties: dict[str, str],
    recount: Recount,
    kafka_config: dict[str, Any],
    pipeline: str,
    timeout_s: float,
    audit: CommitAudit,
) -> None:
    """``added-records`` + quarantined against Kafka's visible records in the ranges.

    A range that cannot be read (a broker error, no progress within ``timeout_s``) leaves the
    commit ``unrecounted``: not verified, to be retried, never counted as audited.
    """
    from confluent_kafka import KafkaException

    sid = snapshot.snapshot_id
    if not recount.verifiable:
        audit.notes.append(
            f"snapshot {sid}: the group's first commit, or the oldest left after an expiry, "
            "start not recorded (a full audit recounts its partitions' ranges whole)"
        )
        return
    visible, role = 0, f"{pipeline}-audit"
    rng = recount.ranges[0] if recount.ranges else None
    try:
        with open_consumer(kafka_config, role) as consumer:
            for rng in recount.ranges:  # one at a time: a failure names its partition
                visible += sum(len(b) for b in iter_batches(consumer, rng, timeout_s, role))
    except (exceptions.ReadError, KafkaException) as exc:
        where = f"{rng.topic}[{rng.partition}] [{rng.start}, {rng.end})" if rng else "its ranges"
        audit.unrecounted_snapshot = sid
        audit.unrecounted = f"snapshot {sid}: could not recount {where} ({exc})"
        return
    audit.recounted.append(sid)
    audit.offsets_recounted += sum(r.size for r in recount.ranges)
    # An upsert commit's rows are not its records: it counts the changes it decoded.
    applied = int(properties[RECORDS]) if read_counts(properties) is not None else None
    added = applied if applied is not None else _count(snapshot, "added-records")
    added += int(properties.get(QUARANTINED, "0"))
    added += count_skipped(properties)  # read and skipped: ingestion.task.spec
    if added < visible or (recount.exact and added != visible):
        audit.findings.append(
            f"snapshot {sid} added {added} records (quarantined and late copies included) but "
            f"Kafka holds {visible} visible records in its ranges"
        )
    elif not recount.exact:
        audit.notes.append(
            f"snapshot {sid}: a range start is a lower bound (not recorded, or deleted by "
            f"retention): {added} added, {visible} still in Kafka"
        )


def check_rewind(
    table: Table,
    snapshot: Snapshot,
    previous: dict[Key, int],
    current: dict[Key, int],
    audit: CommitAudit,
    cluster: str = PRIMARY,
) -> None:
    """An operator's rewind leaves no row at or after a rewound offset (it is read again), of
    the rows read on ``cluster`` (``_kafka_cluster``; null is ``primary``): rows another cluster
    holds at the same coordinates (MM2's identity naming) are other records and stay."""
    rewound = {k: o for k, o in current.items() if k in previous and o < previous[k]}
    if not rewound:
        return
    clauses = " or ".join(
        f"(_kafka_topic = '{t}' and _kafka_partition = {p} and _kafka_offset >= {o})"
        for (t, p), o in sorted(rewound.items())
    )
    at = snapshot.schema_id  # the scan reads the snapshot's schema (the current one if unset)
    schema = table.schema() if at is None else table.metadata.schema_by_id(at)
    labelled = schema is not None and labels_cluster(schema)
    fields = ("_kafka_offset", CLUSTER_COLUMN) if labelled else ("_kafka_offset",)
    rows = table.scan(
        snapshot_id=snapshot.snapshot_id, row_filter=clauses, selected_fields=fields
    ).to_arrow()
    names = rows.column(CLUSTER_COLUMN).to_pylist() if labelled else [None] * rows.num_rows
    left = sum(1 for name in names if (name or PRIMARY) == cluster)
    if left:
        audit.findings.append(
            f"snapshot {snapshot.snapshot_id} (an operator's rewind) left {left} rows at or "
            "after the rewound offsets: they will be read again (duplicates)"
        )


def check_other(
    snapshot: Snapshot, properties: dict[str, str], group_id: str, audit: CommitAudit
) -> None:
    """A snapshot without this group's offsets: a compaction, a migration, or a foreign write."""
    sid = snapshot.snapshot_id
    added, deleted = _count(snapshot, "added-records"), _count(snapshot, "deleted-records")
    operation = snapshot.summary.operation.value if snapshot.summary else "?"
    if operation == "replace" or properties.get(MAINTENANCE) == "compaction":
        check_maintenance(snapshot, properties, audit)
        return
    others = sorted(
        k.removeprefix(OFFSETS_PREFIX) for k in properties if k.startswith(OFFSETS_PREFIX)
    )
    if others and properties.get(MIGRATED_FROM) == group_id:
        audit.notes.append(f"snapshot {sid}: offsets migrated to {others}; {group_id!r} retired")
    elif others:
        audit.findings.append(
            f"snapshot {sid} commits offsets of group(s) {others}: another pipeline writes to "
            "this table"
        )
    elif added or deleted:
        audit.findings.append(
            f"snapshot {sid} ({operation}) added {added} and deleted {deleted} rows without "
            "offsets: a writer outside the pipeline"
        )


def check_maintenance(snapshot: Snapshot, properties: dict[str, str], audit: CommitAudit) -> None:
    """A snapshot that rewrites files without changing the rows passes, with a note: Iceberg's
    ``replace`` (Spark's ``rewrite_data_files``, ``rewrite_position_delete_files`` and
    ``rewrite_manifests``, Trino's ``optimize``, a managed optimizer) or our own compaction
    (``kafka.maintenance=compaction``; tables written before it wrote ``replace`` have
    ``overwrite`` ones). Proven from the summary alone, no scan: the data files it removed
    held as many records as those it added, and it removed as many position deletes as it
    added, or more (deletes of removed rows dropped with them); equality deletes are never
    ours. Anything else is a finding (R56)."""
    sid = snapshot.snapshot_id
    added, deleted = _count(snapshot, "added-records"), _count(snapshot, "deleted-records")
    kind = "compaction" if properties.get(MAINTENANCE) == "compaction" else "replace"
    deletes_added = _count(snapshot, "added-position-deletes")
    deletes_removed = _count(snapshot, "removed-position-deletes")
    equality = _count(snapshot, "added-equality-deletes")
    if added != deleted or equality or deletes_added > deletes_removed:
        audit.findings.append(
            f"snapshot {sid} ({kind}) changed the rows: data files with {deleted} records "
            f"replaced by {added}, {deletes_added - deletes_removed} more position deletes, "
            f"{equality} equality deletes added. A rewrite keeps the rows; this one did not"
        )
        return
    files = _count(snapshot, "deleted-data-files"), _count(snapshot, "added-data-files")
    manifests = _count(snapshot, "manifests-replaced"), _count(snapshot, "manifests-created")
    audit.notes.append(
        f"snapshot {sid}: maintenance ({kind}) kept the rows: {files[0]} data files "
        f"({deleted} records) rewritten into {files[1]}, {manifests[0]} manifests into "
        f"{manifests[1]}, {deletes_removed} position deletes removed"
    )
