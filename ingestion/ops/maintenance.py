"""Table maintenance that never loses the offsets watermark (rule 7) and is safe on a busy
table: incremental compaction (``ingestion.ops.compaction``), snapshot expiry, orphan removal.

Expiry keeps every snapshot on the path from each branch head back to the newest snapshot
that carries each live group's offsets (the ancestry must stay walkable, R31). A group a
migration retired (``kafka.retired-groups``, or the older ``kafka.migrated-from``) is not live:
its last commit no longer pins everything after it (R42); the pipeline's current group is
always kept. Expiry is a compare-and-set on every branch and tag head: if one moved (a commit,
a rollback by another tool) it is planned again from the new heads (R43).

Orphan removal waits for a safety window that is never shorter than the longest run the
table has recorded (``kafka.run-duration-ms``, plan to commit) times :data:`RUN_WINDOW_FACTOR`,
nor than a floor: a run still in flight may yet commit the files it wrote.

Each step runs even when an earlier one failed; failures are collected in the report. The steps
(:data:`MAINTENANCE_STEPS`) may be chosen, and a dry run plans each and changes nothing: the
compaction groups it would merge, the snapshots it would expire, the orphans it would remove.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingestion import exceptions
from ingestion.ops.compaction import (
    CompactionReport,
    compact_small_files,
    live_tasks,
    plan_groups,
    target_file_bytes,
)
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.pipeline.recovery import OrphanFile, list_orphan_files, remove_orphan_files
from ingestion.quarantine.sync import (
    named_quarantine_files,
    sync_quarantine,
    unsynced_snapshot_ids,
)
from ingestion.table.offsets import (
    MIGRATED_FROM,
    OFFSETS_PREFIX,
    RETIRED_GROUPS,
    RUN_DURATION_MS,
    snapshot_properties,
)
from ingestion.table.route import route_snapshots

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.table.update import TableRequirement

    from ingestion.spec.pipeline import PipelineSpec

MAINTENANCE_STEPS = ("compact", "expire", "orphans")  # in the order they run
MIN_ORPHAN_WINDOW_S = 3600.0  # the floor: runs longer than any yet recorded stay safe
RUN_WINDOW_FACTOR = 2.0  # the window covers twice the longest recorded run


@dataclass
class MaintenanceReport:
    """What one maintenance pass did, and what it could not do (``errors``)."""

    compaction: CompactionReport = field(default_factory=CompactionReport)
    expired_snapshots: int = 0
    kept_for_watermark: int = 0
    orphans_removed: list[OrphanFile] = field(default_factory=list)
    orphan_window_s: float = 0.0
    orphan_window_reason: str = ""
    errors: list[str] = field(default_factory=list)
    quarantine: MaintenanceReport | None = None  # the pipeline's quarantine table, maintained alike
    steps: tuple[str, ...] = MAINTENANCE_STEPS
    dry_run: bool = False
    compaction_plan: dict[str, int] = field(default_factory=dict)  # dry run: partition -> files

    @property
    def files_compacted(self) -> int:
        """Small files removed by compaction."""
        return self.compaction.files_compacted

    @property
    def files_written(self) -> int:
        """Files compaction wrote."""
        return self.compaction.files_written

    @property
    def rows_rewritten(self) -> int:
        """Rows compaction read and wrote again (its cost)."""
        return self.compaction.rows_rewritten

    @property
    def groups_retried(self) -> int:
        """Compaction commits repeated on a new head (inputs unchanged)."""
        return self.compaction.groups_retried

    def describe(self) -> list[str]:
        """The lines an operator reads (CLI, Dagster metadata)."""
        c = self.compaction
        would = "would " if self.dry_run else ""
        lines = []
        if "compact" in self.steps and self.dry_run:
            files = sum(self.compaction_plan.values())
            lines.append(
                f"would compact {files} files in {len(self.compaction_plan)} partition(s)"
                + "".join(
                    f"; {key or 'unpartitioned'}: {n}" for key, n in self.compaction_plan.items()
                )
            )
        elif "compact" in self.steps:
            lines.append(
                f"compacted {c.files_compacted} files into {c.files_written} ({c.rows_rewritten} "
                f"rows rewritten; {c.groups_retried} commits retried on a new head, "
                f"{c.groups_replanned} groups re-planned, {len(c.groups_skipped)} skipped)"
            )
        if "expire" in self.steps:
            lines.append(
                f"{would}expire{'' if would else 'd'} {self.expired_snapshots} snapshots, "
                f"kept {self.kept_for_watermark} for the offsets watermark"
            )
        if "orphans" in self.steps:
            lines.append(
                f"{would}remove{'' if would else 'd'} {len(self.orphans_removed)} orphan files "
                f"older than {self.orphan_window_s / 3600:.2f} h ({self.orphan_window_reason})"
            )
        lines += [f"skipped compaction of {s}" for s in c.groups_skipped]
        if c.stopped:
            lines.append(f"compaction stopped early ({c.stopped}); the next pass goes on")
        lines += [f"FAILED {e}" for e in self.errors]
        if self.quarantine is not None:
            own = [
                line
                for line in self.quarantine.describe()
                if not line.startswith(("FAILED", "dry run"))
            ]
            lines += [f"quarantine table: {line}" for line in own]  # its errors are ours
        if self.dry_run:
            lines.append("dry run: nothing changed (add --apply)")
        return lines


def live_groups(ancestry: list[Snapshot], keep: Set[str]) -> set[str]:
    """Groups whose offsets must stay reachable: for each group, the newest snapshot that
    mentions it decides (carries its offsets: live; retires it: not), plus ``keep``."""
    decided: dict[str, bool] = {}
    for snapshot in ancestry:  # newest first
        properties = snapshot_properties(snapshot)
        retired = {g for g in properties.get(RETIRED_GROUPS, "").split(",") if g}
        retired |= {properties[MIGRATED_FROM]} if MIGRATED_FROM in properties else set()
        for group in retired:
            decided.setdefault(group, False)
        for key in properties:
            if key.startswith(OFFSETS_PREFIX):
                decided.setdefault(key.removeprefix(OFFSETS_PREFIX), True)
    return {g for g, live in decided.items() if live} | (keep & set(decided))


def watermark_path(table: Table, head: Snapshot | None, keep: Set[str] = frozenset()) -> set[int]:
    """Snapshot ids from ``head`` back to the newest carrier of every live group's offsets
    (:func:`live_groups`): expiring any of them would make a watermark unreachable; and, for a
    group that reads a replica, back past its failover switch
    (:func:`~ingestion.table.route.route_snapshots`)."""
    from pyiceberg.table.snapshots import ancestors_of

    ancestry = list(ancestors_of(head, table.metadata))
    live = live_groups(ancestry, keep)
    wanted = {OFFSETS_PREFIX + g for g in live}
    path: set[int] = set()
    for snapshot in ancestry:
        if not wanted:
            break
        path.add(snapshot.snapshot_id)
        wanted -= set(snapshot_properties(snapshot))
    for group in live:  # the route, and the failover a failback would undo (R49)
        path |= route_snapshots(ancestry, group)
    return path


# The audit's cursor holds back expiry for at most this long (or 4 retentions): a stuck audit
# must not grow a stream's history without bound (its check reports it).
AUDIT_KEEP_MAX_S = 24 * 3600


def path_after(table: Table, head: Snapshot | None, snapshot_id: int | None) -> set[int]:
    """Snapshot ids from ``head`` back to ``snapshot_id`` (the exactly-once audit's cursor:
    the commits after it are not audited yet), {} when it is not in ``head``'s ancestry."""
    from pyiceberg.table.snapshots import ancestors_of

    if snapshot_id is None:
        return set()
    path: set[int] = set()
    for snapshot in ancestors_of(head, table.metadata):
        path.add(snapshot.snapshot_id)
        if snapshot.snapshot_id == snapshot_id:
            return path
    return set()


