"""The fanout writer on its own, on a real SQL catalog and local files (no Kafka, no Spark):
partition values, field types, and the table's declared sort order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from ingestion.formats.decode import merge_field_types
from ingestion.task import writer as writer_module
from ingestion.task.writer import FanoutWriter
from tests.support.catalogs import local_catalog, region_table


def test_a_partition_column_whose_name_parquet_sanitises_splits_and_reads_back(
    tmp_path: Path,
) -> None:
    catalog = local_catalog(tmp_path, "w")
    schema = Schema(
        NestedField(1, "event-type", StringType(), required=False),
        NestedField(2, "n", LongType(), required=False),
    )
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "event-type"))
    table = catalog.create_table("n.t", schema, partition_spec=spec)
    writer = FanoutWriter(table.metadata, table.io)
    rows = pa.table({"event-type": ["a", "b", "a"], "n": [1, 2, 3]})
    writer.write(rows.cast(pa.schema([("event-type", pa.large_string()), ("n", pa.int64())])))
    files = writer.close()
    assert len(files) == 2  # one per partition value
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as app:
        for data_file in files:
            app.append_data_file(data_file)
    back = catalog.load_table("n.t").scan(row_filter="n >= 0").to_arrow()
    assert sorted(back.column("n").to_pylist()) == [1, 2, 3]
    assert sorted(back.column("event-type").to_pylist()) == ["a", "a", "b"]


@pytest.mark.parametrize(
    ("seen", "new", "merged"),
    [
        ({"x": pa.float64()}, {"x": pa.int64()}, pa.float64()),  # a later chunk of whole numbers
        ({"x": pa.int64()}, {"x": pa.float64()}, pa.float64()),
        ({"x": pa.int64()}, {"x": pa.int64()}, pa.int64()),
        ({}, {"x": pa.string()}, pa.string()),
    ],
)
def test_chunks_and_tasks_merge_new_field_types_like_one_parse(
    seen: dict[str, pa.DataType], new: dict[str, pa.DataType], merged: pa.DataType
) -> None:
    merge_field_types(seen, new)
    assert seen["x"] == merged


@pytest.fixture
def sorted_table(tmp_path: Path) -> Table:
    """A table partitioned by ``region`` whose declared sort order is ``n`` descending."""
    order = SortOrder(SortField(2, IdentityTransform(), SortDirection.DESC, NullOrder.NULLS_LAST))
    return region_table(local_catalog(tmp_path, "w"), sort_order=order)


def chunk(regions: str, numbers: list[int]) -> pa.Table:
    return pa.table(
        {"region": pa.array(list(regions), pa.large_string()), "n": pa.array(numbers, pa.int64())}
    )


def file_numbers(data_file: DataFile) -> list[int]:
    return list(pq.read_table(data_file.file_path.removeprefix("file://")).column("n").to_pylist())


def test_a_declared_sort_order_sorts_each_file_and_marks_it(sorted_table: Table) -> None:
    writer = FanoutWriter(sorted_table.metadata, sorted_table.io)
    writer.write(chunk("abab", [1, 7, 3, 5]))
    writer.write(chunk("aa", [2, 9]))
    files = {f.partition[0]: f for f in writer.close()}
    assert {region: file_numbers(f) for region, f in files.items()} == {
        "a": [9, 3, 2, 1],
        "b": [7, 5],
    }
    order_id = sorted_table.metadata.default_sort_order_id
    assert order_id != 0
    assert {f.sort_order_id for f in files.values()} == {order_id}


def test_a_file_written_in_several_runs_is_not_marked_sorted(
    sorted_table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write flushed at once (no buffer): one file, two sorted runs, no sort order id."""
    monkeypatch.setattr(writer_module, "BUFFER_BYTES", 0)
    writer = FanoutWriter(sorted_table.metadata, sorted_table.io)
    writer.write(chunk("aa", [1, 3]))
    writer.write(chunk("aa", [2, 9]))
    (data_file,) = writer.close()
    assert file_numbers(data_file) == [3, 1, 9, 2]
    assert data_file.sort_order_id is None


