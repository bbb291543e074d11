"""The fanout writer on its own, on a real SQL catalog and local files (no Kafka, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from ingestion.formats.decode import merge_field_types
from ingestion.task.writer import FanoutWriter


def test_a_partition_column_whose_name_parquet_sanitises_splits_and_reads_back(
    tmp_path: Path,
) -> None:
    catalog = SqlCatalog(
        "w", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    catalog.create_namespace("n")
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
