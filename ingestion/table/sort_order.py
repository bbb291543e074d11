"""The table's sort order, honoured by our writers as other engines honour it.

A table may declare a default sort order (``ALTER TABLE ... WRITE ORDERED BY`` in Spark,
``replace_sort_order`` in pyiceberg). Spark and Flink sort the rows of each file they write by
it, which tightens every column's bounds (readers skip more row groups and files) and lets
readers merge files. pyiceberg 0.12's writer ignores it. Our writers (the executor tasks'
:class:`~ingestion.task.writer.FanoutWriter` and compaction) sort each run of rows they write
with :func:`sort_rows`, and mark a data file with the order's id (``sort_order_id``) only when
the whole file is one sorted run, as the spec asks: a file of several runs is left unmarked.

Sort keys follow the spec: each field's transform of its source column (a struct's field
included), ascending or descending, nulls first or last. Two limits, both safe:

- Arrow orders floating-point NaN and -0.0 otherwise than the spec, and the spec's order of
  UUIDs is engine-specific: files sorted on such a key are sorted but not marked
  (:func:`marks_files`).
- An order our writers cannot compute (a transform with no Arrow implementation, a type Arrow
  cannot sort) is logged and not applied: files are written in arrival order, unmarked. Sorting
  never fails a write.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.sorting import SortOrder


def write_order(metadata: TableMetadata) -> SortOrder | None:
    """The table's default sort order, or ``None`` when it is unsorted or our writers cannot
    compute one of its keys (logged)."""
    order = metadata.sort_order()
    if order.is_unsorted:
        return None
    schema = metadata.schema()
    for field in order.fields:
        try:
            field.transform.pyarrow_transform(schema.find_type(field.source_id))
        except (NotImplementedError, ValueError, AttributeError) as exc:
            log.warning(
                "sort order %s is not applied: %s has no Arrow form (%s)", order, field, exc
            )
            return None
    return order


def marks_files(metadata: TableMetadata, order: SortOrder) -> bool:
    """Whether files sorted by ``order`` may say so (``sort_order_id``): not when a key is a
    float, a double or a UUID, which Arrow orders otherwise than Iceberg's engines."""
    from pyiceberg.types import DoubleType, FloatType, UUIDType

    schema = metadata.schema()
    for field in order.fields:
        kind = field.transform.result_type(schema.find_type(field.source_id))
        if isinstance(kind, FloatType | DoubleType | UUIDType):
            return False
    return True


def try_sort_rows(rows: pa.Table, schema: Schema, order: SortOrder | None) -> pa.Table | None:
    """:func:`sort_rows`, or ``None`` (logged) when Arrow cannot sort these keys."""
    try:
        return sort_rows(rows, schema, order)
    except (pa.ArrowException, NotImplementedError) as exc:
        log.warning("rows written unsorted: sort order %s failed (%s)", order, exc)
        return None


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
        if isinstance(value.type, pa.BaseExtensionType):  # uuid: by its 16 bytes
            value = pa.chunked_array([c.storage for c in value.chunks], value.type.storage_type)
        keys[f"null_{index}"], keys[f"value_{index}"] = pc.is_null(value), value
        nulls_first = field.null_order == NullOrder.NULLS_FIRST
        ascending = field.direction == SortDirection.ASC
        sort_keys.append((f"null_{index}", "descending" if nulls_first else "ascending"))
        sort_keys.append((f"value_{index}", "ascending" if ascending else "descending"))
    indices = pc.sort_indices(pa.table(keys), sort_keys=sort_keys)
    return rows.take(indices)
