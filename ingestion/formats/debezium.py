"""Debezium change events decoded into keyed changes: the input of ``mode: upsert`` (R57).

Three shapes of a change reach a topic, all decoded here, in JSON (values and keys, with or
without the JsonConverter's ``{"schema": ..., "payload": ...}`` wrapper) or in Avro (the
AvroConverter's Confluent wire format, writer schemas from the Schema Registry; a row JSON
text carries exactly then takes JSON's typed path, so Debezium's text-encoded types reach typed
columns alike; a row with bytes, fixed, uuid or NaN is converted from its Avro values):

- **The envelope** (``envelope: debezium``): ``{"before", "after", "source", "op", "ts_ms"}``.
  ``op`` ``c`` (insert), ``u`` (update) and ``r`` (a snapshot read) upsert the ``after`` image;
  ``d`` deletes the ``before`` image's key.
- **The flattened row** (``envelope: flattened``, Debezium's ``ExtractNewRecordState`` SMT): the
  row itself, with the metadata it was told to add as ``__`` fields: ``__op``, ``__deleted``
  (``"true"`` for a delete under ``delete.handling.mode=rewrite``), ``__source_ts_ms``,
  ``__lsn``; every ``__`` field is metadata, never a column. A row without ``__op`` is an
  upsert.
- **A tombstone** (a null value, after every delete unless ``tombstones.on.delete=false``):
  deletes the record key's row. A tombstone after its delete deletes nothing more.

The key of a change is read from the image it applies (``after`` for an upsert, ``before`` for a
delete), else from the record key (Debezium's key is the table's primary key, e.g.
``{"id": 1}``); a delete whose ``before`` lacks the row's other columns (Postgres' default
replica identity) still deletes the whole row, wherever it lives. Rows are then decoded against
the table's columns by :func:`ingestion.formats.decode.decode_json`, so the row's types, bad
values and new columns (schema evolution of ``after``) behave as in append mode.

Rejected, for the dead-letter path like any bad record: a value that is not a JSON object, an
``op`` that is not ``c``/``u``/``r``/``d`` (``t`` truncate and ``m`` message are not applied to a
table's rows), an upsert with no ``after`` image, a change whose key fields are missing or null,
an upsert that leaves a required column null, and a row that does not decode.

Delivery: decoding is a pure function of the batch; the same batch decodes the same way on a
retry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any, Literal

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ingestion.formats.avro import AvroRecords, WriterSchemas, rows_to_arrow
from ingestion.formats.bad_values import DecodeStats
from ingestion.formats.decode import (
    Decoded,
    Rejection,
    decode_json,
    finish_decoded,
    merge_field_types,
)

Envelope = Literal["debezium", "flattened"]
OP = "_cdc_op"  # c, u, r (upserts) or d (deletes, tombstones included)
SOURCE_TS_MS = "_cdc_source_ts_ms"  # when the database made the change (source.ts_ms)
LSN = "_cdc_lsn"  # the change's log position where the source has one (Postgres' source.lsn)
UPSERTS = ("c", "u", "r")
DELETE = "d"


@dataclass
class Changes:
    """The decoded changes of one batch, in batch order.

    ``table`` holds one row per applied change: the row's columns (only the key columns are
    set for a delete), then :data:`OP`, :data:`SOURCE_TS_MS` and :data:`LSN`; ``indices`` is each
    row's index in the batch; ``rejections`` are the records set aside.
    """

    table: pa.Table
    indices: list[int]
    rejections: list[Rejection] = field(default_factory=list)
    new_fields: dict[str, pa.DataType] = field(default_factory=dict)
    promotions: dict[str, pa.DataType] = field(default_factory=dict)
    stats: DecodeStats = field(default_factory=DecodeStats)
    unknown_schema_ids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Change:
    op: str
    image: dict[str, Any]
    source_ts_ms: int | None
    lsn: int | None


def _unwrap(document: Any) -> Any:
    """The JsonConverter's ``payload`` when the value carries its ``schema`` beside it."""
    if isinstance(document, dict) and document.keys() == {"schema", "payload"}:
        return document["payload"]
    return document


