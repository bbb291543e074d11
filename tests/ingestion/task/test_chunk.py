"""One task's chunks decoded and written (``ChunkWriter``), on a real SQL catalog and local
files, without Kafka: good rows land with their Kafka coordinates and cluster, bad keys and
values go to quarantine files as one row per record, and once the task can report nothing (a
new field makes it rerun, a bad record under ``errors_tolerance: none`` fails it) it stops
writing and deletes what it wrote."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from ingestion.exceptions import DecodeError
from ingestion.formats.decode import Rejection
from ingestion.kafka.ranges import OffsetRange
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.schema import load_or_create_quarantine_table, load_or_create_table
from ingestion.task import writer as writer_module
from ingestion.task.chunk import ChunkWriter, merge_rejections
from ingestion.task.spec import RawChunk, TaskResult, TaskSpec
from resources.iceberg import IcebergCatalogResource
from tests.support.pipelines import make_spec

T0 = 1_790_000_000_000  # a Kafka timestamp (ms)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return IcebergCatalogResource(state_dir=str(tmp_path)).load_catalog()


def writer(catalog: Catalog, spec: PipelineSpec, cluster: str = "primary") -> ChunkWriter:
    """A task's chunk writer for ``orders[0]`` offsets [0, 100), as run_task builds it."""
    table = load_or_create_table(catalog, spec)
    quarantine = load_or_create_quarantine_table(catalog, spec)
    task = TaskSpec(
        pipeline=spec.name,
        range=OffsetRange("orders", 0, 0, 100),
        kafka_config={},
        value_format=spec.value_format,
        key_format=spec.key_format,
        table_metadata_json=table.metadata.model_dump_json(),
        quarantine_metadata_json=quarantine.metadata.model_dump_json(),
        io_properties={},
        errors_tolerance=spec.errors_tolerance,
        commit_id="c1",
        headers=spec.headers,
        cluster=cluster,
    )
    target = schema_to_pyarrow(table.metadata.schema())
    user = pa.schema([f for f in target if not f.name.startswith("_kafka_")])
    return ChunkWriter(task, table.metadata, target, user, TaskResult(task.range))


def chunk(
    values: list[bytes | None], first: int = 0, keys: list[bytes | None] | None = None
) -> RawChunk:
    offsets = list(range(first, first + len(values)))
    return RawChunk(
        offsets=offsets,
        keys=keys if keys is not None else [f"k{o}".encode() for o in offsets],
        values=values,
        timestamps=[T0 + o for o in offsets],
    )


def good(i: int) -> bytes:
    return orjson.dumps({"id": i, "name": f"n{i}", "amount": "1.25", "ts": "2026-11-22T10:00:00Z"})


def append(table: Table, files: list[DataFile]) -> pa.Table:
    """Commit ``files`` to ``table`` and read it back, by offset."""
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as app:
        for data_file in files:
            app.append_data_file(data_file)
    return table.refresh().scan().to_arrow().sort_by("_kafka_offset")


def written_files(catalog: Catalog, spec: PipelineSpec) -> list[Path]:
    location = catalog.load_table(spec.table).metadata.location.removeprefix("file://")
    return sorted(Path(location).rglob("*.parquet"))


def test_rows_land_with_their_coordinates_and_bad_records_once_in_quarantine(
    catalog: Catalog,
) -> None:
    spec = make_spec("orders", "chunk_ok", errors_tolerance="all")
    state = writer(catalog, spec, cluster="dr")
    state.add_chunk(chunk([good(0), b"{not json", good(2)]))
    # Offset 4: bad key and bad value, one quarantine row; offset 5: a bad key alone.
    state.add_chunk(chunk([good(3), b"[1,", good(5)], 3, [b"k3", b"\xff", b"\xfe"]))
    result = state.finish()
    assert (result.records, result.quarantined) == (3, 3)
    assert result.max_timestamp_ms == T0 + 5
    assert result.bytes_written == sum(
        f.file_size_in_bytes for f in result.data_files + result.quarantine_files
    )
    rows = append(catalog.load_table(spec.table), result.data_files)
    assert rows.column("id").to_pylist() == [0, 2, 3]
    assert rows.column("_kafka_offset").to_pylist() == [0, 2, 3]
    assert set(rows.column("_kafka_topic").to_pylist()) == {"orders"}
    assert set(rows.column("_kafka_cluster").to_pylist()) == {"dr"}
    assert rows.column("_kafka_key").to_pylist() == ["k0", "k2", "k3"]
    stamps = [int(t.timestamp() * 1000) for t in rows.column("_kafka_timestamp").to_pylist()]
    assert stamps == [T0, T0 + 2, T0 + 3]
    bad = append(catalog.load_table(spec.quarantine_table), result.quarantine_files)
    assert bad.column("_kafka_offset").to_pylist() == [1, 4, 5]
    assert bad.column("value").to_pylist() == [b"{not json", b"[1,", good(5)]
    assert bad.column("error_class").to_pylist() == [
        "ArrowInvalid",
        "UnicodeDecodeError, ArrowInvalid",
        "UnicodeDecodeError",
    ]
    assert set(bad.column("commit_id").to_pylist()) == {"c1"}
    assert set(bad.column("_kafka_cluster").to_pylist()) == {"dr"}


