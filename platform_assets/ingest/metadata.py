"""Materialization metadata: the figures a Kafka user reads, typed so the UI plots them."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from ingestion.health.state import Commit
from ingestion.kafka.ranges import Key
from ingestion.kafka.topics import TopicState
from ingestion.pipeline.run import RunReport


def _offsets(offsets: dict[Key, int]) -> MetadataValue:
    return MetadataValue.json({f"{t}:{p}": o for (t, p), o in sorted(offsets.items())})


def _time(ms: int) -> MetadataValue:
    return MetadataValue.timestamp(datetime.fromtimestamp(ms / 1000, tz=UTC))


def run_metadata(report: RunReport) -> dict[str, Any]:
    """Metadata of the table asset after one ingestion run (no secrets)."""
    metadata: dict[str, Any] = {
        "committed": MetadataValue.bool(report.committed),
        "records": MetadataValue.int(report.records),
        "quarantined": MetadataValue.int(report.quarantined),
        "bytes": MetadataValue.int(report.bytes_written),
        "files": MetadataValue.int(report.files),
        "lag_after": MetadataValue.int(report.lag_after),
        "records_per_s": MetadataValue.float(round(report.records_per_s, 1)),
        "duration_s": MetadataValue.float(round(report.timings_s.get("total", 0.0), 3)),
        "executed_in": MetadataValue.text(report.executed_in or "nothing to read"),
        "spark_tasks": MetadataValue.int(report.spark_tasks),
        "commit_id": MetadataValue.text(report.commit_id if report.committed else ""),
        "snapshot_id": MetadataValue.text(str(report.snapshot_id or "")),
        "offsets_before": _offsets(report.offsets_before),
        "offsets_after": _offsets(report.offsets_after),
        "timings_s": MetadataValue.json({k: round(v, 3) for k, v in report.timings_s.items()}),
        "decode_stats": MetadataValue.json(asdict(report.decode_stats)),
    }
    if report.mode == "upsert":  # what the commit did to the table's keys (R57)
        metadata |= {
            "inserts": MetadataValue.int(report.inserts),
            "updates": MetadataValue.int(report.updates),
            "deletes": MetadataValue.int(report.deletes),
            "rewritten_files": MetadataValue.int(report.rewritten_files),
        }
    if report.valid_through_ms is not None:
        metadata["valid_through"] = _time(report.valid_through_ms)
    if report.schema_changes:
        metadata["schema_changes"] = MetadataValue.md(
            "\n".join(f"- {c}" for c in report.schema_changes)
        )
    if report.lost_ranges:
        metadata["lost_ranges"] = MetadataValue.text("; ".join(report.lost_ranges))
    if report.mirror is not None:
        metadata["kafka_group_mirror"] = MetadataValue.text(report.mirror.error or "ok")
    if report.dead_letter_error is not None:
        metadata["dead_letter_topic_copy"] = MetadataValue.text(report.dead_letter_error)
    elif report.dead_letter_copies:
        metadata["dead_letter_copies"] = MetadataValue.int(report.dead_letter_copies)
    if report.skipped:  # read and skipped by the tasks' record guard: MM2's late copies (R54)
        metadata["late_copies_skipped"] = MetadataValue.int(report.skipped)
    return metadata


COMMIT_COLUMNS = [
    TableColumn("committed_at", "string"),
    TableColumn("snapshot_id", "string"),
    TableColumn("commit_id", "string"),
    TableColumn("records", "int"),
    TableColumn("quarantined", "int"),
    TableColumn("inserts", "int"),
    TableColumn("updates", "int"),
    TableColumn("deletes", "int"),
    TableColumn("run_id", "string"),
    TableColumn("offsets", "string"),
]


def commit_log_metadata(commits: list[Commit], group_id: str, shown: int = 20) -> dict[str, Any]:
    """Metadata of the commit-state asset: the newest commits as a table, and totals."""
    from ingestion.table.offsets import COMMIT_ID, RUN_ID

    rows = [
        TableRecord(
            {
                "committed_at": datetime.fromtimestamp(c.timestamp_ms / 1000, tz=UTC).isoformat(),
                "snapshot_id": str(c.snapshot_id),
                "commit_id": c.properties.get(COMMIT_ID, ""),
                "records": c.records,
                "quarantined": c.quarantined,
                **c.changes,
                "run_id": c.properties.get(RUN_ID, ""),
                "offsets": ", ".join(f"{t}:{p}={o}" for (t, p), o in sorted(c.offsets.items())),
            }
        )
        for c in commits[:shown]
    ]
    metadata: dict[str, Any] = {
        "group_id": MetadataValue.text(group_id),
        "commits_shown": MetadataValue.int(len(rows)),
        "commit_log": MetadataValue.table(rows, schema=TableSchema(COMMIT_COLUMNS)),
    }
    if commits:
        metadata["last_commit_at"] = _time(commits[0].timestamp_ms)
        metadata["committed_offsets"] = _offsets(commits[0].offsets)
    return metadata


def topic_metadata(states: list[TopicState], newest_ms: int | None) -> dict[str, Any]:
    """Observation metadata of one topic asset."""
    metadata: dict[str, Any] = {
        "topics": MetadataValue.json({s.topic: s.topic_id for s in states}),
        "partitions": MetadataValue.int(sum(len(s.partitions) for s in states)),
        "end_offsets_total": MetadataValue.int(sum(sum(s.end_offsets.values()) for s in states)),
        "records_in_log": MetadataValue.int(sum(s.record_span for s in states)),
        "end_offsets": MetadataValue.json(
            {
                f"{s.topic}:{p.partition}": {"log_start": p.log_start_offset, "end": p.end_offset}
                for s in states
                for p in s.partitions
            }
        ),
    }
    if newest_ms is not None:
        metadata["newest_record_time"] = _time(newest_ms)
    return metadata
