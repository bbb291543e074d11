"""The executor task's streaming, partitioned writer end to end: one file per
partition value per task, files rolled at the table's target size, and nothing reported (or
left on disk) by an attempt that must rerun or fail.

Tests that need a task to span several chunks run the tasks in-process (the engine's local
mode) with a small ``CHUNK_RECORDS``; the others run on Spark.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from ingestion import exceptions
from ingestion.pipeline import execute
from ingestion.pipeline.recovery import list_orphan_files
from ingestion.task import prepare as task
from tests.support.ledger import Ledger, Record
from tests.support.pipelines import Harness, NewPipeline

pytestmark = pytest.mark.integration
FIRST_DAY = date(2026, 10, 1)
BY_DAY = [{"source": "ts", "transform": "day"}]


def spread_records(count: int, days: int, first: int = 0, **extra: Any) -> list[Record]:
    """Valid records whose ``ts`` cycles over ``days`` days from FIRST_DAY (offset order)."""
    start = datetime(FIRST_DAY.year, FIRST_DAY.month, FIRST_DAY.day, 12, tzinfo=UTC)
    return [
        (
            f"k{i}".encode(),
            orjson.dumps(
                {"id": i, "name": f"n{i}", "ts": (start + timedelta(days=i % days)).isoformat()}
                | extra
            ),
            None,
        )
        for i in range(first, first + count)
    ]


def committed_files(table: Table) -> list[DataFile]:
    """The data files of the table's current snapshot."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def file_days(table: Table, data_file: DataFile) -> set[date]:
    """The days of the ``ts`` values stored in one data file (read from the file itself)."""
    with table.io.new_input(data_file.file_path).open() as stream:
        stamps = pq.read_table(stream, columns=["ts"]).column("ts").to_pylist()
    return {stamp.date() for stamp in stamps}


def day_number(day: date) -> int:
    """Iceberg's day partition value: days since 1970-01-01."""
    return (day - date(1970, 1, 1)).days


def test_spread_over_30_days_lands_one_file_per_day(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task, 3,000 records over 30 day-partitions read in 6 chunks: exactly one file per
    day, each holding only its day's rows, every record once."""
    monkeypatch.setattr(task, "CHUNK_RECORDS", 500)
    _, spec = new_pipeline(
        "spread",
        produce=spread_records(3000, days=30),
        partition_by=BY_DAY,
        max_records_per_task=10_000,
    )
    report = harness.run(spec, use_spark=False)
    assert (report.records, report.files) == (3000, 30)
    table = harness.table(spec)
    files = committed_files(table)
    expected = [FIRST_DAY + timedelta(days=d) for d in range(30)]
    assert sorted(f.partition[0] for f in files) == [day_number(d) for d in expected]
    for data_file in files:
        (day,) = file_days(table, data_file)
        assert day_number(day) == data_file.partition[0], data_file.file_path
        assert data_file.record_count == 100
    harness.assert_exactly_once(spec, ledger)


def test_task_larger_than_the_target_size_rolls_files(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger
) -> None:
    """On Spark: a 6,000-record task over 2 days with a 16 KiB target rolls each day's file at
    the target; only a day's last file may be smaller."""
    target = 16 * 1024
    _, spec = new_pipeline(
        "rolling",
        produce=spread_records(6000, days=2),
        partition_by=BY_DAY,
        max_records_per_task=10_000,
        target_file_size_bytes=target,
    )
    report = harness.run(spec)
    assert report.records == 6000
    table = harness.table(spec)
    by_day: dict[int, list[DataFile]] = defaultdict(list)
    for data_file in committed_files(table):
        by_day[data_file.partition[0]].append(data_file)
        assert file_days(table, data_file) == {
            FIRST_DAY + timedelta(days=data_file.partition[0] - day_number(FIRST_DAY))
        }
    assert sorted(by_day) == [day_number(FIRST_DAY), day_number(FIRST_DAY) + 1]
    for files in by_day.values():
        assert len(files) >= 2, "3,000 rows of a day are well over 16 KiB: the file must roll"
        assert sum(f.file_size_in_bytes < target for f in files) <= 1
    harness.assert_exactly_once(spec, ledger)


def test_schema_change_mid_stream_reports_and_leaves_no_files(
    harness: Harness, new_pipeline: NewPipeline, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R36: a new field in the task's 4th chunk, after 3 chunks were written: the attempt
    reports no file and deletes what it wrote; the rerun lands every record once."""
    monkeypatch.setattr(task, "CHUNK_RECORDS", 500)
    results: list[task.TaskResult] = []

    def recording(spec: task.TaskSpec) -> task.TaskResult:
        results.append(task.run_task(spec))
        return results[-1]

    monkeypatch.setattr(execute, "run_task", recording)
    produced = spread_records(1500, days=3) + spread_records(500, 3, first=1500, note="new")
    _, spec = new_pipeline(
        "midstream", produce=produced, partition_by=BY_DAY, max_records_per_task=10_000
    )
    report = harness.run(spec, use_spark=False)
    first, rerun = results
    assert first.needs_rerun
    assert "note" in first.new_fields
    assert (first.data_files, first.quarantine_files, first.records) == ([], [], 0)
    assert (rerun.records, report.records) == (2000, 2000)
    table = harness.table(spec)
    assert "note" in table.schema().column_names
    assert list_orphan_files(table, older_than_s=0) == [], "the first attempt's files remain"
    assert {f.file_path for f in committed_files(table)} == {f.file_path for f in rerun.data_files}
    harness.assert_exactly_once(spec, ledger)


def test_bad_record_in_a_late_chunk_fails_and_leaves_no_files(
    harness: Harness, new_pipeline: NewPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R33: errors_tolerance none, a bad record in the 4th chunk: the task raises naming its
    offset, counts every bad record of the range, and deletes the files of chunks 1-3."""
    monkeypatch.setattr(task, "CHUNK_RECORDS", 500)
    produced = [*spread_records(1700, days=3), (b"bad", b"{not json", None)]
    produced += [*spread_records(299, days=3, first=1701), (b"bad2", b"[1]", None)]
    topic, spec = new_pipeline(
        "latebad", produce=produced, partition_by=BY_DAY, max_records_per_task=10_000
    )
    with pytest.raises(
        exceptions.IngestionError, match=r"offset 1700 could not be decoded"
    ) as info:
        harness.run(spec, use_spark=False)
    assert f"{topic}[0]" in str(info.value)
    assert "2 bad record(s) in [0, 2001)" in str(info.value)
    table = harness.table(spec)
    assert table.current_snapshot() is None
    assert list_orphan_files(table, older_than_s=0) == [], "the failed attempt's files remain"
