"""What an executor task receives and returns, and its per-record buffer (no behaviour).

Kept apart from ingestion.task.prepare so that the task's chunk writer (ingestion.task.chunk) and
the
task itself share these types without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from ingestion.formats.isolate import DecodeStats
from ingestion.kafka.ranges import OffsetRange
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyiceberg.manifest import DataFile


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
    headers: bool = False
    hooks: FailureHooks = NO_HOOKS
    engine_version: str = ""  # the driver's ingestion.task.engine_version.engine_fingerprint()
    # MM2's late copies (ingestion.dr.late_copies.guard): the (timestamp, key digest) pairs of the
    # partition's uncopied records, and once read on the source their byte-for-byte identities.
    late_copy_ids: frozenset[tuple[int, str | None]] = frozenset()
    late_copy_digests: frozenset[bytes] | None = None
    # The name (platform configuration) of the cluster the range is read on: every data and
    # quarantine row records it in _kafka_cluster (docs/cluster-column.md).
    cluster: str = "primary"


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
    decode_stats: DecodeStats = field(default_factory=DecodeStats)
    """How the task's values were decoded (bulk, alone, screened): the fast path's counters."""
    late_copy_candidates: int = 0  # records that may be MM2's late copies: verify, then rerun
    late_copy_met: set[tuple[int, str | None]] = field(default_factory=set)  # their weak ids
    late_copies: list[int] = field(default_factory=list)  # offsets skipped as late copies

    @property
    def needs_rerun(self) -> bool:
        """The coordinator must change the schema, fetch writer schemas or read the source's
        uncopied records, then rerun."""
        return bool(
            self.new_fields or self.promotions or self.unknown_schema_ids
            or self.late_copy_candidates
        )  # fmt: skip


@dataclass
class RawChunk:
    """One chunk of records as parallel per-record lists (index ``i`` is one record)."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    value_bytes: int = 0
    headers: list[Any] | None = None  # Message.headers() of each record, when asked

    def extend(self, batch: list[Message]) -> None:
        """Append a consumed batch: one C-level pass per field, no per-record Python frame."""
        from confluent_kafka import Message

        self.offsets += cast("Iterator[int]", map(Message.offset, batch))  # never None here
        self.keys += map(Message.key, batch)
        self.values += map(Message.value, batch)
        self.timestamps += map(itemgetter(1), map(Message.timestamp, batch))
        self.value_bytes += sum(map(len, batch))
        if self.headers is not None:
            self.headers += map(Message.headers, batch)
