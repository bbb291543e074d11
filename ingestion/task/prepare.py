"""Step 2, prepare (the executor task): read one offset range, decode it, write data files.

A task joins no consumer group and commits nothing: it ``assign()``s its partition, seeks to
its start, reads ``read_committed`` until its position reaches the planned end (offsets may
have gaps: transaction markers, compaction), and streams the range in bounded chunks: each
chunk is decoded and appended to rolling data files under the table location (one open file
per partition value, ingestion.task.writer), then dropped. Only the files' metadata and counts go
back to the driver. Nothing is visible to readers until the coordinator commits. Delivery: a
retried task writes a new file set; only one set per range is ever committed; an attempt that
reports no files (a rerun, a failure) deletes the ones it wrote, best-effort.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import pyarrow as pa

from ingestion.kafka.consumer import iter_batches, open_consumer
from ingestion.task.chunk import ChunkWriter
from ingestion.task.engine_version import check_engine_version
from ingestion.task.spec import RawChunk, TaskResult, TaskSpec

if TYPE_CHECKING:
    from pyiceberg.table.metadata import TableMetadata

    from ingestion.task.spec import RecordGuard

__all__ = [  # the task's types live in ingestion.task.spec; callers import them from here
    "CHUNK_BYTES",
    "CHUNK_RECORDS",
    "RawChunk",
    "TaskResult",
    "TaskSpec",
    "read_chunks",
    "run_task",
]

# A task holds one chunk of records at a time: this many, or about this many bytes of values.
CHUNK_RECORDS = 25_000
CHUNK_BYTES = 32 * 2**20


def read_chunks(spec: TaskSpec) -> Generator[RawChunk]:
    """Read ``[start, end)`` of one partition in chunks of at most :data:`CHUNK_RECORDS`
    records (or about :data:`CHUNK_BYTES` of values); raise :class:`ReadError` if it cannot
    finish. Only one chunk is held at a time."""
    rng = spec.range
    where = f"pipeline {spec.pipeline!r}, {rng.topic}[{rng.partition}] [{rng.start}, {rng.end})"
    headers = spec.headers or (spec.guard is not None and spec.guard.needs_headers)
    raw = RawChunk(headers=[] if headers else None)
    with open_consumer(spec.kafka_config, f"{spec.pipeline}-reader") as consumer:
        for batch in iter_batches(consumer, rng, spec.read_timeout_s, where):
            while batch:
                room = CHUNK_RECORDS - len(raw.offsets)
                raw.extend(batch if len(batch) <= room else batch[:room])
                batch = [] if len(batch) <= room else batch[room:]
                if len(raw.offsets) >= CHUNK_RECORDS or raw.value_bytes >= CHUNK_BYTES:
                    yield raw
                    raw = RawChunk(headers=[] if headers else None)
    if raw.offsets:
        yield raw


def _screen(guard: RecordGuard, spec: TaskSpec, raw: RawChunk, state: ChunkWriter) -> RawChunk:
    """``raw`` without what the task's record guard skips (counted) or cannot judge yet (its
    candidates: then nothing of this attempt is reported, the coordinator reruns it)."""
    raw, taken = guard.screen(raw, spec.headers)
    state.result.guard_candidates += taken.candidates
    state.result.guard_met |= taken.met
    state.result.skipped += taken.skipped
    if taken.candidates and state.writing:
        state.abort()
    return raw


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
        EngineMismatchError: the executor runs another engine version than the driver.
    """
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table.metadata import TableMetadataUtil

    check_engine_version(spec.pipeline, spec.engine_version)
    spec.hooks.fire("in_task", task=spec.range, stage="start")
    metadata: TableMetadata = TableMetadataUtil.parse_raw(spec.table_metadata_json)
    target = schema_to_pyarrow(metadata.schema())
    user_schema = pa.schema([f for f in target if not f.name.startswith(("_kafka_", "_cdc_"))])
    state = ChunkWriter(spec, metadata, target, user_schema, TaskResult(spec.range))
    chunks = read_chunks(spec)
    try:
        for raw in chunks:
            if spec.guard is not None:  # records held back: ingestion.task.spec
                raw = _screen(spec.guard, spec, raw, state)
            if raw.offsets:
                state.add_chunk(raw)
        result = state.finish()
    except BaseException:
        state.abort()
        raise
    finally:
        chunks.close()  # closes the consumer now, not when the generator is collected
    # After the try: a crash here (injected) leaves the written files as orphans, as a
    # killed executor would.
    spec.hooks.fire("in_task", task=spec.range, stage="written", files=result.data_files)
    return result