def _as_int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _read_json(value: bytes) -> dict[str, Any] | Rejection:
    try:
        document = _unwrap(orjson.loads(value))
    except orjson.JSONDecodeError as exc:
        return Rejection(-1, "JSONDecodeError", str(exc)[:1000])
    if not isinstance(document, dict):
        return Rejection(-1, "NotAnObject", "the value is not an object")
    return document


def _as_text(row: dict[str, Any]) -> bytes | None:
    """An Avro-decoded row as JSON text when that loses nothing (decimals by their exact text,
    timestamps and dates in ISO form), else None: bytes, a NaN or infinite float, a UUID or a
    time of day have no exact JSON form."""

    def plain(value: Any) -> bool:
        if value is None or isinstance(value, bool | int | str | Decimal | date):
            return True  # date covers datetime
        if isinstance(value, float):
            return math.isfinite(value)
        if isinstance(value, dict):
            return all(plain(item) for item in value.values())
        if isinstance(value, list):
            return all(plain(item) for item in value)
        return False

    return orjson.dumps(row, default=str) if plain(row) else None


def _decode_rows(
    rows: list[dict[str, Any]], schema: pa.Schema, key_fields: tuple[str, ...], avro: bool
) -> Decoded:
    """The changes' rows against ``schema``. JSON rows: the typed JSON decode. Avro rows: the
    same, for the rows JSON text carries exactly, so Debezium's text-encoded types reach typed
    columns as from JSON (a ``ZonedTimestamp`` into a ``timestamptz``, a
    ``decimal.handling.mode=string`` decimal into a ``decimal``); the others (bytes, fixed,
    uuid, NaN) are converted from their Avro values, as append mode's Avro path does."""
    if not avro:
        return decode_json([orjson.dumps(row) for row in rows], schema, key_fields)
    texts = [_as_text(row) for row in rows]
    textual = [position for position, text in enumerate(texts) if text is not None]
    by_text = decode_json([texts[p] or b"" for p in textual], schema, key_fields)
    if len(textual) == len(rows):
        return by_text
    native = [position for position, text in enumerate(texts) if text is None]
    table, bad = rows_to_arrow([rows[p] for p in native], schema)
    kept = [p for i, p in enumerate(native) if i not in bad]
    failed = [Rejection(native[i], "ArrowInvalid", reason) for i, reason in bad.items()]
    by_value = finish_decoded(table, kept, failed, schema, key_fields)
    indices = [textual[i] for i in by_text.indices] + by_value.indices
    together = pa.concat_tables([by_text.table, by_value.table], promote_options="permissive")
    order = sorted(range(len(indices)), key=indices.__getitem__)
    new_fields = dict(by_text.new_fields)
    merge_field_types(new_fields, by_value.new_fields)
    rejections = [Rejection(textual[r.index], r.error_class, r.message) for r in by_text.rejections]
    return Decoded(
        together.take(pa.array(order, pa.int64())),
        [indices[i] for i in order],
        sorted(rejections + by_value.rejections, key=lambda r: r.index),
        new_fields,
        by_text.promotions,
        by_text.stats,
    )


def _envelope_change(document: dict[str, Any]) -> _Change | str:
    op = document.get("op")
    source = document.get("source") if isinstance(document.get("source"), dict) else {}
    assert isinstance(source, dict)
    ts_ms = _as_int(source.get("ts_ms"))
    lsn = _as_int(source.get("lsn"))
    if op in UPSERTS:
        image = document.get("after")
    elif op == DELETE:
        image = document.get("before")
    else:
        return f"operation {op!r} is not applied (c, u, r upsert; d deletes)"
    if image is None and op in UPSERTS:  # the key alone would null every other column
        return f"op {op!r} has no 'after' image to apply"
    if image is not None and not isinstance(image, dict):
        return f"op {op!r}: its image is not a JSON object"
    return _Change(str(op), image or {}, ts_ms, lsn)


def _flattened_change(document: dict[str, Any]) -> _Change | str:
    op = document.get("__op", "u")
    deleted = str(document.get("__deleted", "false")).lower() == "true"
    if op not in (*UPSERTS, DELETE):
        return f"operation {op!r} (__op) is not applied (c, u, r upsert; d deletes)"
    row = {k: v for k, v in document.items() if not k.startswith("__")}
    ts_ms = _as_int(document.get("__source_ts_ms"))
    return _Change(DELETE if deleted else str(op), row, ts_ms, _as_int(document.get("__lsn")))


