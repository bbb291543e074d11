"""The oracle of docs/reliability.md as code: is every record in the table exactly once?

:func:`audit_table` is the full audit's row scan: it reads every row's Kafka coordinates (and
the snapshot lineage); with an ``expected`` set (a test's producer ledger) it also reports
missing and unexpected (for example aborted) records. :func:`audit_pipeline` is the production
oracle: by default the incremental audit of the commits since a cursor against an independent
read_committed recount in Kafka (``ingestion.audit.incremental``), O(new commits); the full audit
on demand, which also recounts every partition's committed range in Kafka record by record, the
commits whose snapshots were expired included (``ingestion.audit.coverage``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion.audit.clusters import allowed_copies, count_duplicates, read_labelled
from ingestion.audit.coverage import (
    RangeRecount,
    count_expired_snapshots,
    recount_committed_ranges,
)
from ingestion.audit.incremental import CommitAudit, audit_commits
from ingestion.audit.names import find_cross_name_twins
from ingestion.audit.recount import parse_lost_ranges
from ingestion.kafka.ranges import Coordinates, Key
from ingestion.pipeline.recovery import list_file_paths
from ingestion.replicas import replica_support
from ingestion.table.offsets import (
    LOST_RANGES,
    OFFSETS_PREFIX,
    QUARANTINED,
    RESET_BY,
    count_skipped,
    decode_offsets,
    decode_positions,
    find_committed_state,
    flatten,
    iter_ancestry,
    skipped_offsets,
    snapshot_properties,
)
from ingestion.table.route import DROPPED_PREFIX, route_cluster

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from ingestion.spec.pipeline import PipelineSpec

COORDINATE_COLUMNS = ("_kafka_topic", "_kafka_partition", "_kafka_offset")


@dataclass
class AuditResult:
    """What the oracle found; ``ok`` when nothing is wrong."""

    rows: int = 0
    quarantined: int = 0
    duplicates: list[Coordinates] = field(default_factory=list)
    missing: list[Coordinates] = field(default_factory=list)
    unexpected: list[Coordinates] = field(default_factory=list)
    duplicate_files: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    beyond_watermark: list[Coordinates] = field(default_factory=list)
    commit_mismatches: list[str] = field(default_factory=list)
    cross_name_duplicates: list[str] = field(default_factory=list)  # ingestion.audit.names
    duplicate_keys: list[Any] = field(default_factory=list)  # mode: upsert, a key in two rows

    @property
    def ok(self) -> bool:
        """No duplicate, loss, unexpected record, shared file, regression or overrun."""
        return not (
            self.duplicates
            or self.missing
            or self.unexpected
            or self.duplicate_files
            or self.regressions
            or self.beyond_watermark
            or self.commit_mismatches
            or self.cross_name_duplicates
            or self.duplicate_keys
        )

    def summary(self) -> str:
        """One line per finding (at most five examples each)."""
        lines = [f"{self.rows} rows, {self.quarantined} quarantined"]
        for name in (
            "duplicates",
            "missing",
            "unexpected",
            "duplicate_files",
            "regressions",
            "beyond_watermark",
            "commit_mismatches",
            "cross_name_duplicates",
            "duplicate_keys",
        ):
            found = getattr(self, name)
            if found:
                lines.append(f"{name}: {len(found)} e.g. {found[:5]}")
        return "; ".join(lines)


def read_coordinates(table: Table) -> list[Coordinates]:
    """The (topic, partition, offset) of every row, as any reader sees the table (no filter)."""
    rows = table.scan(selected_fields=COORDINATE_COLUMNS).to_arrow()
    topics = rows.column("_kafka_topic").to_pylist()
    partitions = rows.column("_kafka_partition").to_pylist()
    offsets = rows.column("_kafka_offset").to_pylist()
    return list(zip(topics, partitions, offsets, strict=True))


def _lineage_checks(table: Table, group_id: str, result: AuditResult) -> dict[Key, int]:
    """Offsets never decrease and no partition vanishes along the lineage; return the newest,
    and for a partition an operator's action dropped (a failback's completion drops the
    reverse copies, R49), the offset it had when dropped: its rows stay, read up to there."""
    key = OFFSETS_PREFIX + group_id
    lineage = [s for s in reversed(list(iter_ancestry(table))) if key in snapshot_properties(s)]
    previous: dict[Key, int] = {}
    dropped: dict[Key, int] = {}
    for snapshot in lineage:
        current = flatten(decode_offsets(snapshot_properties(snapshot)[key]))
        if RESET_BY in snapshot_properties(snapshot):  # an operator's explicit reset may rewind
            dropped.update({k: o for k, o in previous.items() if k not in current})
            previous = current
            continue
        for partition, offset in previous.items():
            if partition not in current:
                result.regressions.append(f"snapshot {snapshot.snapshot_id}: {partition} vanished")
            elif current[partition] < offset:
                result.regressions.append(
                    f"snapshot {snapshot.snapshot_id}: {partition} {offset} -> {current[partition]}"
                )
        previous = current
    return {**dropped, **previous}


def find_duplicate_keys(table: Table) -> list[Any]:
    """An upsert table's keys (its identifier fields) held by more than one row; [] for an
    append table, which has no identifier fields."""
    import pyarrow.compute as pc

    schema = table.schema()
    names = [schema.find_column_name(i) for i in schema.identifier_field_ids]
    if not names:
        return []
    keys = table.scan(selected_fields=tuple(n for n in names if n)).to_arrow()
    counts = keys.group_by(keys.column_names).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    return repeated.drop_columns(["count_all"]).to_pylist()


def audit_table(
    table: Table,
    group_id: str,
    quarantine: Table | None = None,
    expected: set[Coordinates] | None = None,
    lost: set[Coordinates] | None = None,
    families: list[frozenset[str]] | None = None,
) -> AuditResult:
    """Audit ``table`` (and its quarantine table) for the group; see the module docstring.

    The quarantine table is read as any reader reads it, without filtering by commit lineage:
    it holds exactly the dead letters of the committed ranges (ingestion.quarantine.sync), so a row
    of a losing or crashed run would show here as a duplicate or as beyond the watermark.
    ``families`` (the names MM2 gives each topic, ``ingestion.replicas``) add the check for
    one record held under two names.
    """
    result = AuditResult()
    rows = read_labelled(table)
    result.rows = len(rows)
    if quarantine is not None:
        quarantined = read_labelled(quarantine)
        result.quarantined = len(quarantined)
        rows += quarantined
    counts = Counter(c for c, _ in rows)
    # (cluster, topic, partition, offset) where rows record it; else once per cluster (R49)
    result.duplicates = count_duplicates(rows, allowed_copies(table, group_id))
    current = table.current_snapshot()
    files = list_file_paths(table, current) if current else []
    result.duplicate_files = sorted(p for p, n in Counter(files).items() if n > 1)
    if families:  # the check itself reads only the table (ingestion.audit.names)
        result.cross_name_duplicates = find_cross_name_twins(table, families)
    # Partitions an ended route dropped keep their rows, read up to there (R49).
    ended = decode_positions(table.properties.get(DROPPED_PREFIX + group_id, "{}"))
    lineage = _lineage_checks(table, group_id, result)
    if not lineage:  # every snapshot with the offsets was expired: the proven position (R56)
        committed = find_committed_state(table, group_id)
        lineage = flatten(committed.offsets) if committed is not None else {}
    watermark = {**ended, **lineage}
    # A row recording another cluster than the route's, at a (topic, partition) the route reads
    # under the same name (MM2's identity naming), holds that cluster's offsets, unrelated to
    # the route's watermark there: not held to it (R49; its duplicates are still counted). A
    # row written before the column (null) is held, as before it existed.
    reads, now = route_cluster(table, group_id), _route_partitions(table, group_id)
    result.beyond_watermark = sorted(
        {
            c
            for c, cluster in rows
            if c[2] >= watermark.get((c[0], c[1]), 0)
            and (cluster is None or cluster == reads or (c[0], c[1]) not in now)
        }
    )
    result.duplicate_keys = find_duplicate_keys(table)
    if expected is not None:
        allowed_missing = (lost or set()) | skipped_offsets(table)  # MM2's, R54
        within = {c for c in expected if c[2] < watermark.get((c[0], c[1]), 0)}
        result.missing = sorted(within - set(counts) - allowed_missing)
        result.unexpected = sorted(set(counts) - expected)
        _check_commit_counts(table, group_id, expected, result)
    return result


def _route_partitions(table: Table, group_id: str) -> set[Key]:
    """The (topic, partition)s the group's committed offsets name now."""
    committed = find_committed_state(table, group_id)
    return set(flatten(committed.offsets)) if committed else set()


