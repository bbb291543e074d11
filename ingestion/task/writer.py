"""Rolling, partitioned Parquet writers for one executor task: data files, never a commit.

A task hands its rows to a :class:`FanoutWriter` chunk by chunk. Each chunk is split by
partition value in one vectorised pass (the table's partition transforms, then one hash
group-by); the parts are held up to :data:`BUFFER_BYTES` in all, then the largest is appended
to the open file of its partition value: at most one open file per partition value, rolled
to a new file only when it reaches the table's ``write.target-file-size-bytes`` (on disk).
When the table declares a sort order, each part is sorted by it before it is written
(``ingestion.table.sort_order``), and a file written in one such run is marked sorted.
Files are laid out and described as pyiceberg's own writer does (same field ids, Parquet
settings, statistics, partition records and paths), built from pyiceberg's public helpers.

Delivery: the writer commits nothing. File names carry a fresh uuid per writer (one per task
attempt), so a retried task writes a new file set. :meth:`FanoutWriter.abort` deletes what
was written, best-effort; a file it cannot delete is an orphan that recovery removes.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingestion.table.sort_order import marks_files, try_sort_rows, write_order

if TYPE_CHECKING:
    from pyiceberg.io import FileIO, OutputFile
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionKey
    from pyiceberg.table.metadata import TableMetadata

PROBE_ROWS = 1_000  # rows written first to a writer that has not yet seen its bytes per row
# Rows are held (all partition values together) up to this many Arrow bytes before the largest
# value's are written: larger row groups when a chunk spreads over many partition values.
BUFFER_BYTES = 16 * 2**20
_ROW = "_fanout_row"


@dataclass
class _OpenFile:
    """One Parquet file being written: its stream, writer and row count."""

    output: OutputFile
    stream: Any
    writer: Any
    partition_key: PartitionKey | None
    rows: int = 0
    runs: int = 0  # sorted runs written to it: the file is sorted when there is one


class FanoutWriter:
    """Writes rows of one table to rolling Parquet files, one open file per partition value.

    Rows must be in the table's Arrow schema (``schema_to_pyarrow(metadata.schema())``).

    Delivery: nothing is committed; :meth:`close` returns the files' metadata for the
    coordinator, :meth:`abort` deletes the files (best-effort) and returns nothing.
    """

    def __init__(self, metadata: TableMetadata, io: FileIO, *, sorted_input: bool = False) -> None:
        """``sorted_input``: the caller passes all rows already in the table's sort order (a
        compaction sorting a whole group); they are written as they come, each file as one
        sorted run."""
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            parquet_path_to_id_mapping,
            schema_to_pyarrow,
        )
        from pyiceberg.schema import sanitize_column_names
        from pyiceberg.table import TableProperties
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.utils.properties import property_as_int

        from ingestion._pyiceberg_compat import parquet_writer_kwargs

        self._metadata, self._io = metadata, io
        self._order = write_order(metadata)
        self._marked = self._order if self._order and marks_files(metadata, self._order) else None
        self._sorted_input = sorted_input
        props = metadata.properties
        self._file_schema = sanitize_column_names(metadata.schema())  # as pyiceberg writes
        self._arrow_schema = schema_to_pyarrow(self._file_schema, include_field_ids=True)
        self._table_arrow_schema = schema_to_pyarrow(metadata.schema(), include_field_ids=True)
        self._stats_plan = compute_statistics_plan(self._file_schema, props)
        self._id_mapping = parquet_path_to_id_mapping(self._file_schema)
        self._writer_kwargs = parquet_writer_kwargs(props)
        self._locations = load_location_provider(metadata.location, props)
        self._target = property_as_int(
            props,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
        )
        self._row_group_rows = property_as_int(
            props,
            TableProperties.PARQUET_ROW_GROUP_LIMIT,
            TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
        )
        self._spec = metadata.spec()
        self._uuid = uuid.uuid4()  # fresh per task attempt: file names never repeat
        self._count = 0
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._pending: dict[tuple[Any, ...], list[pa.Table]] = {}  # rows not yet written
        self._pending_bytes: dict[tuple[Any, ...], int] = {}
        self._keys: dict[tuple[Any, ...], PartitionKey | None] = {}
        self._closed: list[DataFile] = []
        self._paths: list[str] = []
        self._bytes = self._rows = 0  # flushed so far: the bytes-per-row estimate

    @property
    def files_opened(self) -> int:
        """How many files this writer has created so far (open or closed)."""
        return len(self._paths)

    def write(self, rows: pa.Table) -> None:
        """Append ``rows`` (any partition values) to the open file of each value."""
        if rows.num_rows == 0:
            return
        # Split on the table's column names, then rename to the file schema (pyiceberg
        # sanitises names such as 'event-type' in Parquet files).
        split = [((), rows)] if self._spec.is_unpartitioned() else self._split(rows)
        parts = [(value, self._to_file_schema(part)) for value, part in split]
        for value, part in parts:
            self._pending.setdefault(value, []).append(part)
            self._pending_bytes[value] = self._pending_bytes.get(value, 0) + part.nbytes
        while sum(self._pending_bytes.values()) > BUFFER_BYTES:
            self._flush(max(self._pending_bytes, key=self._pending_bytes.__getitem__))

    def close(self) -> list[DataFile]:
        """Finish every open file; return all files written, in the order they were closed."""
        for value in list(self._pending):
            self._flush(value)
        for value in list(self._open):
            self._finish(value)
        return list(self._closed)

    def _flush(self, value: tuple[Any, ...]) -> None:
        """Write the rows held for ``value`` to its file: in the table's sort order if it has
        one, in arrival order otherwise."""
        del self._pending_bytes[value]
        rows = pa.concat_tables(self._pending.pop(value))
        if self._order is not None and not self._sorted_input:
            ordered = try_sort_rows(rows, self._metadata.schema(), self._order)
            if ordered is None:  # Arrow cannot sort these keys: unsorted from now on, unmarked
                self._order = self._marked = None
            rows = rows if ordered is None else ordered
        self._append(value, rows)

    def abort(self) -> None:
        """Close and delete every file written (best-effort: leftovers are orphans)."""
        for open_file in self._open.values():  # each closed on its own: none left open
            with contextlib.suppress(Exception):  # the file is deleted (or orphaned) below
                open_file.writer.close()
            with contextlib.suppress(Exception):
                open_file.stream.close()
        self._open.clear()
        self._closed.clear()
        self._pending.clear()
        self._pending_bytes.clear()
        for path in self._paths:
            with contextlib.suppress(Exception):  # an undeletable file is an orphan for recovery
                self._io.delete(path)
        self._paths.clear()

    def _to_file_schema(self, rows: pa.Table) -> pa.Table:
        """``rows`` under the file's Parquet-safe names. Each column is cast to the table's
        own type first (a cast matches struct fields by name: cast straight to a sanitised
        name such as ``user_x2Dagent``, ``user-agent`` would come out null), then viewed under
        the file's names, the same layout."""
        columns = []
        for column, named, field in zip(
            rows.columns, self._table_arrow_schema, self._arrow_schema, strict=True
        ):
            if column.type != named.type:
                column = column.cast(named.type)
            if named.type != field.type:
                column = pa.chunked_array([c.view(field.type) for c in column.chunks], field.type)
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._arrow_schema)

    def _split(self, rows: pa.Table) -> list[tuple[tuple[Any, ...], pa.Table]]:
        """Group ``rows`` by partition value: one transform per field, one hash group-by."""
        schema = self._metadata.schema()
        names = [f"_partition_{i}" for i in range(len(self._spec.fields))]
        keyed = pa.table({_ROW: pa.array(range(rows.num_rows), pa.int64())})
        for name, part in zip(names, self._spec.fields, strict=True):
            source = schema.find_field(part.source_id)
            column = rows.column(schema.find_column_name(part.source_id) or source.name)
            keyed = keyed.append_column(
                name, part.transform.pyarrow_transform(source.field_type)(column)
            )
        groups = keyed.group_by(names, use_threads=False).aggregate([(_ROW, "list")])
        values = list(zip(*(groups.column(n).to_pylist() for n in names), strict=True))
        self._remember(values)
        if len(values) == 1:  # all on one partition value: no copy
            return [(values[0], rows)]
        indices = groups.column(f"{_ROW}_list").combine_chunks()
        return [
            (value, rows.take(part.values)) for value, part in zip(values, indices, strict=True)
        ]

    def _remember(self, values: list[tuple[Any, ...]]) -> None:
        """The partition key of each value not seen before (as pyiceberg builds it)."""
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

        for value in values:
            if value not in self._keys:
                self._keys[value] = PartitionKey(
                    field_values=[
                        PartitionFieldValue(field=f, value=v)
                        for f, v in zip(self._spec.fields, value, strict=True)
                    ],
                    partition_spec=self._spec,
                    schema=self._metadata.schema(),
                )

    def _append(self, value: tuple[Any, ...], rows: pa.Table) -> None:
        """Write ``rows`` (one run) to the value's open file, rolling at the target size."""
        continued: _OpenFile | None = None
        while rows.num_rows:
            open_file = self._open.get(value) or self._start(value)
            if open_file is not continued and not (self._sorted_input and open_file.runs):
                open_file.runs += 1  # a new run, unless the input is one sorted run
            continued = open_file
            size = open_file.stream.tell()
            if self._rows:  # the rows that fit before the target, at the bytes per row so far
                fits = max(1, int((self._target - size) * self._rows / max(self._bytes, 1)))
            else:
                fits = PROBE_ROWS
            head, rows = rows.slice(0, fits), rows.slice(fits)
            open_file.writer.write_table(head, row_group_size=self._row_group_rows)
            open_file.rows += head.num_rows
            written = open_file.stream.tell()
            self._bytes, self._rows = self._bytes + written - size, self._rows + head.num_rows
            if written >= self._target:
                self._finish(value)

    def _start(self, value: tuple[Any, ...]) -> _OpenFile:
        import pyarrow.parquet as pq

        key = self._keys.get(value)
        name = f"00000-{self._count}-{self._uuid}.parquet"  # pyiceberg's own naming
        self._count += 1
        path = self._locations.new_data_location(data_file_name=name, partition_key=key)
        output = self._io.new_output(path)
        stream = output.create(overwrite=False)
        self._paths.append(path)
        writer = pq.ParquetWriter(
            stream, schema=self._arrow_schema, store_decimal_as_integer=True, **self._writer_kwargs
        )
        self._open[value] = _OpenFile(output, stream, writer, key)
        return self._open[value]

    def _finish(self, value: tuple[Any, ...]) -> None:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        open_file = self._open.pop(value)
        open_file.writer.close()
        open_file.stream.close()
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=open_file.writer.writer.metadata,
            stats_columns=self._stats_plan,
            parquet_column_mapping=self._id_mapping,
        )
        key = open_file.partition_key
        self._closed.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=open_file.output.location,
                file_format=FileFormat.PARQUET,
                partition=key.partition if key is not None else Record(),
                file_size_in_bytes=len(open_file.output),
                sort_order_id=self._marked.order_id
                if self._marked and open_file.runs == 1
                else None,
                spec_id=self._metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            )
        )


def write_data_files(
    metadata: TableMetadata, io: FileIO, parts: list[pa.Table], *, sorted_input: bool = False
) -> list[DataFile]:
    """Write ``parts`` (rows of the table, in its Arrow schema) with one :class:`FanoutWriter`
    and return the files' metadata; ``sorted_input`` as the writer's.

    Delivery: commits nothing; on any error the files written so far are deleted (best-effort)
    and the error is raised.
    """
    writer = FanoutWriter(metadata, io, sorted_input=sorted_input)
    try:
        for part in parts:
            writer.write(part)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
