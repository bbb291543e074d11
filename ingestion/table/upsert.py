"""Applying keyed changes to a table by copy-on-write, in one snapshot (``mode: upsert``, R57).

A batch's changes (``ingestion.formats.debezium``) are reduced to the last change per key. The
rows of those keys are then replaced wherever they live, also when a delete does not carry the
partition columns:

1. **Find.** The candidate files are those whose bounds on the first key field hold one of the
   batch's keys (a binary search of the sorted keys per file: metadata only). A table sorted by
   the key, by our compaction or by a declared sort order, keeps the candidates few.
2. **Rewrite.** Each candidate is read (its position deletes applied); when it holds a changed
   key, it is rewritten without those rows. A file holding none is left alone.
3. **Write.** The rewritten rows and the batch's upserted rows (the ``after`` images) are
   written by the executors' writer: the table's write properties and sort order.
4. **Commit.** One ``overwrite`` snapshot removes the rewritten files and adds the new ones,
   with the caller's snapshot properties (the offsets, in the same atomic commit) and the
   counts of inserts, updates and deletes.

Readers need no special settings: the table holds only data files with the current state
(no equality deletes, no delete vectors). Copy-on-write costs what the changed keys touch, and
reads stay as fast as an append table's.

Delivery: :func:`plan_upsert` writes files and commits nothing; :func:`commit_upsert` commits
one snapshot against the head the plan read, or raises ``CommitFailedException`` (no retry: the
caller plans again from the new head and deletes the failed plan's files).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ingestion.formats.debezium import DELETE, LSN, OP, last_change_per_key

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

    from ingestion.table.offsets import Witness

INSERTS = "kafka.cdc.inserts"
UPDATES = "kafka.cdc.updates"
DELETES = "kafka.cdc.deletes"
REWRITTEN_FILES = "kafka.cdc.rewritten-files"
# Rows read from the rewritten files, their delete files applied (a file's record count also
# holds rows another engine deleted by position): carried over + updated + deleted.
REWRITTEN_RECORDS = "kafka.cdc.rewritten-records"


@dataclass(frozen=True)
class ChangeCounts:
    """What an upsert commit did, as its snapshot records it (``kafka.cdc.*`` properties)."""

    inserts: int
    updates: int
    deletes: int
    rewritten_files: int
    rewritten_records: int | None  # None: a commit written before the property existed


def read_counts(properties: dict[str, str]) -> ChangeCounts | None:
    """An upsert commit's counts from its snapshot properties; None for any other commit.

    Example:
        >>> read_counts({INSERTS: "2", UPDATES: "1", DELETES: "0"})
        ChangeCounts(inserts=2, updates=1, deletes=0, rewritten_files=0, rewritten_records=None)
        >>> read_counts({"kafka.records": "5"}) is None
        True
    """
    if UPDATES not in properties:
        return None
    records = properties.get(REWRITTEN_RECORDS)
    return ChangeCounts(
        int(properties.get(INSERTS, "0")),
        int(properties[UPDATES]),
        int(properties.get(DELETES, "0")),
        int(properties.get(REWRITTEN_FILES, "0")),
        int(records) if records is not None else None,
    )


@dataclass
class UpsertPlan:
    """What one batch of changes does to the table: files to remove and to add, the counts."""

    removed: list[DataFile] = field(default_factory=list)
    added: list[DataFile] = field(default_factory=list)
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    rows_read: int = 0  # rows of the rewritten files, their delete files applied

    def properties(self) -> dict[str, str]:
        """The counts, for the commit's snapshot summary."""
        return {
            INSERTS: str(self.inserts),
            UPDATES: str(self.updates),
            DELETES: str(self.deletes),
            REWRITTEN_FILES: str(len(self.removed)),
            REWRITTEN_RECORDS: str(self.rows_read),
        }


def _key_values(table: pa.Table, key_fields: tuple[str, ...]) -> pa.ChunkedArray | pa.Array:
    """One comparable value per row for a key of one or more fields: a composite key is its
    fields' bytes, each after its length, so no two keys share a value (``("a:b", "c")`` and
    ``("a", "b:c")`` differ)."""
    if len(key_fields) == 1:
        return table.column(key_fields[0])
    parts: list[Any] = []
    for name in key_fields:
        column = table.column(name)
        if not pa.types.is_binary(column.type) and not pa.types.is_large_binary(column.type):
            column = pc.cast(column, pa.large_string())
        column = pc.cast(column, pa.large_binary())
        size = pc.cast(pc.cast(pc.binary_length(column), pa.large_string()), pa.large_binary())
        parts += [size, column]
    return pc.binary_join_element_wise(*parts, pa.scalar(b":", pa.large_binary()))


