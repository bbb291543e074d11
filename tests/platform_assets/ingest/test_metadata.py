"""Materialization metadata, pure: what a run reports (typed, so the UI plots it; optional
entries only when they say something), the commit log as a table of the newest commits, and a
topic's observation."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import MetadataValue, TableRecord

from ingestion.formats.bad_values import DecodeStats
from ingestion.health.state import Commit
from ingestion.kafka.topics import PartitionState, TopicState
from ingestion.pipeline.mirror import MirrorOutcome
from ingestion.pipeline.run import RunReport
from platform_assets.ingest.metadata import commit_log_metadata, run_metadata, topic_metadata

T = 1_790_000_000_000


def report(**fields: object) -> RunReport:
    base = RunReport(
        "orders",
        "c1",
        {("o", 0): 10},
        {("o", 0): 40},
        {("o", 0): 45},
        records=30,
        quarantined=1,
        bytes_written=2048,
        files=2,
        snapshot_id=77,
        committed=True,
        timings_s={"total": 1.5, "plan": 0.12345},
        decode_stats=DecodeStats(bulk_parses=3),
        executed_in="this process",
    )
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def test_a_committed_run_reports_its_figures_typed() -> None:
    metadata = run_metadata(report())
    assert metadata["committed"] == MetadataValue.bool(True)
    assert metadata["records"] == MetadataValue.int(30)
    assert metadata["lag_after"] == MetadataValue.int(5)
    assert metadata["records_per_s"] == MetadataValue.float(20.0)
    assert metadata["duration_s"] == MetadataValue.float(1.5)
    assert metadata["commit_id"] == MetadataValue.text("c1")
    assert metadata["snapshot_id"] == MetadataValue.text("77")
    assert metadata["offsets_after"] == MetadataValue.json({"o:0": 40})
    assert metadata["timings_s"] == MetadataValue.json({"total": 1.5, "plan": 0.123})
    assert metadata["decode_stats"].value["bulk_parses"] == 3
    optional = {
        "valid_through",
        "schema_changes",
        "lost_ranges",
        "kafka_group_mirror",
        "dead_letter_topic_copy",
        "dead_letter_copies",
        "late_copies_skipped",
    }
    assert not optional & set(metadata)  # nothing to say: not said


def test_a_run_that_committed_nothing_names_no_commit() -> None:
    metadata = run_metadata(report(committed=False, snapshot_id=None, executed_in=""))
    assert metadata["commit_id"] == MetadataValue.text("")
    assert metadata["snapshot_id"] == MetadataValue.text("")
    assert metadata["executed_in"] == MetadataValue.text("nothing to read")


def test_optional_entries_appear_when_they_say_something() -> None:
    metadata = run_metadata(
        report(
            valid_through_ms=T,
            schema_changes=["added optional column note (string)"],
            lost_ranges=["o[0] [0, 10)", "o[1] [3, 4)"],
            mirror=MirrorOutcome("g", error="timed out"),
            dead_letter_copies=1,
            skipped=2,
        )
    )
    assert metadata["valid_through"] == MetadataValue.timestamp(
        datetime.fromtimestamp(T / 1000, tz=UTC)
    )
    assert metadata["schema_changes"] == MetadataValue.md("- added optional column note (string)")
    assert metadata["lost_ranges"] == MetadataValue.text("o[0] [0, 10); o[1] [3, 4)")
    assert metadata["kafka_group_mirror"] == MetadataValue.text("timed out")
    assert metadata["dead_letter_copies"] == MetadataValue.int(1)
    assert metadata["late_copies_skipped"] == MetadataValue.int(2)
    failed_copy = run_metadata(report(dead_letter_copies=1, dead_letter_error="broker down"))
    assert failed_copy["dead_letter_topic_copy"] == MetadataValue.text("broker down")
    assert "dead_letter_copies" not in failed_copy
    assert run_metadata(report(mirror=MirrorOutcome("g")))["kafka_group_mirror"].value == "ok"


def commit(i: int) -> Commit:
    properties = {"kafka.commit-id": f"c{i}", "kafka.run-id": f"r{i}"}
    return Commit(100 + i, T + i * 1000, 10, 0, {("o", 1): 20 + i, ("o", 0): i}, properties)


def test_the_commit_log_shows_the_newest_commits_as_a_table() -> None:
    commits = [commit(i) for i in (3, 2, 1)]  # newest first
    metadata = commit_log_metadata(commits, "g", shown=2)
    assert metadata["group_id"] == MetadataValue.text("g")
    assert metadata["commits_shown"] == MetadataValue.int(2)
    rows = metadata["commit_log"].value.records
    assert rows[0] == TableRecord(
        {
            "committed_at": datetime.fromtimestamp((T + 3000) / 1000, tz=UTC).isoformat(),
            "snapshot_id": "103",
            "commit_id": "c3",
            "records": 10,
            "quarantined": 0,
            "inserts": 10,
            "updates": 0,
            "deletes": 0,
            "run_id": "r3",
            "offsets": "o:0=3, o:1=23",
        }
    )
    assert len(rows) == 2
    assert metadata["committed_offsets"] == MetadataValue.json({"o:0": 3, "o:1": 23})
    empty = commit_log_metadata([], "g")
    assert empty["commits_shown"] == MetadataValue.int(0)
    assert "last_commit_at" not in empty


def test_an_upsert_run_and_commit_show_inserts_updates_and_deletes() -> None:
    """mode: upsert (docs/cdc.md): the run's counts and rewritten files; the commit log reads
    them from the snapshot's kafka.cdc.* properties."""
    metadata = run_metadata(
        report(mode="upsert", inserts=4, updates=20, deletes=3, rewritten_files=2)
    )
    assert metadata["inserts"] == MetadataValue.int(4)
    assert metadata["updates"] == MetadataValue.int(20)
    assert metadata["deletes"] == MetadataValue.int(3)
    assert metadata["rewritten_files"] == MetadataValue.int(2)
    assert "inserts" not in run_metadata(report())  # append: every record is a row
    cdc = {"kafka.cdc.inserts": "4", "kafka.cdc.updates": "20", "kafka.cdc.deletes": "3"}
    upserted = Commit(9, T, 30, 1, {("o", 0): 40}, {"kafka.commit-id": "c9", **cdc})
    (row,) = commit_log_metadata([upserted], "g")["commit_log"].value.records
    assert (row.data["inserts"], row.data["updates"], row.data["deletes"]) == (4, 20, 3)


def test_a_topic_observation_sums_its_partitions() -> None:
    states = [
        TopicState("a", "id-a", (PartitionState(0, 5, 10), PartitionState(1, 0, 3))),
        TopicState("b", "id-b", (PartitionState(0, 0, 0),)),
    ]
    metadata = topic_metadata(states, T)
    assert metadata["topics"] == MetadataValue.json({"a": "id-a", "b": "id-b"})
    assert metadata["partitions"] == MetadataValue.int(3)
    assert metadata["end_offsets_total"] == MetadataValue.int(13)
    assert metadata["records_in_log"] == MetadataValue.int(8)
    assert metadata["end_offsets"].value["a:0"] == {"log_start": 5, "end": 10}
    assert "newest_record_time" in metadata
    assert "newest_record_time" not in topic_metadata(states, None)
