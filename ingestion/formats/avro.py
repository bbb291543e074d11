"""Avro values in the Confluent wire format: magic byte 0, 4-byte schema id, Avro body.

The driver resolves writer schemas from the Schema Registry (executors cannot reach an
in-process registry client, and need not reach a remote one) and ships them to the tasks, which
decode with fastavro. The table schema is derived from the subject's latest schema with
pyiceberg's Avro conversion.
"""

from __future__ import annotations

import io
import itertools
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from ingestion.formats.bad_values import bisect_bulk
from ingestion.formats.decode import Decoded, Rejection, finish_decoded

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

WriterSchemas = dict[int, str]  # schema id -> Avro schema (JSON text)


def _with_field_ids(node: Any, counter: Iterator[int]) -> Any:
    """Copy an Avro schema with the field/element/key/value ids pyiceberg's conversion wants."""
    if isinstance(node, list):
        return [_with_field_ids(item, counter) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    kind = node.get("type")
    if kind == "record":
        node["fields"] = [
            {**f, "field-id": next(counter), "type": _with_field_ids(f["type"], counter)}
            for f in node["fields"]
        ]
    elif kind == "array":
        node["element-id"] = next(counter)
        node["items"] = _with_field_ids(node["items"], counter)
    elif kind == "map":
        node["key-id"], node["value-id"] = next(counter), next(counter)
        node["values"] = _with_field_ids(node["values"], counter)
    elif kind == "enum":
        return "string"
    elif node.get("logicalType") == "timestamp-millis":
        node["logicalType"] = "timestamp-micros"  # same Iceberg type; fastavro decodes both
    elif isinstance(kind, dict | list):
        node["type"] = _with_field_ids(kind, counter)
    return node


def avro_to_iceberg_schema(schema_text: str) -> Schema:
    """Convert an Avro record schema to an Iceberg schema (pyiceberg's conversion).

    Example:
        >>> text = (
        ...     '{"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"},'
        ...     ' {"name": "note", "type": ["null", "string"]}]}'
        ... )
        >>> [(f.name, str(f.field_type), f.required) for f in avro_to_iceberg_schema(text).fields]
        [('id', 'long', True), ('note', 'string', False)]
    """
    from pyiceberg.utils.schema_conversion import AvroSchemaConversion

    document = _with_field_ids(orjson.loads(schema_text), itertools.count(1))
    return AvroSchemaConversion().avro_to_iceberg(document)


def fetch_writer_schemas(
    client: Any, subjects: list[str], absent_ok: bool = False
) -> WriterSchemas:
    """Return every registered version of ``subjects`` as {schema id: schema text}; with
    ``absent_ok`` a subject the registry does not have is skipped (keys: a topic may have
    none registered).

    Call it after the plan froze its end offsets: every record in the planned ranges was
    produced before, so its schema was registered before (ids from other subjects are fetched
    by id when a task reports them).
    """
    schemas: WriterSchemas = {}
    for subject in subjects:
        try:
            versions = client.get_versions(subject)
        except Exception as exc:
            if absent_ok and is_not_found(exc):
                continue
            raise
        for version in versions:
            registered = client.get_version(subject, version)
            schemas[int(registered.schema_id)] = registered.schema.schema_str
    return schemas


def split_wire_format(value: bytes | None) -> tuple[int, bytes] | Rejection:
    """Return (schema id, Avro body), or a rejection for a tombstone or a bad magic byte."""
    if value is None:
        return Rejection(-1, "NullValue", "null value (tombstone)")
    if len(value) < 5 or value[0] != 0:
        return Rejection(-1, "BadMagicByte", "not in the Confluent wire format (magic byte 0)")
    return struct.unpack(">I", value[1:5])[0], value[5:]


class AvroRecords:
    """Reads wire-format Avro records with the writer schemas the driver shipped (parsed once
    per reader); remembers the schema ids it did not know.

    Example:
        >>> import fastavro
        >>> text = '{"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}]}'
        >>> body = io.BytesIO()
        >>> fastavro.schemaless_writer(body, fastavro.parse_schema(orjson.loads(text)), {"id": 7})
        >>> reader = AvroRecords({3: text})
        >>> reader.read(b"\\x00" + struct.pack(">I", 3) + body.getvalue())
        {'id': 7}
        >>> unknown = reader.read(b"\\x00" + struct.pack(">I", 4) + body.getvalue())
        >>> unknown.error_class, reader.unknown
        ('UnknownSchemaId', {4})
    """

    def __init__(self, writers: WriterSchemas) -> None:
        import fastavro

        self._parsed = {i: fastavro.parse_schema(orjson.loads(text)) for i, text in writers.items()}
        self.unknown: set[int] = set()

    def read(self, value: bytes | None) -> dict[str, Any] | Rejection:
        """The record ``value`` holds, or a rejection (index -1: the caller's to set)."""
        import fastavro

        split = split_wire_format(value)
        if isinstance(split, Rejection):
            return split
        schema_id, body = split
        if schema_id not in self._parsed:
            self.unknown.add(schema_id)
            return Rejection(-1, "UnknownSchemaId", f"schema id {schema_id}")
        try:
            row = fastavro.schemaless_reader(io.BytesIO(body), self._parsed[schema_id], None)
        except Exception as exc:  # fastavro raises many types for corrupt bodies
            return Rejection(-1, type(exc).__name__, str(exc)[:1000])
        if not isinstance(row, dict):
            return Rejection(-1, "NotARecord", f"schema {schema_id} is no record")
        return row


def decode_avro(
    values: list[bytes | None],
    writers: WriterSchemas,
    schema: pa.Schema,
    required: tuple[str, ...] = (),
) -> tuple[Decoded, set[int]]:
    """Decode wire-format Avro values; return the result and the schema ids it did not know.

    Records whose schema id is not in ``writers`` are rejected as ``UnknownSchemaId`` and their
    ids returned, so the coordinator can look them up and run the range again.
    """
    reader = AvroRecords(writers)
    rows: list[dict[str, Any]] = []
    indices: list[int] = []
    rejections: list[Rejection] = []
    for index, value in enumerate(values):
        row = reader.read(value)
        if isinstance(row, Rejection):
            rejections.append(Rejection(index, row.error_class, row.message))
            continue
        rows.append(row)
        indices.append(index)
    table, bad = rows_to_arrow(rows, schema)
    for position, reason in bad.items():
        rejections.append(Rejection(indices[position], "ArrowInvalid", reason))
    indices = [index for position, index in enumerate(indices) if position not in bad]
    return finish_decoded(table, indices, rejections, schema, required), reader.unknown


def rows_to_arrow(rows: list[dict[str, Any]], schema: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
    """Rows to Arrow: known columns typed by the table, new ones inferred; bad rows by position.

    A failed conversion is bisected (halves, down to single rows), so one bad row costs
    O(log n) conversions, not one per row (``ingestion/formats/bad_values.py``).
    """
    extra = sorted({key for row in rows for key in row} - set(schema.names))
    errors = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)
    try:
        return _convert(rows, schema, extra), {}
    except errors:
        pass
    bad: dict[int, str] = {}

    def single(position: int) -> int | None:
        try:
            _convert([rows[position]], schema, extra)
        except errors as exc:
            bad[position] = str(exc)[:1000]
            return None
        return 1

    def bulk(positions: list[int]) -> int:
        _convert([rows[p] for p in positions], schema, extra)
        return len(positions)

    bisect_bulk(list(range(len(rows))), bulk, single, errors, known_bad=True)
    return _convert([row for p, row in enumerate(rows) if p not in bad], schema, extra), bad


def _convert(rows: list[dict[str, Any]], schema: pa.Schema, extra: list[str]) -> pa.Table:
    known = pa.Table.from_pylist(rows, schema=pa.schema([f.with_nullable(True) for f in schema]))
    for name in extra:
        known = known.append_column(name, pa.array([row.get(name) for row in rows]))
    return known


def is_not_found(exc: Exception) -> bool:
    """Whether a Schema Registry error says the schema does not exist (permanent)."""
    status = getattr(exc, "http_status_code", None)
    code = getattr(exc, "error_code", None)
    return status == 404 or code in (40401, 40403)


def fetch_schemas_by_id(
    client: Any, ids: set[int], attempts: int = 4, wait_s: float = 0.5
) -> tuple[WriterSchemas, set[int]]:
    """Look up schema ids; return (found, not found). A registry outage is retried, then raised.

    R34: an unknown id is permanent (its records are dead-lettered or fail the run); an outage
    is transient (bounded retry with backoff, then the run fails with nothing committed).
    """
    from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

    @retry(
        retry=retry_if_exception(lambda exc: not is_not_found(exc)),  # type: ignore[arg-type]
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=wait_s, max=10),
        reraise=True,
    )
    def lookup(schema_id: int) -> str | None:
        try:
            return str(client.get_schema(schema_id).schema_str)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise

    found: WriterSchemas = {}
    missing: set[int] = set()
    for schema_id in sorted(ids):
        text = lookup(schema_id)
        if text is None:
            missing.add(schema_id)
        else:
            found[schema_id] = text
    return found, missing
