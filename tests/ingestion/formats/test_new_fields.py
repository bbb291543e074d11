"""New fields decoded to different types in parts of one batch get one type (pure Arrow):
widened as one parse of all rows would where Arrow can unify them, else the first row's type,
with the rows that do not convert rejected; fields the table has are left to the decoder."""

from __future__ import annotations

import pyarrow as pa

from ingestion.formats.new_fields import reconcile_new_fields


def test_int_and_double_parts_widen_to_double() -> None:
    parts = [([0, 2], pa.table({"x": [1, 2]})), ([1], pa.table({"x": [1.5]}))]
    fixed, bad = reconcile_new_fields(parts, pa.schema([]))
    assert bad == []
    assert [rows for rows, _ in fixed] == [[0, 2], [1]]
    assert [t.schema.field("x").type for _, t in fixed] == [pa.float64(), pa.float64()]
    assert [t.column("x").to_pylist() for _, t in fixed] == [[1.0, 2.0], [1.5]]


def test_types_arrow_cannot_unify_keep_the_first_rows_type_and_reject_the_others() -> None:
    """Only the rows holding a value are rejected: a null converts to any type."""
    parts = [
        ([0], pa.table({"x": ["a"]})),
        ([1, 2], pa.table({"x": pa.array([{"k": 1}, None])})),
    ]
    fixed, bad = reconcile_new_fields(parts, pa.schema([]))
    assert bad == [(1, "new field 'x' is struct<k: int64> here, string in an earlier record")]
    assert [(rows, t.column("x").type, t.to_pylist()) for rows, t in fixed] == [
        ([0], pa.string(), [{"x": "a"}]),
        ([2], pa.string(), [{"x": None}]),
    ]


def test_a_part_whose_every_row_is_rejected_is_dropped() -> None:
    parts = [([0], pa.table({"x": [1]})), ([1, 2], pa.table({"x": ["a", "b"]}))]
    fixed, bad = reconcile_new_fields(parts, pa.schema([]))
    assert [rows for rows, _ in fixed] == [[0]]
    assert [row for row, _ in bad] == [1, 2]


def test_an_all_null_part_takes_the_type_the_others_give() -> None:
    parts = [([0], pa.table({"x": pa.nulls(1)})), ([1, 3], pa.table({"x": [7, None]}))]
    fixed, bad = reconcile_new_fields(parts, pa.schema([]))
    assert bad == []
    assert [t.schema.field("x").type for _, t in fixed] == [pa.int64(), pa.int64()]


def test_a_field_the_table_has_is_left_alone() -> None:
    parts = [([0], pa.table({"y": ["a"]})), ([1], pa.table({"y": [1]}))]
    fixed, bad = reconcile_new_fields(parts, pa.schema([("y", pa.string())]))
    assert bad == []
    assert [t.schema.field("y").type for _, t in fixed] == [pa.string(), pa.int64()]
