"""Debezium change events (``tests/support/debezium.py`` writes them as the PostgreSQL connector
does) decoded into keyed changes: applied in order, the last change per key of the whole stream
equals the source table's state; the flattened form and tombstones; what is set aside and why."""

from __future__ import annotations

import io
import math
import random
import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import fastavro
import orjson
import pyarrow as pa
import pytest

from ingestion.formats.debezium import OP, decode_changes, last_change_per_key
from tests.support.debezium import DebeziumTable, Record, avro_schema

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("balance", pa.decimal128(10, 2)),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
KEY = ("id",)


def apply(changes: pa.Table) -> dict[int, dict[str, Any]]:
    """The state the last change per key leaves, as the ledger spells rows."""
    state: dict[int, dict[str, Any]] = {}
    for row in last_change_per_key(changes, KEY).to_pylist():
        if row[OP] == "d":
            state.pop(row["id"], None)
            continue
        state[row["id"]] = {
            "id": row["id"],
            "name": row["name"],
            "balance": f"{row['balance']:.2f}",
            "updated_at": row["updated_at"].isoformat().replace("+00:00", "Z"),
        }
    return state


def decode(events: Sequence[Record], envelope: Any = "debezium") -> Any:
    return decode_changes(
        [v for _, v, _ in events], [k for k, _, _ in events], SCHEMA, KEY, envelope
    )


@pytest.mark.parametrize("schemas_enabled", [True, False])
def test_a_snapshot_then_hot_key_changes_leave_the_source_tables_state(
    schemas_enabled: bool,
) -> None:
    source = DebeziumTable(schemas_enabled=schemas_enabled)
    rng = random.Random(11)
    events = source.snapshot(50) + source.random_changes(rng, 2_000, keys=200)
    out = decode(events)
    assert out.rejections == []
    ops = set(out.table.column(OP).to_pylist())
    assert ops == {"r", "c", "u", "d"}
    assert apply(out.table) == source.rows
    assert out.table.column("_cdc_lsn").null_count < out.table.num_rows  # tombstones have none


def flatten(events: list[Record]) -> list[Record]:
    """The events as Debezium's ``ExtractNewRecordState`` writes them with
    ``add.fields=op,source.ts_ms,lsn`` and ``delete.handling.mode=rewrite`` (tombstones kept)."""
    flat: list[Record] = []
    for key, value, partition in events:
        if value is None:
            flat.append((key, None, partition))
            continue
        payload = orjson.loads(value)["payload"]
        deleted = payload["op"] == "d"
        row = payload["before"] if deleted else payload["after"]
        source = payload["source"]
        row = {
            **row,
            "__op": payload["op"],
            "__source_ts_ms": source["ts_ms"],
            "__lsn": source["lsn"],
            "__deleted": "true" if deleted else "false",
        }
        flat.append((key, orjson.dumps(row), partition))
    return flat


def test_the_flattened_form_leaves_the_same_state() -> None:
    source = DebeziumTable()
    events = source.snapshot(20) + source.random_changes(random.Random(3), 500, keys=60)
    out = decode(flatten(events), "flattened")
    assert out.rejections == []
    assert apply(out.table) == source.rows
    assert "__op" not in out.table.column_names
    assert out.new_fields == {}


def test_what_cannot_be_applied_is_set_aside_by_index_with_the_reason() -> None:
    key = b'{"id": 1}'
    good = b'{"op": "c", "after": {"id": 1, "balance": "1.00"}, "source": {"ts_ms": 5}}'
    events = [
        (key, b'{"op": "t", "source": {}}', 0),  # truncate
        (key, b'{"op": "c", "after": {"name": "x"}, "source": {}}', 0),  # no key in after
        (None, b'{"op": "c", "after": {"name": "x"}, "source": {}}', 0),  # nor a record key
        (None, None, 0),  # a tombstone without a key
        (key, b"{", 0),
        (key, b"[1]", 0),
        (key, b'{"op": "u", "after": {"id": 1, "balance": "abc"}, "source": {}}', 0),
        (key, good, 0),
    ]
    out = decode(events)
    reasons = {r.index: r.error_class for r in out.rejections}
    assert reasons[0] == "UnsupportedOperation"
    assert reasons[2] == reasons[3] == "MissingKey"
    assert reasons[4] == "JSONDecodeError"
    assert reasons[5] == "NotAnObject"
    assert 6 in reasons  # the bad decimal: the row does not decode
    assert 1 not in reasons  # the record key gives the key
    assert out.indices == [1, 7]
    assert "op 't' is not applied" in str(out.rejections[0].message).replace("operation", "op")
    assert out.table.column("_cdc_source_ts_ms").to_pylist() == [None, 5]


