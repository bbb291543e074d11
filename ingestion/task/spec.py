"""What an executor task receives and returns, and its per-record buffer (no behaviour).

Kept apart from ingestion.task.prepare so that the task's chunk writer (ingestion.task.chunk)
and the task itself share these types without importing each other.

**The record guard** (:class:`RecordGuard`, :class:`RunGuard`): records the coordinator holds
back from a task until it can tell them apart.

Some records read in a range must not be ingested although Kafka returns them: so far MirrorMaker
2's late copies after a ``--source-lost`` failover (disaster recovery, R54), records the table
already holds under another cluster. A guard is how the core lets such a rule act without
knowing it:

- On the executor, a :class:`RecordGuard` (one per task, pickled with its ``TaskSpec``) screens
  each chunk before it is decoded: it takes out the *candidates* (records it cannot judge yet),
  and once resolved the records to *skip*.
- On the coordinator, a :class:`RunGuard` gives each task its guard, and, when tasks met
  candidates, reads what it needs (another cluster, say) and gives those tasks resolved guards
  for a rerun (``ingestion.pipeline.execute.prepare_files``).

Skipped offsets travel back in ``TaskResult.skipped`` and are recorded in the commit
(``ingestion.table.offsets.SKIPPED``), so both audits count them as read. A pipeline without a
guard pays nothing: ``TaskSpec.guard`` is None and no guard code is imported.

Delivery: a guard only takes records out of a chunk; it never writes or commits. A candidate
makes its task rerun with a new file set (the discarded one is deleted: it was never committed);
a record is skipped only when the resolved guard says so.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol, cast

import pyarrow as pa

from ingestion.formats.bad_values import DecodeStats
from ingestion.kafka.ranges import OffsetRange
from ingestion.pipeline.hooks import NO_HOOKS, FailureHooks

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyiceberg.manifest import DataFile

    from ingestion.kafka.ranges import Key


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
    # Records held back from this task (ingestion.task.spec: MM2's late copies); None: none.
    guard: RecordGuard | None = None
    # The name (platform configuration) of the cluster the range is read on: every data and
    # quarantine row records it in _kafka_cluster (docs/cluster-column.md).
    cluster: str = "primary"
    # mode: upsert (R57): the key columns and the envelope the values are decoded from.
    key_fields: tuple[str, ...] = ()
    envelope: str = "debezium"


@dataclass
class TaskResult:
    """What a task returns: file metadata and counts; rows only in ``mode: upsert``, where
    ``changes`` is its range's last change per key (the coordinator applies them to the files
    they touch: ingestion/table/upsert.py)."""

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
    guard_candidates: int = 0  # records the guard could not judge yet: resolve, then rerun
    guard_met: set[Hashable] = field(default_factory=set)  # what they carried (RunGuard.resolve)
    skipped: list[int] = field(default_factory=list)  # offsets the guard skipped (read, not kept)
    changes: pa.Table | None = None  # mode: upsert: the last change per key, in offset order

    @property
    def needs_rerun(self) -> bool:
        """The coordinator must change the schema, fetch writer schemas or resolve the task's
        record guard, then rerun."""
        return bool(
            self.new_fields or self.promotions or self.unknown_schema_ids or self.guard_candidates
        )


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


@dataclass
class Screened:
    """What a guard took out of one chunk."""

    candidates: int = 0  # records it could not judge: the task asks for a rerun
    met: set[Hashable] = field(default_factory=set)  # what the candidates carried, for resolve()
    skipped: list[int] = field(default_factory=list)  # offsets read and not ingested


class RecordGuard(Protocol):
    """The executor side: screens a task's chunks before they are decoded (picklable)."""

    @property
    def needs_headers(self) -> bool:
        """Whether screening reads the records' headers (the task then reads them)."""
        ...

    def screen(self, raw: RawChunk, keep_headers: bool) -> tuple[RawChunk, Screened]:
        """``raw`` without the records taken out, and what was taken; the result keeps its
        headers only when ``keep_headers`` (the pipeline writes them)."""
        ...


class RunGuard(Protocol):
    """The coordinator side: the guards of one run's tasks."""

    def task_guards(self) -> dict[Key, RecordGuard]:
        """The guard of each (topic, partition) it holds records back in."""
        ...

    def resolve(self, met: dict[Key, set[Hashable]]) -> dict[Key, RecordGuard]:
        """Guards that can judge the candidates the tasks ``met``, per (topic, partition).

        Raises:
            IngestionError: what it needs cannot be read (nothing is committed).
        """
        ...
