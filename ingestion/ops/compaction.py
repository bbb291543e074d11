"""Small-file compaction that costs what is new and is safe on a busy table (R40, R41).

**What is rewritten.** In each partition, the files below half the target size are sorted by
record count, and the longest prefix whose last file holds no more records than all the files
before it together is merged (:func:`pick_merge`). Every file merged thus ends in an output at
least twice its size, so a record is rewritten at most log2(target / first file) times in its
life and a pass costs, amortised, a constant times what arrived since the last one. After a
pass, each small file of a partition holds more records than all the smaller ones together, so
a pass with nothing new rewrites nothing, and a right-sized output is not read again until
as much new data has arrived beside it. No marker is needed: the rule reads file sizes only, so
it survives snapshot expiry.

**How it commits.** One snapshot per partition group, planned from the current head and
committed against that head (pyiceberg's retry off, ``commit_view``). When the head moved,
the group is checked again on the new head: if its input files are all still live and no
delete file applies to them (an ingestion append, another partition's compaction), it is
committed there; otherwise (a reset deleted rows, another compaction took them) its outputs
are deleted and it is planned again from the new head, a bounded number of times. Deleted
rows can therefore never come back. A group that cannot commit is skipped and reported; it
never raises out of the pass.

**How outputs are written.** As the table's properties say (target file size, Parquet codec and
settings, as pyiceberg writes them) and, when the table declares a sort order, sorted by it and
marked sorted (``ingestion.table.sort_order``): merged files come out ordered even when the
small ones were written in several runs.

**What is checked before a commit.** The outputs' metrics must count, per field, as many
values and nulls as the inputs' (:func:`counts_differ`, metadata only): a rewrite that lost
or nulled values is deleted and reported, never committed. A retry after the head moved also
needs the table's partition spec and schema unchanged (the outputs were written for them).

**What readers see.** Each group is one ``replace`` snapshot, as Spark's ``rewrite_data_files``
writes (the same rows in new files), marked ``kafka.maintenance=compaction``: incremental
readers (Spark's and Flink's incremental and changelog scans, streaming reads) skip it, and the
audit passes it from its summary counts. It carries no offsets, so offsets are unaffected (rule
7). pyiceberg 0.12 has no public call for ``replace`` (``_pyiceberg_compat.replace_files``);
tables compacted before it was used hold ``overwrite`` snapshots with the same marker, which
the audit passes alike.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingestion._pyiceberg_compat import replace_files
from ingestion.pipeline.commit import delete_files
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks
from ingestion.table.offsets import iter_ancestry, snapshot_properties
from ingestion.table.sort_order import try_sort_rows, write_order
from ingestion.table.transaction import commit_view
from ingestion.task.writer import write_data_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

MAINTENANCE = "kafka.maintenance"
COMPACTION_ID = "kafka.compaction-id"  # finds the commit again after an ambiguous error
DEFAULT_TARGET_BYTES = 128 * 2**20
MAX_GROUP_TARGETS = 2  # bytes one group may read, in target file sizes


@dataclass
class CompactionReport:
    """What one compaction pass did, per group outcome."""

    files_compacted: int = 0
    files_written: int = 0
    rows_rewritten: int = 0
    groups_retried: int = 0
    groups_replanned: int = 0
    groups_skipped: list[str] = field(default_factory=list)
    stopped: str = ""  # why the pass stopped before its last group (it yielded), "" otherwise


def pick_merge(record_counts: list[int], min_files: int = 2) -> int:
    """How many of the smallest files (``record_counts`` ascending) to merge: the longest
    prefix whose last file holds no more records than all before it; 0 below ``min_files``.

    Example:
        >>> pick_merge([10, 10, 10, 120])   # new files beside a compacted one: only the new
        3
        >>> pick_merge([20, 120])           # one small file beside a bigger one: nothing
        0
        >>> pick_merge([3, 10, 10])         # a small old file joins a bigger new batch
        3
    """
    total, chosen = 0, 0
    for index, count in enumerate(record_counts):
        if index > 0 and count <= total:
            chosen = index + 1
        total += count
    return chosen if chosen >= min_files else 0


def target_file_bytes(table: Table) -> int:
    """The table's ``write.target-file-size-bytes`` (pyiceberg's default otherwise)."""
    return int(table.metadata.properties.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES))


def plan_groups(tasks: list[FileScanTask], target_bytes: int) -> dict[str, list[FileScanTask]]:
    """Per partition, the small files to merge now (see :func:`pick_merge`), at most
    :data:`MAX_GROUP_TARGETS` target sizes of them (a group is read into memory at once; the
    rest waits for the next pass); files with delete files are left alone."""
    by_partition: dict[str, list[FileScanTask]] = defaultdict(list)
    for task in tasks:
        if task.file.file_size_in_bytes < target_bytes // 2 and not task.delete_files:
            by_partition[f"{task.file.spec_id}/{task.file.partition}"].append(task)
    groups = {}
    for key, small in by_partition.items():
        small.sort(key=lambda t: (t.file.record_count, t.file.file_path))
        chosen = small[: pick_merge([t.file.record_count for t in small])]
        total = 0
        for index, task in enumerate(chosen):
            total += task.file.file_size_in_bytes
            if index >= 2 and total > MAX_GROUP_TARGETS * target_bytes:
                chosen = chosen[:index]
                break
        if chosen:
            groups[key] = chosen
    return groups


def live_tasks(table: Table) -> list[FileScanTask]:
    return list(table.scan().plan_files()) if table.current_snapshot() else []


def _still_live(table: Table, inputs: list[DataFile]) -> bool:
    """Every input is a live data file of the current head with no delete file applying."""
    live = {task.file.file_path: task for task in live_tasks(table)}
    return all(f.file_path in live and not live[f.file_path].delete_files for f in inputs)


def _commit_rewrite(
    table: Table, inputs: list[DataFile], outputs: list[DataFile], commit_id: str
) -> None:
    """One replace snapshot removing ``inputs`` and adding ``outputs`` (the same rows), against
    the head ``table`` was loaded at (no retry: a moved head raises ``CommitFailedException``)."""
    properties = {MAINTENANCE: "compaction", COMPACTION_ID: commit_id}
    with (
        commit_view(table).transaction() as transaction,
        replace_files(transaction, table.io, properties) as rewrite,
    ):
        for data_file in inputs:
            rewrite.delete_data_file(data_file)
        for data_file in outputs:
            rewrite.append_data_file(data_file)


def _write_sorted(table: Table, rows: pa.Table) -> list[DataFile]:
    """Write ``rows`` as new data files of ``table`` (the executors' writer: the table's write
    properties, fresh file names), sorted as one run by the table's sort order if it has one.

    Delivery: commits nothing; files of a group that does not commit are deleted by the caller
    or, after a crash, removed as orphans by recovery.
    """
    ordered = try_sort_rows(rows, table.schema(), write_order(table.metadata))
    return write_data_files(
        table.metadata,
        table.io,
        [rows if ordered is None else ordered],
        sorted_input=ordered is not None,
    )


def counts_differ(inputs: list[DataFile], outputs: list[DataFile]) -> str:
    """What a rewrite changed by the files' own metrics: per field id, the values and the
    nulls the inputs hold against the outputs' ("" when they agree). Only fields every file
    counts are compared (another engine may keep no metrics for some columns).

    Example:
        >>> from types import SimpleNamespace as F
        >>> old = [F(value_counts={1: 2, 2: 2}, null_value_counts={1: 0, 2: 1})] * 2
        >>> counts_differ(old, [F(value_counts={1: 4, 2: 4}, null_value_counts={1: 0, 2: 2})])
        ''
        >>> counts_differ(old, [F(value_counts={1: 4, 2: 4}, null_value_counts={1: 0, 2: 4})])
        'null_value_counts of field 2: 2 -> 4'
    """
    for metric in ("value_counts", "null_value_counts"):
        counted = [getattr(f, metric) or {} for f in [*inputs, *outputs]]
        fields = set.intersection(*(set(c) for c in counted)) if counted else set()
        for field_id in sorted(fields):
            before = sum(c[field_id] for c in counted[: len(inputs)])
            after = sum(c[field_id] for c in counted[len(inputs) :])
            if before != after:
                return f"{metric} of field {field_id}: {before} -> {after}"
    return ""


def _landed(table: Table, commit_id: str) -> bool:
    """Whether a compaction commit with ``commit_id`` is in the current ancestry."""
    return any(snapshot_properties(s).get(COMPACTION_ID) == commit_id for s in iter_ancestry(table))


def compact_group(
    table: Table,
    key: str,
    report: CompactionReport,
    hooks: FailureHooks = NO_HOOKS,
    max_plans: int = 3,
    max_attempts: int = 5,
) -> None:
    """Plan the partition ``key`` from the current head, rewrite it, commit it (see the module
    docstring); record the outcome in ``report``.

    Delivery: at most one commit per call. After an ambiguous catalog error the commit is
    looked up by its id; outputs are deleted only when it certainly did not land.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    for _ in range(max_plans):
        table.refresh()
        group = plan_groups(live_tasks(table), target_file_bytes(table)).get(key)
        if not group:
            return  # nothing (left) to merge here
        rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(group)
        inputs = [task.file for task in group]
        layout = (table.metadata.default_spec_id, table.metadata.current_schema_id)
        outputs = _write_sorted(table, rows)
        if differs := counts_differ(inputs, outputs):  # the rewrite changed values: never commit
            delete_files(table, outputs)
            report.groups_skipped.append(f"{key}: refused, the rewrite changed {differs}")
            return
        commit_id = uuid.uuid4().hex
        for _attempt in range(max_attempts):
            hooks.fire("before_compaction_commit", table=table, files=inputs)
            try:
                _commit_rewrite(table, inputs, outputs, commit_id)
            except CommitFailedException:
                table.refresh()  # the head moved: are our inputs still what the table holds?
                if not _still_live(table, inputs) or layout != (
                    table.metadata.default_spec_id,  # the outputs' partitioning and columns
                    table.metadata.current_schema_id,
                ):
                    break
                report.groups_retried += 1
                continue
            except Exception as exc:  # ambiguous: keep the files unless it surely failed
                table.refresh()
                if not _landed(table, commit_id):
                    report.groups_skipped.append(f"{key}: commit outcome unknown ({exc!r})")
                    return
            report.files_compacted += len(inputs)
            report.files_written += len(outputs)
            report.rows_rewritten += rows.num_rows
            return
        delete_files(table, outputs)  # never committed: the attempt's own files
        if _still_live(table, inputs):
            report.groups_skipped.append(f"{key}: the table kept changing ({max_attempts} tries)")
            return
        report.groups_replanned += 1
    report.groups_skipped.append(f"{key}: inputs kept changing ({max_plans} plans)")


def compact_small_files(
    table: Table,
    hooks: FailureHooks = NO_HOOKS,
    yield_to: Callable[[], str | None] | None = None,
    **limits: Any,
) -> CompactionReport:
    """Compact every partition that has small files to merge, one group at a time; before each
    group ``yield_to`` may give a reason to stop (an operator action on the pipeline: its own
    commit must not lose its compare-and-set to one compaction commit after another), which
    ``report.stopped`` keeps. The groups not reached wait for the next pass.

    Delivery: each group commits at most once, against the head it was planned from or one
    where its inputs are unchanged; a group that keeps losing is skipped, never raised.
    """
    report = CompactionReport()
    table.refresh()
    for key in sorted(plan_groups(live_tasks(table), target_file_bytes(table))):
        if yield_to is not None and (why := yield_to()):
            report.stopped = why
            break
        compact_group(table, key, report, hooks, **limits)
    return report
