"""The one home of private pyiceberg calls, against the installed pyiceberg: the Parquet settings
a table's properties give, and ``replace`` snapshots (with a test that fails once pyiceberg can
write them itself). Real SQL catalog and local files; no Kafka, no Spark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from ingestion._pyiceberg_compat import overwrite_files, parquet_writer_kwargs, replace_files
from ingestion.task.writer import FanoutWriter, write_data_files
from tests.support.catalogs import local_catalog, region_table

ROWS = pa.table(
    {"region": pa.array(["eu", "us", "eu", "ap"], pa.large_string()), "n": [1, 2, 3, 4]}
)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """An empty table partitioned by ``region`` (identity) in a fresh SQL catalog."""
    return region_table(local_catalog(tmp_path, "compat"))


def test_parquet_settings_follow_the_table_properties_as_pyiceberg_writes_them(
    table: Table, tmp_path: Path
) -> None:
    kwargs = parquet_writer_kwargs(
        {
            "write.parquet.compression-codec": "gzip",
            "write.parquet.compression-level": "7",
            "write.parquet.page-size-bytes": "4096",
            "write.parquet.dict-size-bytes": "1024",
        }
    )
    assert kwargs["compression"] == "gzip"
    assert kwargs["compression_level"] == 7
    assert kwargs["data_page_size"] == 4096
    assert kwargs["dictionary_pagesize_limit"] == 1024
    assert (
        parquet_writer_kwargs({"write.parquet.compression-codec": "uncompressed"})["compression"]
        == "none"
    )  # pyarrow's name for it
    # The arguments are pyarrow's own: a writer accepts them and applies the codec.
    path = tmp_path / "f.parquet"
    with pq.ParquetWriter(path, ROWS.schema, **kwargs) as writer:
        writer.write_table(ROWS)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "GZIP"


def test_replace_files_commits_a_replace_snapshot_counted_as_spark_counts_one(
    table: Table,
) -> None:
    """Two files rewritten into one: a ``replace`` snapshot whose summary counts the rows
    removed and added (equal) and keeps the totals; the rows read back unchanged."""
    for rows in (ROWS.slice(0, 2), ROWS.slice(2, 2)):
        table.append(rows)
    inputs = [task.file for task in table.scan().plan_files()]
    merged = table.scan().to_arrow()
    writer = FanoutWriter(table.metadata, table.io)
    writer.write(merged)
    outputs = writer.close()
    with table.transaction() as transaction, replace_files(transaction, table.io, {"k": "v"}) as r:
        for data_file in inputs:
            r.delete_data_file(data_file)
        for data_file in outputs:
            r.append_data_file(data_file)
    head = table.refresh().current_snapshot()
    assert head is not None
    assert head.summary is not None
    summary = head.summary
    assert summary.operation.value == "replace"
    assert summary["k"] == "v"
    assert summary["added-records"] == summary["deleted-records"] == "4"
    assert summary["total-records"] == "4"
    assert summary["total-data-files"] == str(len(outputs))
    back = table.scan().to_arrow().sort_by("n")
    assert back.column("n").to_pylist() == [1, 2, 3, 4]


def test_pyiceberg_still_cannot_record_replace_itself() -> None:
    """Fails when an upgraded pyiceberg summarises ``replace`` snapshots: then move compaction
    to its public call and drop :func:`replace_files`."""
    from pyiceberg.table.snapshots import Operation, Summary, update_snapshot_summaries

    with pytest.raises(ValueError, match="Operation not implemented"):
        update_snapshot_summaries(Summary(Operation.REPLACE))


def rewrite_each_file(table: Table, overwrite: Callable[..., Any] | None) -> None:
    """One overwrite that rewrites every live file into a new one (as copy-on-write does), by
    ``overwrite`` (ours) or, with None, pyiceberg's public ``update_snapshot().overwrite()``."""
    table.refresh()
    tasks = list(table.scan().plan_files())
    rows = table.scan().to_arrow()
    added = write_data_files(table.metadata, table.io, [rows])
    with table.transaction() as transaction:
        if overwrite is None:
            producer = transaction.update_snapshot().overwrite()
        else:
            producer = overwrite(transaction, table.io, {})
        with producer as change:
            for task in tasks:
                change.delete_data_file(task.file)
            for data_file in added:
                change.append_data_file(data_file)


def head_manifests(table: Table) -> int:
    head = table.refresh().current_snapshot()
    assert head is not None
    return len(head.manifests(table.io))


def test_overwrites_drop_the_manifests_left_with_no_live_file(table: Table) -> None:
    """Ten copy-on-write rewrites by :func:`overwrite_files`: the head carries the manifests of
    its live files and its own deletes, not one more per overwrite; the rows are unchanged."""
    table.append(ROWS)
    for _ in range(10):
        rewrite_each_file(table, overwrite_files)
    assert head_manifests(table) <= 4
    assert sorted(table.scan().to_arrow().column("n").to_pylist()) == [1, 2, 3, 4]


def test_pyiceberg_overwrite_still_keeps_manifests_with_no_live_file(table: Table) -> None:
    """Fails once pyiceberg's own overwrite drops them: then commit upserts and compactions
    through ``update_snapshot().overwrite()`` again (ingestion/_pyiceberg_compat.py)."""
    table.append(ROWS)
    for _ in range(10):
        rewrite_each_file(table, None)
    assert head_manifests(table) >= 10, "pyiceberg drops dead manifests now: see this test"