def _key_of(
    change_image: dict[str, Any], record_key: dict[str, Any] | None, key_fields: tuple[str, ...]
) -> dict[str, Any] | None:
    """The key fields from the image, else from the record key; None when one is missing."""
    for source in (change_image, record_key or {}):
        if all(source.get(name) is not None for name in key_fields):
            return {name: source[name] for name in key_fields}
    return None


def decode_changes(
    values: list[bytes | None],
    keys: list[bytes | None],
    schema: pa.Schema,
    key_fields: tuple[str, ...],
    envelope: Envelope = "debezium",
    writers: WriterSchemas | None = None,
) -> Changes:
    """Decode a batch of change events (``values`` and their record ``keys``) against the
    table's columns ``schema`` (see the module docstring for the shapes and what is rejected).
    JSON unless ``writers`` are given: then values and keys are Avro in the Confluent wire
    format (Debezium's AvroConverter), read with those writer schemas; the ids it did not know
    are returned in ``unknown_schema_ids`` (the coordinator fetches them and runs the range
    again, as in append mode).

    Example:
        >>> schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
        >>> values = [
        ...     b'{"op": "c", "before": null, "after": {"id": 1, "name": "a"}, "source": {}}',
        ...     b'{"op": "d", "before": {"id": 1}, "after": null, "source": {"lsn": 7}}',
        ...     None,
        ...     b'{"op": "t", "source": {}}',
        ... ]
        >>> keys = [b'{"id": 1}'] * 3 + [None]
        >>> out = decode_changes(values, keys, schema, ("id",))
        >>> out.table.select(["id", "name", "_cdc_op", "_cdc_lsn"]).to_pylist()[1:]
        [{'id': 1, 'name': None, '_cdc_op': 'd', '_cdc_lsn': 7}, \
{'id': 1, 'name': None, '_cdc_op': 'd', '_cdc_lsn': None}]
        >>> out.indices, [(r.index, r.error_class) for r in out.rejections]
        ([0, 1, 2], [(3, 'UnsupportedOperation')])
    """
    read = _envelope_change if envelope == "debezium" else _flattened_change
    avro = AvroRecords(writers) if writers is not None else None
    parse = avro.read if avro is not None else _read_json
    rejections: list[Rejection] = []
    rows: list[dict[str, Any]] = []
    meta: list[tuple[str, int | None, int | None]] = []
    present: list[int] = []
    for index, (value, key) in enumerate(zip(values, keys, strict=True)):
        record_key = parse(key) if key is not None else None
        bad_magic = isinstance(record_key, Rejection) and record_key.error_class == "BadMagicByte"
        if bad_magic and avro is not None and key is not None:  # key.converter JsonConverter
            record_key = _read_json(key)
        unread = ""
        if isinstance(record_key, Rejection):  # then only the image can give the key
            unread = f" (its record key could not be read: {record_key.error_class}: "
            unread += f"{record_key.message})"
            record_key = None
        if value is None:
            change: _Change | str = _Change(DELETE, {}, None, None)
        else:
            document = parse(value)
            if isinstance(document, Rejection):
                rejections.append(Rejection(index, document.error_class, document.message))
                continue
            change = read(document)
        if isinstance(change, str):
            rejections.append(Rejection(index, "UnsupportedOperation", change))
            continue
        found = _key_of(change.image, record_key, key_fields)
        if found is None:
            what = "tombstone's record key" if value is None else f"op {change.op!r} change"
            message = f"the {what} has no non-null key fields {list(key_fields)}{unread}"
            rejections.append(Rejection(index, "MissingKey", message))
            continue
        row = found if change.op == DELETE else {**change.image, **found}
        rows.append(row)
        meta.append((change.op, change.source_ts_ms, change.lsn))
        present.append(index)
    decoded = _decode_rows(rows, _nullable_but(schema, key_fields), key_fields, avro is not None)
    for rejection in decoded.rejections:
        rejections.append(
            Rejection(present[rejection.index], rejection.error_class, rejection.message)
        )
    kept = [meta[i] for i in decoded.indices]
    table = decoded.table
    required = [f.name for f in schema if not f.nullable and f.name not in key_fields]
    missing = (
        [
            position
            for position, (op, _, _) in enumerate(kept)
            if op != DELETE and any(not table.column(name)[position].is_valid for name in required)
        ]
        if required
        else []
    )
    if missing:  # an upsert must fill the table's required columns (a delete sets the key)
        for position in missing:
            rejections.append(
                Rejection(
                    present[decoded.indices[position]],
                    "MissingRequired",
                    f"an upsert leaves required column(s) {required} null",
                )
            )
        keep = sorted(set(range(len(kept))) - set(missing))
        table = table.take(pa.array(keep, pa.int64()))
        kept = [kept[i] for i in keep]
        decoded.indices = [decoded.indices[i] for i in keep]
    table = table.append_column(OP, pa.array([m[0] for m in kept], pa.string()))
    table = table.append_column(SOURCE_TS_MS, pa.array([m[1] for m in kept], pa.int64()))
    table = table.append_column(LSN, pa.array([m[2] for m in kept], pa.int64()))
    rejections.sort(key=lambda r: r.index)
    return Changes(
        table,
        [present[i] for i in decoded.indices],
        rejections,
        decoded.new_fields,
        decoded.promotions,
        decoded.stats,
        avro.unknown if avro is not None else set(),
    )


