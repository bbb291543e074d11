"""Step 2, prepare (the executor task): read one offset range, decode it, write data files.

A task joins no consumer group and commits nothing: it ``assign()``s its partition, seeks to
its start, reads ``read_committed`` until its position reaches the planned end (offsets may
have gaps: transaction markers, compaction), decodes, and writes data files under the table
location. Only the files' metadata and counts go back to the driver. Nothing is visible to
readers until the coordinator commits. Delivery: a retried task writes a new file set; only
one set per range is ever committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingestion import exceptions
from ingestion._pyiceberg_compat import write_data_files
from ingestion.avro import decode_avro
from ingestion.consumer import iter_batches, open_consumer
from ingestion.decode import Decoded, Rejection, decode_json, decode_keys
from ingestion.hooks import NO_HOOKS, FailureHooks
from ingestion.ranges import OffsetRange

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

DECODE_CHUNK = 50_000


@dataclass(frozen=True)
class TaskSpec:
    """Everything one executor task needs (pickled to the executor)."""

    pipeline: str
    range: OffsetRange
    kafka_config: dict[str, Any]
    value_format: str
    key_format: str
    table_metadata_json: str
    quarantine_metadata_json: str | None
    io_properties: dict[str, str]
    errors_tolerance: str
    commit_id: str
    writer_schemas: dict[int, str] = field(default_factory=dict)
    missing_schema_ids: frozenset[int] = frozenset()
    read_timeout_s: float = 60.0
    hooks: FailureHooks = NO_HOOKS


@dataclass
class TaskResult:
    """What a task returns: file metadata and counts, never rows."""

    range: OffsetRange
    data_files: list[DataFile] = field(default_factory=list)
    quarantine_files: list[DataFile] = field(default_factory=list)
    records: int = 0
    quarantined: int = 0
    bytes_written: int = 0
    new_fields: dict[str, pa.DataType] = field(default_factory=dict)
    unknown_schema_ids: set[int] = field(default_factory=set)
    promotions: dict[str, pa.DataType] = field(default_factory=dict)
    max_timestamp_ms: int | None = None

    @property
    def needs_rerun(self) -> bool:
        """The coordinator must change the schema or fetch writer schemas, then rerun."""
        return bool(self.new_fields or self.promotions or self.unknown_schema_ids)


@dataclass
class _Raw:
    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)


def read_range(spec: TaskSpec) -> _Raw:
    """Read ``[start, end)`` of one partition; raise :class:`ReadError` if it cannot finish."""
    rng = spec.range
    where = f"pipeline {spec.pipeline!r}, {rng.topic}[{rng.partition}] [{rng.start}, {rng.end})"
    raw = _Raw()
    with open_consumer(spec.kafka_config, f"{spec.pipeline}-reader") as consumer:
        for batch in iter_batches(consumer, rng, spec.read_timeout_s, where):
            raw.offsets += [m.offset() or 0 for m in batch]
            raw.keys += [m.key() for m in batch]
            raw.values += [m.value() for m in batch]
            raw.timestamps += [m.timestamp()[1] for m in batch]
    return raw


def _coordinates(spec: TaskSpec, raw: _Raw, rows: list[int]) -> dict[str, pa.Array]:
    """Topic, partition, offset and timestamp columns of the records at ``rows``."""
    take = pa.array(rows, pa.int64())
    timestamps = pa.array(raw.timestamps, pa.int64()).take(take)
    return {
        "_kafka_topic": pa.array([spec.range.topic] * len(rows), pa.large_string()),
        "_kafka_partition": pa.array([spec.range.partition] * len(rows), pa.int32()),
        "_kafka_offset": pa.array(raw.offsets, pa.int64()).take(take),
        "_kafka_timestamp": timestamps.cast(pa.timestamp("ms", tz="UTC")),
    }


def _quarantine_rows(spec: TaskSpec, raw: _Raw, rejected: list[Rejection]) -> pa.Table:
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
    """Order and cast columns to the table's Arrow schema (ms timestamps widen to us)."""
    return pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in schema], schema=schema)


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


