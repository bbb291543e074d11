"""Decoding Kafka records into Arrow, vectorised, with bad records set aside by index.

JSON values are decoded a whole batch at a time with ``pyarrow.json`` against the table's Arrow
schema (decimals and timestamps are parsed from their text, never through floats). When a batch
fails, the bad records are isolated without leaving the bulk path
(``ingestion/formats/bad_values.py``: a
strict-JSON screen rejects what is not one JSON object with its required fields, bisection
finds the rest, which are decoded alone); every bad record is returned as a rejection with its
error, for the dead-letter path or to fail the run. Invalid UTF-8 is rejected in every batch.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from itertools import pairwise
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ingestion.formats.bad_values import DecodeStats, Piece, is_json_object, isolate_json
from ingestion.formats.nested import (
    fix_column,
    needs_fix,
    nested_additions,
    promotion_candidates,
    read_type,
)
from ingestion.formats.new_fields import reconcile_new_fields

_PARSE_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError)


@dataclass(frozen=True)
class Rejection:
    """A record that could not be decoded: its index in the batch and the reason."""

    index: int
    error_class: str
    message: str


@dataclass
class Decoded:
    """The outcome of decoding one batch."""

    table: pa.Table
    indices: list[int]
    rejections: list[Rejection] = field(default_factory=list)
    new_fields: dict[str, pa.DataType] = field(default_factory=dict)
    promotions: dict[str, pa.DataType] = field(default_factory=dict)
    stats: DecodeStats = field(default_factory=DecodeStats)


def find_promotion(payload: bytes, schema: pa.Schema) -> dict[str, pa.DataType]:
    """The single-column promotion under which ``payload`` decodes, or {} if none does."""
    for path, widened, wider in promotion_candidates(schema):  # nested leaves too: "c.qty"
        try:
            _parse_one(payload, widened)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return {path: wider}
    return {}


def _parse(payload: bytes, schema: pa.Schema, newlines: bool, threads: bool = True) -> pa.Table:
    text_typed = [i for i, f in enumerate(schema) if needs_fix(f.type)]  # date, time, maps
    read_schema = schema
    for index in text_typed:
        read_schema = read_schema.set(
            index, schema.field(index).with_type(read_type(schema[index].type))
        )
    options = pj.ParseOptions(
        explicit_schema=read_schema, unexpected_field_behavior="infer", newlines_in_values=newlines
    )
    read = pj.ReadOptions(use_threads=threads)  # one record: a thread pool costs more than it saves
    table = pj.read_json(io.BytesIO(payload), read_options=read, parse_options=options)
    for index in text_typed:
        field = schema.field(index)
        position = table.schema.get_field_index(field.name)
        column = fix_column(table.column(position), field.type)  # may hold new struct fields
        table = table.set_column(position, field.with_type(column.type), column)
    return table


def _parse_one(payload: bytes, schema: pa.Schema) -> pa.Table:
    """Parse one value alone; raises ``ArrowInvalid`` unless it is exactly one JSON object."""
    table = _parse(payload, schema, newlines=True, threads=False)
    if table.num_rows != 1:
        raise pa.ArrowInvalid(f"expected one JSON object, found {table.num_rows}")
    return table


def _promotable(error: Exception, payload: bytes) -> bool:
    """Whether a wider column type might decode ``payload``: not when the error cannot depend
    on the column types (blank, several objects, a required field absent or null, JSON syntax
    the strict screen also rejects)."""
    message = str(error)
    if message.startswith(("expected one JSON object", "Empty JSON file")):
        return False
    if "a required field was" in message:
        return False
    syntax = message.startswith("JSON parse error:") and "Column(" not in message
    return not syntax or is_json_object(payload)


def _assemble(
    pieces: list[Piece[pa.Table]], present: list[int], schema: pa.Schema
) -> tuple[pa.Table, list[int]]:
    """One compact table in batch order from decoded pieces, and the batch index of each row."""
    if not pieces:
        return schema.empty_table(), []
    if len(pieces) == 1:
        return pieces[0][1], [present[row] for row in pieces[0][0]]
    pieces.sort(key=lambda piece: piece[0][0])
    if not pieces:
        return schema.empty_table(), []
    rows = [row for piece_rows, _ in pieces for row in piece_rows]
    table = pa.concat_tables([t for _, t in pieces], promote_options="permissive")
    if any(a > b for a, b in pairwise(rows)):  # singles among bulk rows
        order = sorted(range(len(rows)), key=rows.__getitem__)
        table, rows = table.take(pa.array(order, pa.int64())), [rows[i] for i in order]
    return table.combine_chunks(), [present[row] for row in rows]


def _required_violations(table: pa.Table, required: tuple[str, ...]) -> pa.Array | None:
    masks = [pc.is_null(table.column(name)) for name in required if name in table.column_names]
    if not masks:
        return None
    violation = masks[0]
    for mask in masks[1:]:
        violation = pc.or_(violation, mask)
    return violation


def decode_json(
    values: list[bytes | None], schema: pa.Schema, required: tuple[str, ...] = ()
) -> Decoded:
    """Decode JSON object values against ``schema`` (the user columns of the table).

    Fields absent from a record are null; fields absent from ``schema`` are reported in
    ``new_fields`` with their inferred type (the coordinator evolves the table, see R36) and
    kept as extra columns. A value that fits only a promoted column type (int->long,
    float->double, wider decimal) is reported in ``promotions`` instead of rejected (R35).
    A null value (tombstone), a value that is not a JSON object, a value that does not
    convert to its column type, or a null required field is a rejection. Rows keep batch
    order; ``stats`` counts bulk and single-record parses (a bad record costs one single parse
    and O(log n) bulk ones, never a record-by-record batch).

    Example:
        >>> schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(6, 2))])
        >>> out = decode_json([b'{"id": 1, "amount": 9.99}', b'{"id": "x"}', None], schema)
        >>> out.table.to_pylist(), out.indices, [r.index for r in out.rejections]
        ([{'id': 1, 'amount': Decimal('9.99')}], [0], [1, 2])
    """
    rejections: list[Rejection] = []
    present = list(range(len(values)))
    payloads = cast("list[bytes]", values)
    if None in values:  # tombstones: one C-level scan finds none in a clean batch
        rejections = [
            Rejection(i, "NullValue", "null value (tombstone)")
            for i, v in enumerate(values)
            if v is None
        ]
        present = [i for i, v in enumerate(values) if v is not None]
        payloads = [values[i] or b"" for i in present]
    stats = DecodeStats()
    promotions: dict[str, pa.DataType] = {}

    def bulk(chosen: list[bytes]) -> pa.Table:
        stats.bulk_parses += 1
        table = _parse(b"\n".join(chosen), schema, newlines=False)
        if table.num_rows != len(chosen):  # a value holding several objects
            raise pa.ArrowInvalid(f"expected {len(chosen)} rows, found {table.num_rows}")
        return table

    def single(row: int) -> pa.Table | None:
        stats.single_parses += 1
        try:
            return _parse_one(payloads[row], schema)
        except _PARSE_ERRORS as exc:
            error = exc
        promotable = _promotable(error, payloads[row])
        promotion = find_promotion(payloads[row], schema) if promotable else {}
        promotions.update(promotion)
        if not promotion:
            rejections.append(Rejection(present[row], type(error).__name__, str(error)[:1000]))
        return None

    def reject(row: int, error_class: str, message: str) -> None:
        rejections.append(Rejection(present[row], error_class, message[:1000]))

    non_null = tuple(f.name for f in schema if not f.nullable)
    pieces = isolate_json(payloads, bulk, single, reject, _PARSE_ERRORS, stats, non_null)
    if len(pieces) > 1:  # parts may infer a new field's type differently
        pieces.sort(key=lambda piece: piece[0][0])
        pieces, mixed = reconcile_new_fields(pieces, schema)
        for row, message in mixed:
            reject(row, "MixedFieldType", message)
    table, indices = _assemble(pieces, present, schema)
    decoded = finish_decoded(table, indices, rejections, schema, required)
    decoded.promotions = promotions
    decoded.stats = stats
    return decoded


def finish_decoded(
    table: pa.Table,
    indices: list[int],
    rejections: list[Rejection],
    schema: pa.Schema,
    required: tuple[str, ...],
) -> Decoded:
    """Reject rows with a null required field and report fields absent from ``schema``."""
    violation = _required_violations(table, required)
    if violation is not None and pc.any(violation).as_py():
        bad = set(pc.indices_nonzero(violation).to_pylist())
        for position in sorted(bad):
            missing = [n for n in required if table.column(n)[position].as_py() is None]
            rejections.append(
                Rejection(indices[position], "MissingRequiredField", f"required {missing} is null")
            )
        table = table.filter(pc.invert(violation))
        indices = [index for position, index in enumerate(indices) if position not in bad]
    # A field null in every row says nothing of its type (and Iceberg v2 has no null type):
    # it is added once a value arrives; its nulls read as null meanwhile.
    new_fields = {
        f.name: f.type
        for f in table.schema
        if f.name not in schema.names and not pa.types.is_null(f.type)
    }
    for f in schema:  # new fields inside struct columns: the column's type with them added
        seen = table.schema.field(f.name).type if f.name in table.column_names else f.type
        added = nested_additions(f.type, seen) if seen != f.type else None
        if added is not None:
            new_fields[f.name] = added
    rejections.sort(key=lambda r: r.index)
    return Decoded(table, indices, rejections, new_fields)


def merge_field_types(into: dict[str, pa.DataType], new: dict[str, pa.DataType]) -> None:
    """Merge newly seen fields into ``into``, widening like one parse of all the rows would
    (int64 and double give double), never narrowing: chunks and tasks each infer their own.

    Example:
        >>> seen = {"x": pa.float64()}
        >>> merge_field_types(seen, {"x": pa.int64(), "y": pa.string()})
        >>> seen
        {'x': DataType(double), 'y': DataType(string)}
    """
    for name, kind in new.items():
        known = into.get(name)
        if known is None or known == kind:
            into[name] = kind
            continue
        try:
            merged = pa.unify_schemas(
                [pa.schema([(name, known)]), pa.schema([(name, kind)])],
                promote_options="permissive",
            )
            into[name] = merged.field(name).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            into[name] = pa.string() if pa.types.is_string(kind) else known
