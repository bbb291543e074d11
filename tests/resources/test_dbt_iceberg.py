"""The dbt-duckdb source plugin that reads Iceberg tables through the platform's catalog: a
source is a stream of record batches at the table's committed snapshot, with the source's
``meta`` scan options pushed down; ``iceberg_table`` names another table; ``state_dir`` in the
profile points the embedded catalog elsewhere. Real embedded catalog and DuckDB, no dbt run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from dbt.adapters.duckdb.utils import SourceConfig

from resources.dbt_iceberg import Plugin
from resources.iceberg import IcebergCatalogResource


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An embedded catalog holding ``raw.orders`` (ids 1..5) in two snapshots."""
    monkeypatch.delenv("PLATFORM_CONFIG", raising=False)  # the embedded defaults
    catalog = IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()
    catalog.create_namespace("raw")
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "kind": ["a", "b", "a"]})
    table = catalog.create_table("raw.orders", rows.schema)
    table.append(rows)
    table.append(pa.table({"id": pa.array([4, 5], pa.int64()), "kind": ["b", "a"]}))
    return tmp_path


def source(identifier: str = "orders", **meta: Any) -> SourceConfig:
    return SourceConfig("raw", identifier, "raw", None, meta, [])


def test_a_source_reads_the_committed_table_as_a_batch_stream(state_dir: Path) -> None:
    plugin = Plugin("iceberg", {"state_dir": str(state_dir)})
    reader = plugin.load(source())
    assert isinstance(reader, pa.RecordBatchReader)
    rows = reader.read_all()
    assert sorted(rows.column("id").to_pylist()) == [1, 2, 3, 4, 5]
    # DuckDB queries the stream as dbt-duckdb hands it over.
    with duckdb.connect() as connection:
        connection.register("orders", plugin.load(source()))
        assert connection.execute("select count(*), sum(id) from orders").fetchall() == [(5, 15)]


def test_the_sources_meta_is_pushed_down_into_the_scan(state_dir: Path) -> None:
    plugin = Plugin("iceberg", {"state_dir": str(state_dir)})
    rows = plugin.load(source(row_filter="kind = 'a'", selected_fields=["id"])).read_all()
    assert rows.column_names == ["id"]
    assert sorted(rows.column("id").to_pylist()) == [1, 3, 5]
    table = IcebergCatalogResource(state_dir=str(state_dir)).load_catalog().load_table("raw.orders")
    first = table.history()[0].snapshot_id
    old = plugin.load(source(snapshot_id=first)).read_all()
    assert sorted(old.column("id").to_pylist()) == [1, 2, 3]


def test_iceberg_table_names_the_table_to_read(state_dir: Path) -> None:
    plugin = Plugin("iceberg", {"state_dir": str(state_dir)})
    rows = plugin.load(source("stg", iceberg_table="{schema}.orders")).read_all()
    assert rows.num_rows == 5


def test_the_profiles_state_dir_points_the_catalog_elsewhere(
    state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    empty = Plugin("iceberg", {"state_dir": str(tmp_path_factory.mktemp("empty"))})
    with pytest.raises(NoSuchTableError):
        empty.load(source())
