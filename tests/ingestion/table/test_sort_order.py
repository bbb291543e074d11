"""Sorting rows by a table's sort order as the spec orders them: transforms, directions, null
order, struct fields, and ties kept in arrival order. Pure pyarrow, no catalog."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform, Transform, TruncateTransform
from pyiceberg.types import LongType, NestedField, StringType, StructType

from ingestion.table.sort_order import sort_rows

SCHEMA = Schema(
    NestedField(1, "region", StringType(), required=False),
    NestedField(2, "n", LongType(), required=False),
    NestedField(3, "s", StructType(NestedField(4, "k", LongType(), required=False)), False),
)
ROWS = pa.table(
    {
        "region": ["us", None, "eu", "us", "eu", None],
        "n": [1, 2, None, 4, 5, 6],
        "s": [{"k": 3}, {"k": 1}, {"k": 2}, {"k": None}, {"k": 0}, {"k": 5}],
    }
)


def field(
    source_id: int,
    direction: SortDirection = SortDirection.ASC,
    nulls: NullOrder = NullOrder.NULLS_FIRST,
    transform: Transform[Any, Any] | None = None,
) -> SortField:
    return SortField(
        source_id=source_id,
        transform=transform or IdentityTransform(),
        direction=direction,
        null_order=nulls,
    )


def test_keys_in_order_each_with_its_direction_and_null_order() -> None:
    order = SortOrder(
        field(1, SortDirection.ASC, NullOrder.NULLS_LAST),
        field(2, SortDirection.DESC, NullOrder.NULLS_FIRST),
    )
    ordered = sort_rows(ROWS, SCHEMA, order)
    assert list(zip(ordered["region"].to_pylist(), ordered["n"].to_pylist(), strict=True)) == [
        ("eu", None),
        ("eu", 5),
        ("us", 4),
        ("us", 1),
        (None, 6),
        (None, 2),
    ]


def test_a_transform_sorts_by_its_value_and_ties_keep_their_arrival_order() -> None:
    rows = pa.table({"region": ["a"] * 5, "n": [25, 3, 21, 9, 27], "s": [{"k": 0}] * 5})
    order = SortOrder(field(2, transform=TruncateTransform(10)))
    assert sort_rows(rows, SCHEMA, order)["n"].to_pylist() == [3, 9, 25, 21, 27]


def test_a_struct_field_is_a_sort_key() -> None:
    order = SortOrder(field(4, SortDirection.DESC, NullOrder.NULLS_LAST))
    assert sort_rows(ROWS, SCHEMA, order)["n"].to_pylist() == [6, 1, None, 2, 5, 4]


def test_no_order_leaves_the_rows_as_they_came() -> None:
    assert sort_rows(ROWS, SCHEMA, None) is ROWS
