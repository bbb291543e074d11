"""Kafka headers and JSON keys as columns (pure Arrow): headers as an ordered list in which a
key may repeat and a value may be null; JSON keys decoded against the key struct, a key that
does not decode (or fits only a wider type) rejected, a null key null, unknown key fields
ignored."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField

from ingestion.formats.headers import decode_json_keys, headers_column
from ingestion.table.schema import headers_type

HEADERS = (
    schema_to_pyarrow(Schema(NestedField(1, "h", headers_type(itertools.count(2)), required=False)))
    .field("h")
    .type
)
KEY = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("tag", pa.string())])


def test_headers_keep_their_order_repeats_null_values_and_bytes() -> None:
    headers: list[list[tuple[str, bytes | None]] | None] = [
        [("b", b"2"), ("a", b"\x00\xff"), ("b", None)],
        None,  # confluent-kafka's value for a record without headers
        [],
    ]
    column = headers_column(headers, HEADERS)
    assert column.type == HEADERS
    assert column.to_pylist() == [
        [
            {"key": "b", "value": b"2"},
            {"key": "a", "value": b"\x00\xff"},
            {"key": "b", "value": None},
        ],
        [],
        [],
    ]
    assert column.null_count == 0


def test_json_keys_decode_to_the_key_struct_ignoring_unknown_fields() -> None:
    keys = [b'{"id": 2, "tag": "t"}', b'{"id": 1, "extra": 5}', None]
    column, bad = decode_json_keys(keys, KEY)
    assert column.type == KEY
    assert column.to_pylist() == [{"id": 2, "tag": "t"}, {"id": 1, "tag": None}, None]
    assert bad == []


def test_bad_keys_are_null_and_rejected_at_their_record() -> None:
    keys = [b'{"id": 1}', None, b'{"id": 1.5}', b"not json", b'{"tag": "no id"}']
    column, bad = decode_json_keys(keys, KEY)
    assert column.to_pylist() == [{"id": 1, "tag": None}, None, None, None, None]
    assert [(r.index, r.error_class) for r in bad] == [
        (2, "ArrowInvalid"),
        (3, "ArrowInvalid"),
        (4, "MissingRequiredField"),
    ]
    assert all(r.message.startswith("key: ") for r in bad)


@pytest.mark.parametrize(
    ("kind", "value"),
    [(pa.int32(), b'{"id": 4000000000}'), (pa.decimal128(5, 2), b'{"id": 123456.5}')],
    ids=["int-overflow", "decimal-precision"],
)
def test_a_key_that_fits_only_a_wider_type_is_rejected_not_widened(
    kind: pa.DataType, value: bytes
) -> None:
    """The key's schema does not evolve: the column keeps the declared type."""
    key = pa.struct([pa.field("id", kind)])
    column, bad = decode_json_keys([b'{"id": 1}', value], key)
    assert column.type == key
    assert column.to_pylist()[1] is None
    assert [(r.index, r.error_class) for r in bad] == [(1, "KeyTypeMismatch")]


def test_only_null_keys_decode_to_nulls_without_rejection() -> None:
    column, bad = decode_json_keys([None, None], KEY)
    assert column.to_pylist() == [None, None]
    assert bad == []
