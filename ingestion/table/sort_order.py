"""The table's sort order, honoured by our writers as other engines honour it.

A table may declare a default sort order (``ALTER TABLE ... WRITE ORDERED BY`` in Spark,
``replace_sort_order`` in pyiceberg). Spark and Flink sort the rows of each file they write by
it, which tightens every column's bounds (readers skip more row groups and files) and lets
readers merge files. pyiceberg 0.12's writer ignores it. Our writers (the executor tasks'
:class:`~ingestion.task.writer.FanoutWriter` and compaction) sort each run of rows they write
with :func:`sort_rows`, and mark a data file with the order's id (``sort_order_id``) only when
the whole file is one sorted run, as the spec asks: a file of several runs is left unmarked.

Sort keys follow the spec: each field's transform of its source column (a struct's field
included), ascending or descending, nulls first or last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.sorting import SortOrder


def write_order(metadata: TableMetadata) -> SortOrder | None:
    """The table's default sort order, or ``None`` when it is unsorted."""
    order = metadata.sort_order()
    return None if order.is_unsorted else order


def _source_column(rows: pa.Table, schema: Schema, source_id: int) -> pa.ChunkedArray:
    """The column of field ``source_id`` in ``rows`` (in the table's column order, any names),
    found by position: a top-level column or a field of a struct."""
    accessor = schema.accessor_for_field(source_id)
    column = rows.column(accessor.position)
    while accessor.inner is not None:
        accessor = accessor.inner
        column = pc.struct_field(column, [accessor.position])
    return column


def sort_rows(rows: pa.Table, schema: Schema, order: SortOrder | None) -> pa.Table:
    """``rows`` sorted by ``order`` (unchanged when ``order`` is ``None``); stable, so rows
    equal on every key keep their arrival (offset) order.

    Example:
        >>> from pyiceberg.schema import Schema
        >>> from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
        >>> from pyiceberg.transforms import IdentityTransform
        >>> from pyiceberg.types import LongType, NestedField
        >>> schema = Schema(NestedField(1, "n", LongType(), required=False))
        >>> order = SortOrder(SortField(1, IdentityTransform(), SortDirection.DESC,
        ...                             NullOrder.NULLS_FIRST))
        >>> sort_rows(pa.table({"n": [2, None, 3]}), schema, order).column("n").to_pylist()
        [None, 3, 2]
    """
    from pyiceberg.table.sorting import NullOrder, SortDirection
    from pyiceberg.transforms import IdentityTransform

    if order is None or rows.num_rows < 2:
        return rows
    keys: dict[str, pa.ChunkedArray] = {}
    sort_keys: list[tuple[str, str]] = []
    for index, field in enumerate(order.fields):
        value = _source_column(rows, schema, field.source_id)
        if not isinstance(field.transform, IdentityTransform):
            value = field.transform.pyarrow_transform(schema.find_type(field.source_id))(value)
        keys[f"null_{index}"], keys[f"value_{index}"] = pc.is_null(value), value
        nulls_first = field.null_order == NullOrder.NULLS_FIRST
        ascending = field.direction == SortDirection.ASC
        sort_keys.append((f"null_{index}", "descending" if nulls_first else "ascending"))
        sort_keys.append((f"value_{index}", "ascending" if ascending else "descending"))
    indices = pc.sort_indices(pa.table(keys), sort_keys=sort_keys)
    return rows.take(indices)