def test_an_unsorted_table_keeps_arrival_order(tmp_path: Path) -> None:
    catalog = local_catalog(tmp_path, "w")
    schema = Schema(
        NestedField(1, "region", StringType(), required=False),
        NestedField(2, "n", LongType(), required=False),
    )
    table = catalog.create_table("n.t", schema)
    writer = FanoutWriter(table.metadata, table.io)
    writer.write(chunk("aaa", [2, 9, 1]))
    (data_file,) = writer.close()
    assert file_numbers(data_file) == [2, 9, 1]
    assert data_file.sort_order_id is None


def test_each_writer_names_new_files_and_both_sets_read_back_whole(sorted_table: Table) -> None:
    """A fresh uuid per writer (a retried task or compaction): the same rows written twice
    land in other files, so committing both keeps every row (a reused name would overwrite)."""
    sets = []
    for _ in range(2):
        writer = FanoutWriter(sorted_table.metadata, sorted_table.io)
        writer.write(chunk("ab", [1, 2]))
        sets.append(writer.close())
    first, second = sets
    assert not {f.file_path for f in first} & {f.file_path for f in second}
    table = sorted_table
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as app:
        for data_file in first + second:
            app.append_data_file(data_file)
    assert sorted(table.refresh().scan().to_arrow().column("n").to_pylist()) == [1, 1, 2, 2]


def test_nested_fields_whose_names_parquet_sanitises_keep_their_values(tmp_path: Path) -> None:
    """A struct field ``user-agent`` and a list element field ``p-q`` are written under
    Parquet-safe names and read back with their values (a cast by name would null them)."""
    from pyiceberg.types import ListType, StructType

    catalog = local_catalog(tmp_path, "w")
    schema = Schema(
        NestedField(1, "ctx", StructType(NestedField(2, "user-agent", StringType(), False)), False),
        NestedField(
            3,
            "items",
            ListType(4, StructType(NestedField(5, "p-q", LongType(), False)), False),
            False,
        ),
    )
    table = catalog.create_table("n.t", schema)
    rows = pa.table(
        {"ctx": [{"user-agent": "curl"}], "items": [[{"p-q": 7}, {"p-q": 8}]]}
    )  # arrow's own types (string, not large_string): cast to the table's first
    writer = FanoutWriter(table.metadata, table.io)
    writer.write(rows)
    files = writer.close()
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as app:
        for data_file in files:
            app.append_data_file(data_file)
    back = catalog.load_table("n.t").scan().to_arrow().to_pylist()
    assert back == [{"ctx": {"user-agent": "curl"}, "items": [{"p-q": 7}, {"p-q": 8}]}]


@pytest.mark.parametrize("kind", ["uuid", "double"])
def test_a_key_arrow_orders_otherwise_than_iceberg_sorts_but_leaves_files_unmarked(
    tmp_path: Path, kind: str
) -> None:
    """A UUID key (an Arrow extension type: sorted by its bytes) or a double key (NaN and -0.0
    ordered otherwise than the spec): the file is written, sorted, and not marked sorted."""
    import uuid

    from pyiceberg.types import DoubleType, UUIDType

    catalog = local_catalog(tmp_path, "w")
    key_type = UUIDType() if kind == "uuid" else DoubleType()
    schema = Schema(NestedField(1, "k", key_type, required=False))
    order = SortOrder(SortField(1, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_LAST))
    table = catalog.create_table("n.t", schema, sort_order=order)
    values: list[Any] = (
        [uuid.UUID(int=n).bytes for n in (3, 1, 2)] if kind == "uuid" else [3.0, 1.0, 2.0]
    )
    arrow_type = table.schema().as_arrow().field("k").type
    writer = FanoutWriter(table.metadata, table.io)
    writer.write(
        pa.table(
            {"k": pa.array(values, arrow_type.storage_type if kind == "uuid" else arrow_type)}
        ).cast(table.schema().as_arrow())
    )
    (data_file,) = writer.close()
    assert data_file.sort_order_id is None
    written = pq.read_table(data_file.file_path.removeprefix("file://")).column("k").to_pylist()
    expected = [uuid.UUID(bytes=v) for v in sorted(values)] if kind == "uuid" else sorted(values)
    assert written == expected