def expire_snapshots(
    table: Table,
    older_than_ms: int,
    keep_groups: Set[str] = frozenset(),
    hooks: FailureHooks = NO_HOOKS,
    max_attempts: int = 5,
    quarantine: Table | None = None,
    keep_after: int | None = None,
    dry_run: bool = False,
) -> tuple[int, int]:
    """Expire snapshots older than ``older_than_ms`` except the heads of branches and tags,
    their watermark paths, and the commits the quarantine table has not followed yet (their
    snapshots alone name those dead letters' files); return (expired, kept only for the
    watermark). ``dry_run``: count them, expire nothing.

    Delivery: a compare-and-set on every ref's head; when one moved it is planned again.

    Raises:
        MaintenanceConflictError: the heads moved at each of ``max_attempts`` tries.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID, RemoveSnapshotsUpdate

    for _ in range(max_attempts):
        table.refresh()
        metadata = table.metadata
        heads = {ref.snapshot_id for ref in metadata.refs.values()}
        path: set[int] = set()
        if quarantine is not None:
            quarantine.refresh()
            path |= unsynced_snapshot_ids(table, quarantine)
        for head in heads:
            path |= watermark_path(table, metadata.snapshot_by_id(head), keep_groups)
            path |= path_after(table, metadata.snapshot_by_id(head), keep_after)
        old = [s for s in metadata.snapshots if s.timestamp_ms < older_than_ms]
        expired = [s.snapshot_id for s in old if s.snapshot_id not in heads | path]
        kept = sum(1 for s in old if s.snapshot_id in path - heads)
        if not expired or dry_run:
            return len(expired), kept
        hooks.fire("before_expiry_commit", table=table, expired=expired)
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=metadata.table_uuid),
            *(
                AssertRefSnapshotId.model_validate({"snapshot-id": r.snapshot_id, "ref": name})
                for name, r in metadata.refs.items()
            ),
        )
        removal = RemoveSnapshotsUpdate.model_validate({"snapshot-ids": expired})
        try:
            table.catalog.commit_table(table, requirements, (removal,))
        except CommitFailedException:
            continue
        return len(expired), kept
    raise exceptions.MaintenanceConflictError(
        f"table {'.'.join(table.name())}: snapshot expiry lost its compare-and-set "
        f"{max_attempts} times (the table kept changing); nothing was expired"
    )


def longest_run_s(table: Table) -> float:
    """The longest run (plan to commit) recorded by the snapshots still in the metadata."""
    durations = [
        int(snapshot_properties(s).get(RUN_DURATION_MS, "0")) for s in table.metadata.snapshots
    ]
    return max(durations, default=0) / 1000


def orphan_window(requested_s: float, longest_s: float, floor_s: float) -> tuple[float, str]:
    """The safety window to use and why: never below ``RUN_WINDOW_FACTOR`` x the longest run
    seen, nor below ``floor_s`` (pure).

    Example:
        >>> orphan_window(0, 90, 3600)
        (3600, 'raised from 0.00 h to the floor of 1.00 h')
        >>> orphan_window(60, 90, 0)
        (180.0, 'raised from 0.02 h to 2 x the longest run seen (90 s)')
        >>> orphan_window(72 * 3600, 90, 3600)
        (259200, 'as requested')
    """
    by_runs = RUN_WINDOW_FACTOR * longest_s
    window = max(requested_s, floor_s, by_runs)
    if window == requested_s:
        return window, "as requested"
    if window == by_runs:
        return window, (
            f"raised from {requested_s / 3600:.2f} h to {RUN_WINDOW_FACTOR:g} x the longest "
            f"run seen ({longest_s:.0f} s)"
        )
    return window, f"raised from {requested_s / 3600:.2f} h to the floor of {floor_s / 3600:.2f} h"


def maintain_table(
    table: Table,
    snapshot_retention_s: float,
    orphan_window_s: float,
    compact: bool = True,
    hooks: FailureHooks = NO_HOOKS,
    *,
    group_id: str | None = None,
    min_orphan_window_s: float = MIN_ORPHAN_WINDOW_S,
    quarantine: Table | None = None,
    keep_after: int | None = None,
    keep_files: Collection[str] = (),
    yield_to: Callable[[], str | None] | None = None,
    steps: Collection[str] = MAINTENANCE_STEPS,
    dry_run: bool = False,
) -> MaintenanceReport:
    """Compact, expire, then remove orphans older than the safety window (see the module
    docstring), each of ``steps`` only; ``dry_run`` plans them and changes nothing;
    ``group_id`` is the pipeline's current group, whose watermark is always kept;
    ``keep_after`` the exactly-once audit's cursor, after which nothing is expired (R47);
    ``keep_files`` files orphan removal keeps though no snapshot of ``table`` names them;
    ``yield_to`` may stop compaction between two groups (``compact_small_files``).

    Delivery: every step is a compare-and-set or provably safe, and is safe to repeat; a step
    that fails (a lost race, a refusal) is reported in ``errors`` and the next steps still run.
    """
    report = MaintenanceReport(steps=tuple(s for s in MAINTENANCE_STEPS if s in steps))
    report.dry_run = dry_run
    report.orphan_window_s, report.orphan_window_reason = orphan_window(
        orphan_window_s, longest_run_s(table), min_orphan_window_s
    )
    if compact and "compact" in steps and dry_run:
        groups = plan_groups(live_tasks(table), target_file_bytes(table))
        report.compaction_plan = {key: len(tasks) for key, tasks in sorted(groups.items())}
    elif compact and "compact" in steps:
        try:
            report.compaction = compact_small_files(table, hooks, yield_to)
        except Exception as exc:
            report.errors.append(f"compaction: {exc}")
    elif "compact" in report.steps:
        report.steps = tuple(s for s in report.steps if s != "compact")
    cutoff = int((time.time() - snapshot_retention_s) * 1000)
    keep = {group_id} if group_id else set()
    cursor = table.metadata.snapshot_by_id(keep_after) if keep_after is not None else None
    bound_s = max(AUDIT_KEEP_MAX_S, 4 * snapshot_retention_s)
    if cursor is not None and cursor.timestamp_ms < (time.time() - bound_s) * 1000:
        report.errors.append(
            f"the exactly-once audit's cursor (snapshot {keep_after}) is older than "
            f"{bound_s / 3600:.1f} h: the commits after it are no longer kept from expiry, so "
            "history stays bounded; the audit is stuck or far behind (see its check, "
            "exactly_once_audit)"
        )
        keep_after = None
    if "expire" in steps:
        try:
            report.expired_snapshots, report.kept_for_watermark = expire_snapshots(
                table,
                cutoff,
                keep,
                hooks,
                quarantine=quarantine,
                keep_after=keep_after,
                dry_run=dry_run,
            )
        except Exception as exc:
            report.errors.append(f"snapshot expiry: {exc}")
    if "orphans" in steps:
        try:
            table.refresh()
            find = list_orphan_files if dry_run else remove_orphan_files
            report.orphans_removed = find(table, report.orphan_window_s, keep=keep_files)
        except Exception as exc:
            report.errors.append(f"orphan removal: {exc}")
    return report


def maintain_pipeline(
    catalog: Catalog,
    spec: PipelineSpec,
    snapshot_retention_s: float,
    orphan_window_s: float,
    compact: bool = True,
    hooks: FailureHooks = NO_HOOKS,
    keep_after: int | None = None,
    yield_to: Callable[[], str | None] | None = None,
    steps: Collection[str] = MAINTENANCE_STEPS,
    dry_run: bool = False,
) -> MaintenanceReport:
    """Maintain the pipeline's table: bring its quarantine table up to date first (so expiry
    has as little as possible to keep for it), then :func:`maintain_table` with the pipeline's
    current group, its quarantine table and the audit's cursor (``keep_after``); then the
    quarantine table the same way (R33), so a dirty stream's quarantine commits do not grow its
    history without bound.

    The quarantine table's state lives in its table properties, not its snapshots
    (ingestion.quarantine.sync), so its snapshots expire like any; its orphan removal keeps
    every file a data commit names (one not synced yet names files no quarantine snapshot
    references) and uses the data table's window (its runs write those files). Its errors
    are the report's errors too: the run alerts.
    """
    quarantine = None
    if catalog.table_exists(spec.quarantine_table):
        # On failure expiry still keeps every commit not yet followed; the next run syncs.
        with contextlib.suppress(exceptions.QuarantineSyncError):
            if not dry_run:
                sync_quarantine(catalog, spec)
        quarantine = catalog.load_table(spec.quarantine_table)
    report = maintain_table(
        catalog.load_table(spec.table),
        snapshot_retention_s,
        orphan_window_s,
        compact,
        hooks,
        group_id=spec.consumer_group_id,
        quarantine=quarantine,
        keep_after=keep_after,
        yield_to=yield_to,
        steps=steps,
        dry_run=dry_run,
    )
    if quarantine is not None:
        try:
            named = named_quarantine_files(catalog.load_table(spec.table), quarantine)
        except Exception as exc:  # without the list, no orphan of it may be judged
            report.errors.append(f"quarantine table: reading the files data commits name: {exc}")
            return report
        report.quarantine = maintain_table(
            quarantine,
            snapshot_retention_s,
            report.orphan_window_s,
            compact,
            hooks,
            keep_files=named,
            yield_to=yield_to,
            steps=steps,
            dry_run=dry_run,
        )
        report.errors += [f"quarantine table: {e}" for e in report.quarantine.errors]
    return report