def row_schema_text(envelope_schema: str, envelope: Envelope) -> str:
    """The Avro record schema of the rows a change carries, from the subject's schema: the
    record of ``after`` (and ``before``) in Debezium's envelope (a union with null; the second
    image refers to the first by name), or the flattened record without its ``__`` metadata
    fields. The table of an Avro ``mode: upsert`` pipeline without a declared schema is
    created from it.

    Example:
        >>> text = orjson.dumps({"type": "record", "name": "Envelope", "fields": [
        ...     {"name": "before", "type": ["null", {"type": "record", "name": "Value",
        ...      "fields": [{"name": "id", "type": "int"}]}], "default": None},
        ...     {"name": "after", "type": ["null", "Value"], "default": None},
        ...     {"name": "op", "type": "string"}]}).decode()
        >>> row_schema_text(text, "debezium")
        '{"type":"record","name":"Value","fields":[{"name":"id","type":"int"}]}'
    """
    document = orjson.loads(envelope_schema)
    if not isinstance(document, dict) or document.get("type") != "record":
        raise ValueError("the subject's schema is not an Avro record")
    if envelope == "flattened":
        fields = [f for f in document["fields"] if not str(f["name"]).startswith("__")]
        return orjson.dumps({**document, "fields": fields}).decode()
    images = {f["name"]: f["type"] for f in document["fields"] if f["name"] in ("before", "after")}
    for image in images.values():
        for branch in image if isinstance(image, list) else [image]:
            if isinstance(branch, dict) and branch.get("type") == "record":
                return orjson.dumps(branch).decode()
    raise ValueError(
        "the subject's schema is no Debezium envelope: no 'before'/'after' record (for the "
        "flattened form set envelope: flattened)"
    )


def _nullable_but(schema: pa.Schema, key_fields: tuple[str, ...]) -> pa.Schema:
    """``schema`` with every column nullable but the key's: a delete sets only the key."""
    return pa.schema([f.with_nullable(f.name not in key_fields) for f in schema])


def last_change_per_key(table: pa.Table, key_fields: tuple[str, ...]) -> pa.Table:
    """The last change of each key in ``table`` (batch order: by offset within a Kafka
    partition, where Debezium keeps every change of one key), in batch order.

    Example:
        >>> changes = pa.table({"id": [1, 2, 1, 1], "_cdc_op": ["c", "c", "u", "d"]})
        >>> last_change_per_key(changes, ("id",)).to_pylist()
        [{'id': 2, '_cdc_op': 'c'}, {'id': 1, '_cdc_op': 'd'}]
    """
    if table.num_rows == 0:
        return table
    position = "_cdc_position"
    numbered = table.select(list(key_fields)).append_column(
        position, pa.array(range(table.num_rows), pa.int64())
    )
    last = numbered.group_by(list(key_fields), use_threads=False).aggregate([(position, "max")])
    chosen = pc.sort_indices(last.column(f"{position}_max"))
    return table.take(pc.take(last.column(f"{position}_max"), chosen))
