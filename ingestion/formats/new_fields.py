"""New fields that decode to different types in one batch: one type per field, never a crash.

Bulk decodes of parts of a batch (``ingestion/formats/bad_values.py``) each infer the type of a
field the table does not have yet; two parts may disagree (``{"x": 1}`` here, ``{"x": "a"}`` there).
Concatenating them used to raise, failing every attempt of the task: a poison pill that stalled the
pipeline. Now each new field gets one type per batch: the types widen like one parse of all the rows
would (int64 and double give double) where Arrow can unify them; where it cannot, the type of the
first row (in offset order) that has the field wins, and the rows whose value does not convert to it
are rejected (quarantined or failing the run like any bad record). The coordinator adds the column
with the winning type; the rerun decodes against it, so the same records are rejected again (the
outcome does not depend on the batch's split).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

Part = tuple[list[int], pa.Table]
"""Rows (positions in the batch, ascending) and their decoded table."""


def _unify(first: pa.DataType, other: pa.DataType) -> pa.DataType:
    """The widened type of two, or ``first`` when Arrow cannot unify them."""
    if first == other or pa.types.is_null(other):
        return first
    if pa.types.is_null(first):
        return other
    try:
        merged = pa.unify_schemas(
            [pa.schema([("f", first)]), pa.schema([("f", other)])], promote_options="permissive"
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return first
    return merged.field("f").type


def reconcile_new_fields(
    parts: list[Part], schema: pa.Schema
) -> tuple[list[Part], list[tuple[int, str]]]:
    """Give each new field (not in ``schema``) one type across ``parts`` (sorted by first
    row); return the parts cast to it and the rows whose value does not convert, with why.

    Example:
        >>> parts = [([0], pa.table({"x": [1]})), ([1, 2], pa.table({"x": ["a", None]}))]
        >>> fixed, bad = reconcile_new_fields(parts, pa.schema([]))
        >>> [t.column("x").to_pylist() for _, t in fixed], bad
        ([[1], [None]], [(1, "new field 'x' is string here, int64 in an earlier record")])
    """
    kinds: dict[str, pa.DataType] = {}
    for _, table in parts:
        for column in table.schema:
            if column.name not in schema.names:
                known = kinds.get(column.name)
                kinds[column.name] = column.type if known is None else _unify(known, column.type)
    fixed: list[Part] = []
    bad: list[tuple[int, str]] = []
    for rows, table in parts:
        for name, kind in kinds.items():
            position = table.schema.get_field_index(name)
            if position < 0 or table.schema.field(position).type == kind:
                continue
            column = table.column(position)
            try:
                table = table.set_column(position, name, column.cast(kind))
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
            valid = pc.is_valid(column)
            why = f"new field {name!r} is {column.type} here, {kind} in an earlier record"
            bad += [(row, why) for row, ok in zip(rows, valid.to_pylist(), strict=True) if ok]
            keep = pc.invert(valid)
            rows = [row for row, ok in zip(rows, keep.to_pylist(), strict=True) if ok]
            table = table.filter(keep)
            nulls = pa.nulls(table.num_rows, kind)
            table = table.set_column(position, name, nulls)
        if rows:
            fixed.append((rows, table))
    return fixed, bad
