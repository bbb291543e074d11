"""Table maintenance that never loses the offsets watermark (rule 7): snapshot expiry,
orphan-file removal and small-file compaction.

Expiry keeps every snapshot on the path from the current snapshot back to the newest one that
carries each group's offsets (the ancestry must stay walkable, R31). Compaction rewrites small
files of one partition into target-size files in a snapshot that carries no offsets, so the
offsets stay where they are and the audit sees no new records.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion._pyiceberg_compat import write_data_files
from ingestion.commit import commit_view
from ingestion.hooks import NO_HOOKS, FailureHooks
from ingestion.offsets import OFFSETS_PREFIX, iter_ancestry, snapshot_properties
from ingestion.recovery import OrphanFile, remove_orphan_files

if TYPE_CHECKING:
    from pyiceberg.table import Table

MAINTENANCE = "kafka.maintenance"


@dataclass
class MaintenanceReport:
    """What one maintenance pass did."""

    expired_snapshots: int = 0
    kept_for_watermark: int = 0
    orphans_removed: list[OrphanFile] = field(default_factory=list)
    files_compacted: int = 0
    files_written: int = 0
    rows_rewritten: int = 0


def watermark_path(table: Table) -> set[int]:
    """Snapshot ids from the current snapshot back to the newest carrier of every group's
    offsets: expiring any of them would make a watermark unreachable."""
    path: set[int] = set()
    groups = {
        key
        for snapshot in iter_ancestry(table)
        for key in snapshot_properties(snapshot)
        if key.startswith(OFFSETS_PREFIX)
    }
    for snapshot in iter_ancestry(table):
        path.add(snapshot.snapshot_id)
        groups -= set(snapshot_properties(snapshot))
        if not groups:
            break
    return path


def expire_snapshots(
    table: Table, older_than_ms: int, hooks: FailureHooks = NO_HOOKS
) -> tuple[int, int]:
    """Expire snapshots older than ``older_than_ms`` except the current one and the watermark
    path; return (expired, kept only for the watermark)."""
    keep = watermark_path(table)
    old = [s for s in table.metadata.snapshots if s.timestamp_ms < older_than_ms]
    expired = [s.snapshot_id for s in old if s.snapshot_id not in keep]
    if expired:
        hooks.fire("before_expiry_commit", table=table, expired=expired)
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    return len(expired), sum(1 for s in old if s.snapshot_id in keep)


def compact_small_files(
    table: Table, min_files: int = 2, hooks: FailureHooks = NO_HOOKS
) -> tuple[int, int, int]:
    """Rewrite each partition's files below half the target size into target-size files.

    Delivery: one snapshot per partition, without offsets; if the table changed meanwhile the
    commit fails (no retry) and nothing is lost. Returns (files removed, written, rows).
    """
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    target = int(table.metadata.properties.get("write.target-file-size-bytes", 128 * 2**20))
    groups: dict[Any, list[Any]] = defaultdict(list)
    for task in table.scan().plan_files():
        if task.file.file_size_in_bytes < target // 2 and not task.delete_files:
            groups[(task.file.spec_id, str(task.file.partition))].append(task)
    removed = written = rows = 0
    for tasks in groups.values():
        if len(tasks) < min_files:
            continue
        data = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
        new_files = write_data_files(table.metadata, table.io, data)
        properties = {MAINTENANCE: "compaction"}
        hooks.fire("before_compaction_commit", table=table, files=[t.file for t in tasks])
        with (
            commit_view(table).transaction() as transaction,
            transaction.update_snapshot(snapshot_properties=properties).overwrite() as rewrite,
        ):
            for task in tasks:
                rewrite.delete_data_file(task.file)
            for data_file in new_files:
                rewrite.append_data_file(data_file)
        table.refresh()
        removed, written, rows = (
            removed + len(tasks),
            written + len(new_files),
            rows + data.num_rows,
        )
    return removed, written, rows


def maintain_table(
    table: Table,
    snapshot_retention_s: float,
    orphan_window_s: float,
    compact: bool = True,
    hooks: FailureHooks = NO_HOOKS,
) -> MaintenanceReport:
    """Compact, expire, then remove orphans older than the window (never a run's fresh files)."""
    report = MaintenanceReport()
    if compact:
        report.files_compacted, report.files_written, report.rows_rewritten = compact_small_files(
            table, hooks=hooks
        )
    cutoff = int((time.time() - snapshot_retention_s) * 1000)
    report.expired_snapshots, report.kept_for_watermark = expire_snapshots(table, cutoff, hooks)
    table.refresh()
    report.orphans_removed = remove_orphan_files(table, older_than_s=orphan_window_s)
    return report