def run_task(spec: TaskSpec) -> TaskResult:
    """Read, decode and write one offset range; return file metadata and counts.

    Raises:
        ReadError: the range could not be read to its end.
        DecodeError: a record failed to decode and ``errors_tolerance`` is ``none``.
    """
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table.metadata import TableMetadataUtil

    spec.hooks.fire("in_task", task=spec.range, stage="start")
    metadata: TableMetadata = TableMetadataUtil.parse_raw(spec.table_metadata_json)
    target = schema_to_pyarrow(metadata.schema())
    user_schema = pa.schema([f for f in target if not f.name.startswith("_kafka_")])
    required = tuple(f.name for f in user_schema if not f.nullable)
    raw = read_range(spec)
    result = TaskResult(spec.range)
    if raw.timestamps:
        result.max_timestamp_ms = max(raw.timestamps)
    keys, key_rejections = decode_keys(raw.keys, as_string=spec.key_format == "string")
    bad_keys = {r.index for r in key_rejections}
    value_rejections: list[Rejection] = []
    pieces = []
    for chunk_start in range(0, len(raw.values), DECODE_CHUNK):
        chunk = raw.values[chunk_start : chunk_start + DECODE_CHUNK]
        decoded = _decode_chunk(spec, chunk, user_schema, required, result)
        result.new_fields.update(decoded.new_fields)
        result.promotions.update(decoded.promotions)
        value_rejections += [
            Rejection(r.index + chunk_start, r.error_class, r.message) for r in decoded.rejections
        ]
        rows = [i + chunk_start for i in decoded.indices]
        keep = [position for position, row in enumerate(rows) if row not in bad_keys]
        table = (
            decoded.table.take(pa.array(keep, pa.int64()))
            if len(keep) != len(rows)
            else decoded.table
        )
        rows = [rows[position] for position in keep]
        columns = {
            **_coordinates(spec, raw, rows),
            "_kafka_key": keys.take(pa.array(rows, pa.int64())),
        }
        for name, column in columns.items():
            table = table.append_column(name, column)
        pieces.append(table)
    if result.needs_rerun:
        return result  # the coordinator evolves the schema or fetches schemas, then reruns
    rejected = merge_rejections(key_rejections, value_rejections)
    if rejected and spec.errors_tolerance == "none":
        first = rejected[0]
        raise exceptions.DecodeError(
            f"pipeline {spec.pipeline!r}: {spec.range.topic}[{spec.range.partition}] offset "
            f"{raw.offsets[first.index]} could not be decoded ({first.error_class}: "
            f"{first.message}); {len(rejected)} bad record(s) in [{spec.range.start}, "
            f"{spec.range.end}). Nothing was committed. Fix the producer, or set "
            "errors_tolerance: all to quarantine bad records."
        )
    io = load_file_io(spec.io_properties, metadata.location)
    if pieces:
        rows_table = _conform(pa.concat_tables(pieces, promote_options="permissive"), target)
        result.records = rows_table.num_rows
        result.data_files = write_data_files(metadata, io, rows_table)
    if rejected:
        assert spec.quarantine_metadata_json is not None
        quarantine = TableMetadataUtil.parse_raw(spec.quarantine_metadata_json)
        q_rows = _conform(
            _quarantine_rows(spec, raw, rejected), schema_to_pyarrow(quarantine.schema())
        )
        result.quarantined = q_rows.num_rows
        q_io = load_file_io(spec.io_properties, quarantine.location)
        result.quarantine_files = write_data_files(quarantine, q_io, q_rows)
    spec.hooks.fire("in_task", task=spec.range, stage="written", files=result.data_files)
    result.bytes_written = sum(
        f.file_size_in_bytes for f in result.data_files + result.quarantine_files
    )
    return result
