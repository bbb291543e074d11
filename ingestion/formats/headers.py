"""Kafka key and header columns beyond bytes: JSON keys as a struct, headers as a list.

Headers are ``list<struct<key:string, value:binary>>`` in record order: Kafka headers are an
ordered list in which a key may repeat (and a value may be null), so a map would lose both.
A JSON key (``key_format: json``) is decoded like a value, vectorised, against the
``_kafka_key`` struct type; a key that does not decode is a rejection (quarantined or failing
the run, like a bad value); a null key stays null. Key fields not in ``key_schema`` are
ignored (the key's schema does not evolve).
"""

from __future__ import annotations

import pyarrow as pa

from ingestion.formats.decode import Rejection, decode_json
from ingestion.formats.nested import cast_nested


def headers_column(
    headers: list[list[tuple[str, bytes | None]] | None], kind: pa.DataType
) -> pa.Array:
    """The ``_kafka_headers`` column from confluent-kafka's ``Message.headers()`` values.

    Example:
        >>> from ingestion.table.schema import headers_type
        >>> from pyiceberg.io.pyarrow import schema_to_pyarrow
        >>> from pyiceberg.schema import Schema
        >>> from pyiceberg.types import NestedField
        >>> import itertools
        >>> kind = schema_to_pyarrow(
        ...     Schema(NestedField(1, "h", headers_type(itertools.count(2)), required=False))
        ... ).field("h").type
        >>> headers_column([[("a", b"1"), ("a", None)], None], kind).to_pylist()
        [[{'key': 'a', 'value': b'1'}, {'key': 'a', 'value': None}], []]
    """
    # A record without headers has an empty list (confluent-kafka returns None for it).
    return pa.array([h or [] for h in headers], kind)


def decode_json_keys(
    keys: list[bytes | None], kind: pa.StructType
) -> tuple[pa.Array, list[Rejection]]:
    """Decode JSON keys into a struct column of ``kind``; bad keys null and rejected.

    Example:
        >>> kind = pa.struct([pa.field("id", pa.int64(), nullable=False)])
        >>> column, bad = decode_json_keys([b'{"id": 1}', None, b'{"id": "x"}'], kind)
        >>> column.to_pylist(), [(r.index, r.error_class) for r in bad]
        ([{'id': 1}, None, None], [(2, 'ArrowInvalid')])
    """
    present = [i for i, key in enumerate(keys) if key is not None]
    schema = pa.schema(list(kind.fields))
    decoded = decode_json(
        [keys[i] for i in present], schema, tuple(f.name for f in schema if not f.nullable)
    )
    rejections = [
        Rejection(present[r.index], r.error_class, f"key: {r.message}") for r in decoded.rejections
    ]
    seen = set(decoded.indices) | {r.index for r in decoded.rejections}
    rejections += [  # a key that fits only a wider type: the key's schema does not evolve
        Rejection(present[p], "KeyTypeMismatch", f"key does not fit {kind}")
        for p in range(len(present))
        if p not in seen
    ]
    table = decoded.table
    rows = pa.table([cast_nested(table.column(f.name), f.type) for f in schema], schema=schema)
    struct = rows.to_struct_array().combine_chunks()
    positions = [present[p] for p in decoded.indices]
    # Scatter the decoded keys to their records; the others are null.
    where = pa.array([-1] * len(keys), pa.int64()).to_numpy().copy()
    where[positions] = range(len(positions))
    column = struct.take(pa.array(where, mask=where < 0))
    return column, sorted(rejections, key=lambda r: r.index)
