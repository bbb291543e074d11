"""The executor task's work on one chunk of its range: decode, then write rows and rejections.

A :class:`ChunkWriter` holds a task's rolling writers (ingestion.task.writer) and counts. Delivery:
it writes files but commits nothing; once the task can report nothing (a schema change makes
it rerun, or a bad record fails it under ``errors_tolerance: none``) it stops writing and
deletes what it wrote, best-effort (a file left behind is an orphan that recovery removes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from ingestion import exceptions
from ingestion.formats.avro import decode_avro
from ingestion.formats.bad_values import find_invalid_utf8
from ingestion.formats.debezium import decode_changes, last_change_per_key
from ingestion.formats.decode import Decoded, Rejection, decode_json, merge_field_types
from ingestion.formats.headers import decode_json_keys, headers_column
from ingestion.formats.nested import cast_nested
from ingestion.task.writer import FanoutWriter

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

    from ingestion.task.spec import RawChunk, TaskResult, TaskSpec


def _coordinates(spec: TaskSpec, raw: RawChunk, rows: list[int]) -> dict[str, pa.Array]:
    """Topic, partition, offset, timestamp and cluster columns of the records at ``rows``
    (the cluster is a constant: dictionary-encoded, a few bytes per row group)."""
    offsets = pa.array(raw.offsets, pa.int64())
    timestamps = pa.array(raw.timestamps, pa.int64())
    if len(rows) != len(raw.offsets):  # some records were set aside: take the others
        take = pa.array(rows, pa.int64())
        offsets, timestamps = offsets.take(take), timestamps.take(take)
    return {
        "_kafka_topic": pa.repeat(pa.scalar(spec.range.topic, pa.large_string()), len(rows)),
        "_kafka_partition": pa.repeat(pa.scalar(spec.range.partition, pa.int32()), len(rows)),
        "_kafka_offset": offsets,
        "_kafka_timestamp": timestamps.cast(pa.timestamp("ms", tz="UTC")),
        "_kafka_cluster": pa.repeat(pa.scalar(spec.cluster, pa.large_string()), len(rows)),
    }


def _quarantine_rows(spec: TaskSpec, raw: RawChunk, rejected: list[Rejection]) -> pa.Table:
    rows = [r.index for r in rejected]
    take = pa.array(rows, pa.int64())
    columns = {
        **_coordinates(spec, raw, rows),
        "_kafka_key": pa.array(raw.keys, pa.large_binary()).take(take),
        "value": pa.array(raw.values, pa.large_binary()).take(take),
        "error_class": pa.array([r.error_class for r in rejected], pa.large_string()),
        "error_message": pa.array([r.message for r in rejected], pa.large_string()),
        "pipeline": pa.array([spec.pipeline] * len(rejected), pa.large_string()),
        "commit_id": pa.array([spec.commit_id] * len(rejected), pa.large_string()),
    }
    return pa.table(columns)


def _decode_keys(keys: list[bytes | None], as_string: bool) -> tuple[pa.Array, list[Rejection]]:
    """Keys as one Arrow column: a vectorised UTF-8 cast (validated) for ``key_format:
    string``; if it fails, the bad keys are found
    (ingestion.formats.bad_values.find_invalid_utf8) and the others cast again, without a
    Python string per key."""
    column = pa.array(keys, pa.large_binary())
    if not as_string:
        return column, []
    try:
        return column.cast(pa.large_string()), []
    except pa.ArrowInvalid:
        present = [key or b"" for key in keys]
        bad = find_invalid_utf8(present, b"\n".join(present))
        valid = list(keys)
        for row, _ in bad:
            valid[row] = None
        rejections = [Rejection(row, "UnicodeDecodeError", f"key: {why}") for row, why in bad]
        return pa.array(valid, pa.large_binary()).cast(pa.large_string()), rejections


def merge_rejections(keys: list[Rejection], values: list[Rejection]) -> list[Rejection]:
    """One rejection per record, in offset order: a record whose key and value are both bad
    becomes one (one quarantine row), with both errors in its class and message.

    Example:
        >>> merged = merge_rejections(
        ...     [Rejection(3, "UnicodeDecodeError", "key: invalid start byte")],
        ...     [Rejection(3, "ArrowInvalid", "not JSON"), Rejection(1, "NullValue", "null")],
        ... )
        >>> [(r.index, r.error_class, r.message) for r in merged]  # doctest: +NORMALIZE_WHITESPACE
        [(1, 'NullValue', 'null'),
         (3, 'UnicodeDecodeError, ArrowInvalid', 'key: invalid start byte; value: not JSON')]
    """
    merged: dict[int, Rejection] = {}
    for label, rejections in (("", keys), ("value: ", values)):
        for rejection in rejections:
            first = merged.get(rejection.index)
            merged[rejection.index] = (
                rejection
                if first is None
                else Rejection(
                    rejection.index,
                    f"{first.error_class}, {rejection.error_class}",
                    f"{first.message}; {label}{rejection.message}",
                )
            )
    return sorted(merged.values(), key=lambda r: r.index)


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Order and cast columns to the table's Arrow schema (ms timestamps widen to us). An
    optional Kafka metadata column the rows lack (one a later release adds; ``_kafka_cluster``
    was one: docs/cluster-column.md) is written null, so rolling back over a table a later
    release touched keeps ingesting.

    Example:
        >>> rows = pa.table({"_kafka_offset": pa.array([7], pa.int64())})
        >>> later = pa.schema([("_kafka_offset", pa.int64()), ("_kafka_cluster", pa.string())])
        >>> _conform(rows, later).to_pylist()
        [{'_kafka_offset': 7, '_kafka_cluster': None}]
    """
    names = set(rows.column_names)
    columns = [
        cast_nested(rows.column(f.name), f.type)
        if f.name in names or not (f.nullable and f.name.startswith("_kafka_"))
        else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _decode_chunk(
    spec: TaskSpec,
    values: list[bytes | None],
    schema: pa.Schema,
    required: tuple[str, ...],
    result: TaskResult,
) -> Decoded:
    """Decode one chunk of values in the pipeline's format."""
    if spec.value_format == "json":
        return decode_json(values, schema, required)
    if spec.value_format == "avro":
        decoded, unknown = decode_avro(values, spec.writer_schemas, schema, required)
        result.unknown_schema_ids |= unknown - spec.missing_schema_ids
        return decoded
    column = pa.array(values, pa.large_binary())  # raw: the bytes as they are
    return Decoded(pa.table({"value": column}), list(range(len(values))))


def _decode_changes(
    spec: TaskSpec, raw: RawChunk, schema: pa.Schema, result: TaskResult
) -> Decoded:
    """Decode one chunk of change events (``mode: upsert``): the rows carry the change
    columns (ingestion.formats.debezium)."""
    changes = decode_changes(
        raw.values,
        raw.keys,
        schema,
        spec.key_fields,
        "flattened" if spec.envelope == "flattened" else "debezium",
        spec.writer_schemas if spec.value_format == "avro" else None,
    )
    result.unknown_schema_ids |= changes.unknown_schema_ids - spec.missing_schema_ids
    return Decoded(
        changes.table,
        changes.indices,
        changes.rejections,
        changes.new_fields,
        changes.promotions,
        changes.stats,
    )


class ChunkWriter:
    """One task's writers and counts; stops writing (and deletes) once nothing may be reported."""

    def __init__(
        self,
        spec: TaskSpec,
        metadata: TableMetadata,
        target: pa.Schema,
        user_schema: pa.Schema,
        result: TaskResult,
    ) -> None:
        from pyiceberg.io import load_file_io

        self.spec, self.target, self.user_schema, self.result = spec, target, user_schema, result
        self.required = tuple(f.name for f in user_schema if not f.nullable)
        self.data = FanoutWriter(metadata, load_file_io(spec.io_properties, metadata.location))
        self.quarantine: FanoutWriter | None = None
        self.quarantine_schema: pa.Schema | None = None
        self.changes: pa.Table | None = None  # mode: upsert: the last change per key so far
        self.first_bad: tuple[int, Rejection] | None = None  # (offset, rejection)
        self.bad = 0
        self.writing = True

    def add_chunk(self, raw: RawChunk) -> None:
        """Decode one chunk; write its rows and rejections unless writing has stopped."""
        result, spec = self.result, self.spec
        latest = max(raw.timestamps)
        if result.max_timestamp_ms is None or latest > result.max_timestamp_ms:
            result.max_timestamp_ms = latest
        if spec.key_format == "json":
            keys, key_rejections = decode_json_keys(raw.keys, self.target.field("_kafka_key").type)
        else:
            keys, key_rejections = _decode_keys(raw.keys, as_string=spec.key_format == "string")
        if spec.key_fields:
            decoded = _decode_changes(spec, raw, self.user_schema, result)
        else:
            decoded = _decode_chunk(spec, raw.values, self.user_schema, self.required, result)
        result.decode_stats.add(decoded.stats)
        merge_field_types(result.new_fields, decoded.new_fields)
        result.promotions.update(decoded.promotions)
        rejected = merge_rejections(key_rejections, decoded.rejections)
        if rejected and self.first_bad is None:
            self.first_bad = (raw.offsets[rejected[0].index], rejected[0])
        self.bad += len(rejected)
        if result.needs_rerun or (self.bad and spec.errors_tolerance == "none"):
            self.abort()  # nothing of this attempt will be reported: stop writing, delete
        if not self.writing:
            return
        self._write_rows(raw, keys, decoded, {r.index for r in key_rejections})
        if rejected:
            self._write_quarantine(raw, rejected)

    def _write_rows(
        self, raw: RawChunk, keys: pa.Array, decoded: Decoded, bad_keys: set[int]
    ) -> None:
        table, rows = decoded.table, decoded.indices
        if bad_keys:
            keep = [position for position, row in enumerate(rows) if row not in bad_keys]
            table = table.take(pa.array(keep, pa.int64()))
            rows = [rows[position] for position in keep]
        columns = {"_kafka_key": keys}
        if raw.headers is not None:
            columns["_kafka_headers"] = headers_column(
                raw.headers, self.target.field("_kafka_headers").type
            )
        if len(rows) != len(raw.offsets):
            take = pa.array(rows, pa.int64())
            columns = {name: column.take(take) for name, column in columns.items()}
        for name, column in {**_coordinates(self.spec, raw, rows), **columns}.items():
            table = table.append_column(name, column)
        rows = _conform(table, self.target)
        if self.spec.key_fields:  # held, reduced: the coordinator applies them (upsert.py)
            together = rows if self.changes is None else pa.concat_tables([self.changes, rows])
            self.changes = last_change_per_key(together, self.spec.key_fields)
        else:
            self.data.write(rows)
        self.result.records += table.num_rows

    def _write_quarantine(self, raw: RawChunk, rejected: list[Rejection]) -> None:
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import schema_to_pyarrow
        from pyiceberg.table.metadata import TableMetadataUtil

        if self.quarantine is None or self.quarantine_schema is None:
            assert self.spec.quarantine_metadata_json is not None
            quarantine = TableMetadataUtil.parse_raw(self.spec.quarantine_metadata_json)
            io = load_file_io(self.spec.io_properties, quarantine.location)
            self.quarantine = FanoutWriter(quarantine, io)
            self.quarantine_schema = schema_to_pyarrow(quarantine.schema())
        rows = _conform(_quarantine_rows(self.spec, raw, rejected), self.quarantine_schema)
        self.quarantine.write(rows)
        self.result.quarantined += rows.num_rows

    def finish(self) -> TaskResult:
        """Close the files and report them; or report only the schema change; or raise."""
        result, spec = self.result, self.spec
        if result.needs_rerun:
            return result  # the coordinator evolves the schema or fetches schemas, then reruns
        if self.first_bad is not None and spec.errors_tolerance == "none":
            offset, first = self.first_bad
            raise exceptions.DecodeError(
                f"pipeline {spec.pipeline!r}: {spec.range.topic}[{spec.range.partition}] offset "
                f"{offset} could not be decoded ({first.error_class}: {first.message}); "
                f"{self.bad} bad record(s) in [{spec.range.start}, {spec.range.end}). Nothing "
                "was committed. Fix the producer, or set errors_tolerance: all to quarantine "
                "bad records."
            )
        result.changes = self.changes
        result.data_files = self.data.close()
        result.quarantine_files = self.quarantine.close() if self.quarantine else []
        result.bytes_written = sum(
            f.file_size_in_bytes for f in result.data_files + result.quarantine_files
        )
        return result

    def abort(self) -> None:
        """Stop writing; delete every file written so far (best-effort); report none."""
        self.writing = False
        self.changes = None
        self.result.records = self.result.quarantined = 0
        try:
            self.data.abort()
        finally:  # the quarantine writers too, whatever the data writers raised
            if self.quarantine is not None:
                self.quarantine.abort()
