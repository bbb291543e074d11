"""Step 2, prepare (the executor task): read one offset range, decode it, write data files.

A task joins no consumer group and commits nothing: it ``assign()``s its partition, seeks to
its start, reads ``read_committed`` until its position reaches the planned end (offsets may
have gaps: transaction markers, compaction), and streams the range in bounded chunks: each
chunk is decoded and appended to rolling data files under the table location (one open file
per partition value, ingestion.writer), then dropped. Only the files' metadata and counts go
back to the driver. Nothing is visible to readers until the coordinator commits. Delivery: a
retried task writes a new file set; only one set per range is ever committed; an attempt that
reports no files (a rerun, a failure) deletes the ones it wrote, best-effort.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from ingestion.consumer import iter_batches, open_consumer
from ingestion.hooks import NO_HOOKS, FailureHooks
from ingestion.ranges import OffsetRange
from ingestion.task_chunk import ChunkWriter

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

# A task holds one chunk of records at a time: this many, or about this many bytes of values.
CHUNK_RECORDS = 25_000
CHUNK_BYTES = 32 * 2**20


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
class RawChunk:
    """One chunk of records as parallel per-record lists (index ``i`` is one record)."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    value_bytes: int = 0

    def extend(self, batch: list[Message]) -> None:
        """Append a consumed batch: one C-level pass per field, no per-record Python frame."""
        from confluent_kafka import Message

        self.offsets += cast("Iterator[int]", map(Message.offset, batch))  # never None here
        self.keys += map(Message.key, batch)
        self.values += map(Message.value, batch)
        self.timestamps += map(itemgetter(1), map(Message.timestamp, batch))
        self.value_bytes += sum(map(len, batch))


def read_chunks(spec: TaskSpec) -> Iterator[RawChunk]:
    """Read ``[start, end)`` of one partition in chunks of at most :data:`CHUNK_RECORDS`
    records (or about :data:`CHUNK_BYTES` of values); raise :class:`ReadError` if it cannot
    finish. Only one chunk is held at a time."""
    rng = spec.range
    where = f"pipeline {spec.pipeline!r}, {rng.topic}[{rng.partition}] [{rng.start}, {rng.end})"
    raw = RawChunk()
    with open_consumer(spec.kafka_config, f"{spec.pipeline}-reader") as consumer:
        for batch in iter_batches(consumer, rng, spec.read_timeout_s, where):
            while batch:
                room = CHUNK_RECORDS - len(raw.offsets)
                raw.extend(batch if len(batch) <= room else batch[:room])
                batch = [] if len(batch) <= room else batch[room:]
                if len(raw.offsets) >= CHUNK_RECORDS or raw.value_bytes >= CHUNK_BYTES:
                    yield raw
                    raw = RawChunk()
    if raw.offsets:
        yield raw


def run_task(spec: TaskSpec) -> TaskResult:
    """Read, decode and write one offset range chunk by chunk; return file metadata and counts.

    Memory is bounded by one chunk plus the open files' buffers, whatever the range's size.
    Delivery: nothing is committed. If the range needs a schema change (``needs_rerun``) or
    the task fails, the files it wrote are deleted (best-effort, else orphans for recovery)
    and none is reported; decoding goes on to the end without writing, so the result (or
    the error) covers the whole range.

    Raises:
        ReadError: the range could not be read to its end.
        DecodeError: a record failed to decode and ``errors_tolerance`` is ``none``.
    """
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table.metadata import TableMetadataUtil

    spec.hooks.fire("in_task", task=spec.range, stage="start")
    metadata: TableMetadata = TableMetadataUtil.parse_raw(spec.table_metadata_json)
    target = schema_to_pyarrow(metadata.schema())
    user_schema = pa.schema([f for f in target if not f.name.startswith("_kafka_")])
    state = ChunkWriter(spec, metadata, target, user_schema, TaskResult(spec.range))
    try:
        for raw in read_chunks(spec):
            state.add_chunk(raw)
        result = state.finish()
    except BaseException:
        state.abort()
        raise
    # After the try: a crash here (injected) leaves the written files as orphans, as a
    # killed executor would.
    spec.hooks.fire("in_task", task=spec.range, stage="written", files=result.data_files)
    return result
