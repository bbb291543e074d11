"""Applying keyed changes to a table by copy-on-write, in one snapshot (issue 31, ``mode: upsert``).

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

from ingestion.formats.debezium import DELETE, OP, last_change_per_key

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

INSERTS = "kafka.cdc.inserts"
UPDATES = "kafka.cdc.updates"
DELETES = "kafka.cdc.deletes"
REWRITTEN_FILES = "kafka.cdc.rewritten-files"


@dataclass
class UpsertPlan:
    """What one batch of changes does to the table: files to remove and to add, the counts."""

    removed: list[DataFile] = field(default_factory=list)
    added: list[DataFile] = field(default_factory=list)
    inserts: int = 0
    updates: int = 0
    deletes: int = 0

    def properties(self) -> dict[str, str]:
        """The counts, for the commit's snapshot summary."""
        return {
            INSERTS: str(self.inserts),
            UPDATES: str(self.updates),
            DELETES: str(self.deletes),
            REWRITTEN_FILES: str(len(self.removed)),
        }


def _key_values(table: pa.Table, key_fields: tuple[str, ...]) -> pa.ChunkedArray | pa.Array:
    """One comparable value per row for a key of one or more fields."""
    if len(key_fields) == 1:
        return table.column(key_fields[0])
    parts = [pc.cast(table.column(name), pa.string()) for name in key_fields]
    return pc.binary_join_element_wise(*parts, "\x1f")


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
    values = sorted(v for v in keys.column(key_fields[0]).to_pylist() if v is not None)
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


def commit_upsert(table: Table, plan: UpsertPlan, properties: dict[str, str]) -> int:
    """Commit ``plan`` in one ``overwrite`` snapshot with ``properties`` and the plan's counts,
    against the head ``table`` was loaded at (no retry); the new snapshot's id."""
    from ingestion.pipeline.commit import commit_view

    with commit_view(table).transaction() as transaction:
        update = transaction.update_snapshot(
            snapshot_properties={**properties, **plan.properties()}
        )
        with update.overwrite() as overwrite:
            for data_file in plan.removed:
                overwrite.delete_data_file(data_file)
            for data_file in plan.added:
                overwrite.append_data_file(data_file)
    committed = transaction.table_metadata.current_snapshot()
    assert committed is not None
    return committed.snapshot_id