def test_a_new_column_in_after_is_a_new_field() -> None:
    value = b'{"op": "c", "after": {"id": 1, "email": "a@b"}, "source": {}}'
    out = decode([(b'{"id": 1}', value, 0)])
    assert out.new_fields == {"email": pa.string()}
    assert out.table.column("email").to_pylist() == ["a@b"]


def test_a_delete_needs_only_the_key_and_a_tombstone_only_the_record_key() -> None:
    key = b'{"schema": {"type": "struct"}, "payload": {"id": 4}}'
    events = [
        (key, b'{"op": "d", "before": null, "after": null, "source": {}}', 0),
        (key, None, 0),
    ]
    out = decode(events)
    assert out.table.select(["id", "name", OP]).to_pylist() == [
        {"id": 4, "name": None, OP: "d"},
        {"id": 4, "name": None, OP: "d"},
    ]
    assert out.table.column("balance").to_pylist() == [None, None]


def test_an_upsert_without_an_image_or_a_required_column_is_set_aside() -> None:
    """``after: null`` would null every column but the key; a required column left null would
    fail the copy-on-write: both are rejected by name, for the dead-letter path."""
    import pyarrow as pa

    from ingestion.formats.debezium import decode_changes

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string(), False)])
    values: list[bytes | None] = [
        b'{"op": "u", "before": null, "after": null, "source": {}}',
        b'{"op": "c", "before": null, "after": {"id": 2}, "source": {}}',
        b'{"op": "c", "before": null, "after": {"id": 3, "name": "c"}, "source": {}}',
        b'{"op": "d", "before": {"id": 4}, "after": null, "source": {}}',
    ]
    keys: list[bytes | None] = [b'{"id": 1}', b'{"id": 2}', b'{"id": 3}', b'{"id": 4}']
    out = decode_changes(values, keys, schema, ("id",))
    assert [(r.index, r.error_class) for r in out.rejections] == [
        (0, "UnsupportedOperation"),
        (1, "MissingRequired"),
    ]
    assert out.indices == [2, 3]
    assert out.table.column("id").to_pylist() == [3, 4]