def _check_commit_counts(
    table: Table, group_id: str, expected: set[Coordinates], result: AuditResult
) -> None:
    """Each commit's added plus quarantined records equal the visible records of its ranges.

    The first commit's ranges are taken to start at offset 0 (a pipeline that started from
    ``earliest`` on a topic whose log starts at 0, as in the tests); after snapshot expiry the
    oldest remaining commit is skipped.
    """
    key = OFFSETS_PREFIX + group_id
    lineage = list(reversed(list(iter_ancestry(table))))
    # Expired ancestors (the oldest remaining snapshot is not the table's first; expiry clears
    # its parent id, so its sequence number tells): that commit's range start is unknown.
    previous: dict[Key, int] | None = {}
    if lineage and (lineage[0].sequence_number or 0) > 1:
        previous = None
    for snapshot in lineage:
        properties = snapshot_properties(snapshot)
        if key not in properties:
            continue
        current = flatten(decode_offsets(properties[key]))
        if previous is None or RESET_BY in properties:  # a reset adds no records
            previous = current
            continue
        # A range the commit recorded as lost (R12's opt-in skip) was never readable.
        lost = parse_lost_ranges(properties.get(LOST_RANGES, ""))
        visible = sum(
            1
            for t, p, o in expected
            if max(previous.get((t, p), 0), lost.get((t, p), 0)) <= o < current.get((t, p), 0)
        )
        summary = snapshot.summary
        added = int(summary.get("added-records", "0") or 0) if summary else 0
        added += int(properties.get(QUARANTINED, "0")) + count_skipped(properties)
        if added != visible:
            result.commit_mismatches.append(
                f"snapshot {snapshot.snapshot_id}: added {added} != visible {visible}"
            )
        previous = current