def _as_bound_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A key column's values as Iceberg's bounds decode (``from_bytes``): dates as days,
    times and timestamps as microseconds; the others as they are."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        column = pc.cast(pc.cast(column, pa.timestamp("us", kind.tz)), pa.int64())
    elif pa.types.is_date(kind):
        column = pc.cast(pc.cast(column, pa.date32()), pa.int32())
    elif pa.types.is_time(kind):
        column = pc.cast(pc.cast(column, pa.time64("us")), pa.int64())
    return column.to_pylist()


def candidate_files(
    table: Table, keys: pa.Table, key_fields: tuple[str, ...]
) -> list[FileScanTask]:
    """The live files whose bounds on the first key field hold one of ``keys`` (a file
    without bounds on it is a candidate)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    if table.current_snapshot() is None or keys.num_rows == 0:
        return []
    schema = table.schema()
    first = schema.find_field(key_fields[0])
    assert isinstance(first.field_type, PrimitiveType), "a key field is a primitive column"
    values = sorted(v for v in _as_bound_values(keys.column(key_fields[0])) if v is not None)
    candidates = []
    for task in table.scan().plan_files():
        lower = (task.file.lower_bounds or {}).get(first.field_id)
        upper = (task.file.upper_bounds or {}).get(first.field_id)
        if lower is None or upper is None:
            candidates.append(task)
            continue
        low, high = from_bytes(first.field_type, lower), from_bytes(first.field_type, upper)
        at = bisect.bisect_left(values, low)
        if at < len(values) and values[at] <= high:
            candidates.append(task)
    return candidates


def plan_upsert(
    table: Table, changes: pa.Table, key_fields: tuple[str, ...], columns: list[str]
) -> UpsertPlan:
    """Write the files that apply ``changes`` (the batch's decoded changes, in batch order,
    with the :data:`~ingestion.formats.debezium.OP` column) to ``table``'s current head;
    ``columns`` are the table's columns the upserted rows fill (the rest are null).

    Delivery: writes new, uniquely named files and commits nothing; a plan that is not
    committed leaves orphans unless the caller deletes ``plan.added``.
    """
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    from ingestion.task.writer import write_data_files

    if changes.num_rows == 0:
        return UpsertPlan()
    last = last_change_per_key(changes, key_fields)
    keys = _key_values(last, key_fields)
    changed_keys = pa.array(keys)
    plan = UpsertPlan()
    kept: list[pa.Table] = []
    existing: set[Any] = set()
    schema = table.schema()
    for task in candidate_files(table, last.select(list(key_fields)), key_fields):
        rows = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table([task])
        row_keys = _key_values(rows, key_fields)
        changed = pc.is_in(row_keys, value_set=changed_keys)
        if not pc.any(changed).as_py():
            continue
        existing.update(pc.filter(row_keys, changed).to_pylist())
        kept.append(rows.filter(pc.invert(changed)))
        plan.removed.append(task.file)
        plan.rows_read += rows.num_rows
    upserts = last.filter(pc.not_equal(last.column(OP), DELETE))
    for op_is_delete, key in zip(
        pc.equal(last.column(OP), DELETE).to_pylist(), keys.to_pylist(), strict=True
    ):
        found = key in existing
        if op_is_delete:
            plan.deletes += found
        elif found:
            plan.updates += 1
        else:
            plan.inserts += 1
    arrow_schema = schema.as_arrow()
    new_rows = pa.table(
        {
            f.name: upserts.column(f.name)
            if f.name in columns
            else pa.nulls(upserts.num_rows, f.type)
            for f in arrow_schema
        }
    ).cast(arrow_schema)
    kept = [part.cast(arrow_schema) for part in kept]
    plan.added = write_data_files(table.metadata, table.io, [*kept, new_rows])
    return plan


def commit_upsert(
    table: Table,
    plan: UpsertPlan,
    properties: dict[str, str],
    witness: Witness | None = None,
) -> int:
    """Commit ``plan`` in one ``overwrite`` snapshot with ``properties`` and the plan's counts,
    against the head ``table`` was loaded at (no retry); the new snapshot's id.

    When ``properties`` commit a group's offsets, the group's position table property (R56)
    is set in the same metadata commit, with ``witness`` (one row this commit wrote), or the
    previous witness when the commit changes no row and sets no record aside; so is its record
    of what its reads left out on purpose (``ingestion.table.left_out``).
    """
    from ingestion._pyiceberg_compat import overwrite_files
    from ingestion.table.left_out import record_left_out
    from ingestion.table.offsets import GROUP_ID, QUARANTINED, previous_witness, record_position
    from ingestion.table.transaction import commit_view

    group = properties.get(GROUP_ID)
    quarantined = properties.get(QUARANTINED, "0") != "0"
    if group is not None and not (plan.added or plan.removed or quarantined):
        witness = previous_witness(table.metadata.properties, group)
    summary = {**properties, **plan.properties()}
    with commit_view(table).transaction() as transaction:
        if plan.added or plan.removed:  # pyiceberg's overwrite, without its dead manifests
            with overwrite_files(transaction, table.io, summary) as overwrite:
                for data_file in plan.removed:
                    overwrite.delete_data_file(data_file)
                for data_file in plan.added:
                    overwrite.append_data_file(data_file)
        else:  # nothing to change (every record set aside): the offsets alone
            with transaction.update_snapshot(snapshot_properties=summary).fast_append():
                pass
        if group is not None:
            record_position(transaction, group, witness)
            record_left_out(transaction, table, group)
    committed = transaction.table_metadata.current_snapshot()
    assert committed is not None
    return committed.snapshot_id


@dataclass
class ApplyChanges:
    """One batch's changes, applied by :func:`ingestion.pipeline.commit.commit_data` on each
    attempt's fresh head: :meth:`prepare` plans against that head (outside the catalog call:
    a planning error is a named failure, never an unknown commit outcome), then the call
    commits against the same head, or raises ``CommitFailedException`` when the head moved
    (a compaction replaced a candidate file): the caller retries. ``plan`` is the last
    attempt's.

    Delivery: the plan is a pure function of the head and the changes, so an attempt on a new
    head never applies a change twice; the commit carries the offsets (the compare-and-set is
    the caller's). A failed attempt's files are deleted only by the next attempt's
    :meth:`prepare`, which runs once the caller has found that attempt's commit absent from
    the table: a catalog that reports a failure for a commit it applied (a retried call behind
    a proxy, Glue) never loses the files of a landed commit. Files of the last failed attempt
    are orphans for maintenance.
    """

    changes: pa.Table
    key_fields: tuple[str, ...]
    witness: Witness | None = None
    plan: UpsertPlan | None = None
    failed: list[DataFile] = field(default_factory=list)

    def prepare(self, table: Table, pipeline: str) -> None:
        """Plan against ``table``'s head, after deleting a failed attempt's files."""
        from ingestion import exceptions

        for data_file in self.failed:  # not landed: the caller checked the commit id
            table.io.delete(data_file.file_path)
        self.failed = []
        try:
            self.plan = plan_upsert(table, self.changes, self.key_fields, self.changes.column_names)
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise exceptions.UpsertPlanError(
                f"pipeline {pipeline!r}: the batch's changes could not be applied to "
                f"{'.'.join(table.name())} ({type(exc).__name__}: {exc}); nothing was committed"
            ) from exc

    def __call__(self, table: Table, properties: dict[str, str]) -> int:
        from pyiceberg.exceptions import CommitFailedException

        assert self.plan is not None, "prepare() plans each attempt first"
        try:
            return commit_upsert(table, self.plan, properties, self.witness)
        except CommitFailedException:
            self.failed = list(self.plan.added)  # deleted once the retry finds it absent
            raise


def gather_changes(tables: list[pa.Table], key_fields: tuple[str, ...]) -> pa.Table:
    """One batch's changes from its tasks' (each its range's last change per key, the tasks
    in offset order within a partition): the last change per key of them all, in the
    source's log order when every change carries its position (``_cdc_lsn``), else in (topic,
    partition, offset) order. Tables decoded before a schema change of the same run lack its
    columns: they read null."""
    together = pa.concat_tables(tables, promote_options="permissive")
    if LSN in together.column_names and together.column(LSN).null_count == 0:
        # Every change carries its source log position (PostgreSQL's source.lsn): its order
        # is the database's, also across partitions (a key whose partition changed after
        # partitions were added). Arrow's sort is stable: equal positions keep offset order.
        together = together.take(pc.sort_indices(together, [(LSN, "ascending")]))
    return last_change_per_key(together, key_fields)


def upsert_witness(changes: pa.Table) -> Witness | None:
    """A row the batch's commit writes: the upsert with the highest offset in the first
    partition holding one (None when the batch only deletes)."""
    from ingestion.table.offsets import Witness

    upserts = changes.filter(pc.not_equal(changes.column(OP), DELETE))
    if upserts.num_rows == 0:
        return None
    first = upserts.slice(0, 1).to_pylist()[0]
    same = upserts.filter(
        pc.and_(
            pc.equal(upserts.column("_kafka_topic"), first["_kafka_topic"]),
            pc.equal(upserts.column("_kafka_partition"), first["_kafka_partition"]),
        )
    )
    offset = pc.max(same.column("_kafka_offset")).as_py()
    cluster = first.get("_kafka_cluster")
    return Witness(first["_kafka_topic"], first["_kafka_partition"], offset, cluster)