def wire(schema_id: int, schema: Any, payload: Any) -> bytes:
    """``payload`` as the AvroConverter writes it: magic byte, schema id, Avro body."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), payload)
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


def test_avro_envelopes_and_keys_leave_the_same_state() -> None:
    """The same change stream written by the AvroConverter (envelope and key in the wire
    format): the same state as its JSON form; a tombstone alone deletes by its Avro key."""
    source = DebeziumTable(schemas_enabled=False)
    events = source.snapshot(40) + source.random_changes(random.Random(8), 300, keys=60)
    schemas = {1: avro_schema(source.envelope_schema()), 2: avro_schema(source.key_schema())}
    lone = next(iter(source.rows))
    del source.rows[lone]  # a tombstone with no delete before it (e.g. compacted away)
    events.append((orjson.dumps({"id": lone}), None, 0))
    avro = [
        (
            wire(2, schemas[2], orjson.loads(key)) if key is not None else None,
            wire(1, schemas[1], orjson.loads(value)) if value is not None else None,
            partition,
        )
        for key, value, partition in events
    ]
    writers = {i: orjson.dumps(schema).decode() for i, schema in schemas.items()}
    out = decode_changes(
        [v for _, v, _ in avro], [k for k, _, _ in avro], SCHEMA, KEY, writers=writers
    )
    assert out.rejections == []
    assert out.unknown_schema_ids == set()
    assert apply(out.table) == source.rows


def test_avro_decimals_and_unknown_schema_ids() -> None:
    """A precise decimal (Debezium's default ``decimal.handling.mode``: Avro bytes with the
    decimal logical type) lands exactly; a schema id the task was not given is reported, its
    record set aside for the coordinator to fetch and run again."""
    row = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "id", "type": "long"},
            {
                "name": "balance",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
            },
        ],
    }
    flat = wire(7, row, {"id": 1, "balance": Decimal("12345678.91")})
    writers = {7: orjson.dumps(row).decode()}
    schema = pa.schema([("id", pa.int64()), ("balance", pa.decimal128(10, 2))])
    out = decode_changes(
        [flat, wire(9, row, {"id": 2, "balance": Decimal("1.00")})],
        [None, None],
        schema,
        KEY,
        "flattened",
        writers,
    )
    assert out.table.select(["id", "balance"]).to_pylist() == [
        {"id": 1, "balance": Decimal("12345678.91")}
    ]
    assert [(r.index, r.error_class) for r in out.rejections] == [(1, "UnknownSchemaId")]
    assert out.unknown_schema_ids == {9}


def test_avro_values_json_cannot_carry_keep_their_avro_form() -> None:
    """Bytes, a uuid and a NaN have no exact JSON form: their rows are converted from the Avro
    values (as append mode does), the others take JSON's typed path (a ``ZonedTimestamp``
    string into a ``timestamptz``); batch order is kept."""
    row = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "blob", "type": ["null", "bytes"], "default": None},
            {"name": "ratio", "type": ["null", "double"], "default": None},
            {"name": "at", "type": ["null", "string"], "default": None},
        ],
    }
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("blob", pa.binary()),
            ("ratio", pa.float64()),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
    payloads = [
        {"id": 1, "blob": None, "ratio": 0.5, "at": "2026-11-28T10:00:00.123456Z"},
        {"id": 2, "blob": b"\xde\xad", "ratio": 1.0, "at": None},
        {"id": 3, "blob": None, "ratio": float("nan"), "at": None},
        {"id": 4, "blob": None, "ratio": None, "at": "2026-11-28T11:00:00Z"},
    ]
    values: list[bytes | None] = [wire(5, row, payload) for payload in payloads]
    out = decode_changes(
        values, [None] * 4, schema, KEY, "flattened", {5: orjson.dumps(row).decode()}
    )
    assert out.rejections == []
    assert out.indices == [0, 1, 2, 3]
    got = out.table.select(["id", "blob", "ratio"]).to_pylist()
    assert [r["id"] for r in got] == [1, 2, 3, 4]
    assert got[1]["blob"] == b"\xde\xad"
    assert math.isnan(got[2]["ratio"])
    stamps = out.table.column("at").to_pylist()
    assert [s.isoformat() if s else None for s in stamps] == [
        "2026-11-28T10:00:00.123456+00:00",
        None,
        None,
        "2026-11-28T11:00:00+00:00",
    ]


def test_an_avro_tombstone_reads_a_json_key_and_names_an_unreadable_one() -> None:
    """Keys through the JsonConverter beside Avro values still find a tombstone's row; a key
    that cannot be read at all is named in the rejection, not hidden behind "no key"."""
    writers = {
        1: orjson.dumps(
            {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}
        ).decode()
    }
    keys: list[bytes | None] = [b'{"id": 9}', b"\x00\x00\x00\x00\x07junk"]
    out = decode_changes([None, None], keys, SCHEMA, KEY, writers=writers)
    assert out.table.select(["id", OP]).to_pylist() == [{"id": 9, OP: "d"}]
    (rejection,) = out.rejections
    assert rejection.error_class == "MissingKey"
    assert "UnknownSchemaId" in rejection.message
    assert out.unknown_schema_ids == {7}


def test_every_double_underscore_field_of_a_flattened_row_is_metadata() -> None:
    """``add.fields=source.txId`` adds ``__source_txId``: metadata, not a new column."""
    value = orjson.dumps({"id": 1, "name": "a", "__op": "c", "__source_txId": 77, "__db": "x"})
    out = decode_changes([value], [None], SCHEMA, KEY, "flattened")
    assert out.new_fields == {}
    assert out.table.select(["id", "name"]).to_pylist() == [{"id": 1, "name": "a"}]