@dataclass(frozen=True)
class PipelineAudit:
    """The production oracle's result: the commits audited against Kafka, and with a full
    audit also every row's coordinates (:func:`audit_table`) and every partition's committed
    range recounted record by record (``ranges``, ingestion.audit.coverage)."""

    commits: CommitAudit
    full: AuditResult | None = None
    budget: int | None = None  # offsets one evaluation may recount (None: no bound)
    ranges: RangeRecount | None = None


def audit_pipeline(
    spec: PipelineSpec,
    catalog: Catalog,
    kafka_config: dict[str, Any],
    *,
    after_snapshot_id: int | None = None,
    full: bool = False,
    cluster_configs: dict[str, dict[str, Any]] | None = None,
    cursor_offsets: dict[Key, int] | None = None,
) -> PipelineAudit | None:
    """The production oracle of one pipeline; None when the table does not exist.

    By default incremental (``ingestion.audit.incremental``): the commits after
    ``after_snapshot_id`` (the previous evaluation's cursor) are recounted in Kafka, at most
    the spec's ``audit_recount_offsets`` offsets (the rest is reported as the backlog).
    ``full`` recounts every commit in the lineage, scans every row's coordinates of the
    table and its quarantine table, and recounts every partition's committed range in Kafka
    record by record (:func:`ingestion.audit.coverage.recount_committed_ranges`): the commits
    whose snapshots were expired are covered by it, and what it cannot check it names. A
    pipeline with replicas is not range-recounted (a switch may have read part of a range on
    another cluster under other names), and says so.
    ``cluster_configs`` (by cluster name) recount each commit on the cluster it read, across
    failovers. ``cursor_offsets`` (the group's offsets at the cursor) audit the commits
    another tool expired after the cursor (R56).
    """
    if not catalog.table_exists(spec.table):
        return None
    quarantine = None
    if full and catalog.table_exists(spec.quarantine_table):
        # Before the data table: every commit it reflects is then in the lineage read after
        # it, and a newer commit's dead letters count as not synced yet, never as rows beyond
        # the offsets read (ingestion.quarantine.sync).
        quarantine = catalog.load_table(spec.quarantine_table)
    table = catalog.load_table(spec.table)
    if not full and spec.errors_tolerance == "all" and catalog.table_exists(spec.quarantine_table):
        quarantine = catalog.load_table(spec.quarantine_table)
    commits = audit_commits(
        table,
        spec.consumer_group_id,
        kafka_config,
        spec.name,
        after_snapshot_id=None if full else after_snapshot_id,
        max_offsets=None if full else spec.audit_recount_offsets,
        cluster_configs=cluster_configs,
        cursor_offsets=None if full else cursor_offsets,
        quarantine=quarantine if spec.errors_tolerance == "all" else None,
    )
    if not full:
        return PipelineAudit(commits, budget=spec.audit_recount_offsets)
    replicas = replica_support(spec)  # the names MM2 gives each topic, with replicas only
    families = replicas.name_families(spec) if replicas is not None else []
    rows = audit_table(table, spec.consumer_group_id, quarantine, families=families)
    if spec.replicas:
        expired, oldest = count_expired_snapshots(table)
        ranges = RangeRecount(
            expired_snapshots=expired,
            oldest_snapshot=oldest,
            by_commit_only=True,
            unchecked=[
                "no partition range-recounted: the pipeline has replicas, and a switch may have "
                "read part of a range on another cluster under other names; its commits left "
                "are recounted one by one"
            ],
        )
    else:
        ranges = recount_committed_ranges(
            table,
            spec.consumer_group_id,
            kafka_config,
            spec.name,
            quarantine=quarantine,
            starting_position=spec.starting_position,
            upsert=spec.mode == "upsert",
        )
    return PipelineAudit(commits, rows, ranges=ranges)