def test_a_bad_record_under_errors_tolerance_none_fails_the_task_and_deletes_its_files(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "BUFFER_BYTES", 0)  # each chunk goes to disk at once
    spec = make_spec("orders", "chunk_none")
    state = writer(catalog, spec)
    state.add_chunk(chunk([good(i) for i in range(5)]))
    assert written_files(catalog, spec) != []  # the first chunk is on disk
    state.add_chunk(chunk([good(5), b"{oops", b"[", good(8)], 5))
    assert not state.writing
    with pytest.raises(DecodeError, match=r"orders\[0\] offset 6 could not be decoded") as info:
        state.finish()
    assert "2 bad record(s) in [0, 100)" in str(info.value)
    assert written_files(catalog, spec) == []
    assert (state.result.records, state.result.quarantined) == (0, 0)


def test_a_new_field_makes_the_task_rerun_and_report_no_file(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "BUFFER_BYTES", 0)  # each chunk goes to disk at once
    spec = make_spec("orders", "chunk_new")
    state = writer(catalog, spec)
    state.add_chunk(chunk([good(i) for i in range(3)]))
    assert written_files(catalog, spec) != []
    state.add_chunk(chunk([orjson.dumps({"id": 3, "note": "new"})], 3))
    result = state.finish()
    assert result.needs_rerun
    assert result.new_fields == {"note": pa.string()}
    assert (result.data_files, result.records) == ([], 0)
    assert written_files(catalog, spec) == []


def test_json_keys_and_headers_become_their_columns(catalog: Catalog) -> None:
    spec = make_spec(
        "orders",
        "chunk_keys",
        key_format="json",
        headers=True,
        errors_tolerance="all",
        key_schema=[{"name": "tenant", "type": "string", "required": True}],
    )
    state = writer(catalog, spec)
    raw = chunk([good(0), good(1)], keys=[b'{"tenant": "a"}', b'{"other": 1}'])
    raw.headers = [[("h", b"1"), ("h", None)], None]
    state.add_chunk(raw)
    result = state.finish()
    rows = append(catalog.load_table(spec.table), result.data_files).to_pylist()
    assert [(r["_kafka_offset"], r["_kafka_key"], r["_kafka_headers"]) for r in rows] == [
        (0, {"tenant": "a"}, [{"key": "h", "value": b"1"}, {"key": "h", "value": None}]),
    ]
    bad = append(catalog.load_table(spec.quarantine_table), result.quarantine_files)
    assert bad.column("_kafka_offset").to_pylist() == [1]
    assert bad.column("error_class").to_pylist() == ["MissingRequiredField"]


def test_one_rejection_per_record_in_offset_order() -> None:
    merged = merge_rejections(
        [Rejection(4, "UnicodeDecodeError", "key: bad"), Rejection(0, "KeyTypeMismatch", "key")],
        [Rejection(4, "ArrowInvalid", "not JSON"), Rejection(2, "NullValue", "null")],
    )
    assert [(r.index, r.error_class, r.message) for r in merged] == [
        (0, "KeyTypeMismatch", "key"),
        (2, "NullValue", "null"),
        (4, "UnicodeDecodeError, ArrowInvalid", "key: bad; value: not JSON"),
    ]
    assert merge_rejections([], []) == []
