"""The CLI's operator actions without Kafka: where the Dagster instance is found (for the
active-run count and the audit's cursor) and what is said without one, reset positions parsed,
and ``maintain`` run on a real embedded catalog. The actions end to end are in test_main.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from ingestion.exceptions import OperationRefusedError
from ingestion.spec.pipeline import StartingPosition
from ingestion.table.schema import load_or_create_table
from platform_assets.cli.actions import (
    audit_cursor,
    count_active_ingestion_runs,
    dagster_home,
    parse_datetime,
    parse_partitions,
    parse_position,
    run_action,
)
from platform_assets.instance import create_storage
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.pipelines import make_spec

SPEC = make_spec("orders", "cli_actions")


@pytest.fixture
def iceberg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> IcebergCatalogResource:
    """The embedded catalog in ``tmp_path``; no ``DAGSTER_HOME``."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    return IcebergCatalogResource(state_dir=str(tmp_path))


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("earliest", StartingPosition(mode="earliest")),
        ("latest", StartingPosition(mode="latest")),
        ("timestamp:1790000000000", StartingPosition(mode="timestamp", timestamp_ms=1790000000000)),
    ],
)
def test_reset_positions(text: str, position: StartingPosition) -> None:
    assert parse_position(text) == position


@pytest.mark.parametrize("text", ["yesterday", "timestamp:soon"])
def test_a_position_that_is_none_of_them_is_refused(text: str) -> None:
    with pytest.raises((ValidationError, ValueError, OperationRefusedError)):
        parse_position(text)


def test_partitions_and_datetimes_are_read_as_kafka_consumer_groups_writes_them() -> None:
    assert parse_partitions(None) is None
    assert parse_partitions(["orders:0,2", "refunds"]) == frozenset(
        {("orders", 0), ("orders", 2), ("refunds", -1)}  # -1: every partition of the topic
    )
    with pytest.raises(OperationRefusedError, match="TOPIC:PARTITION"):
        parse_partitions(["orders:x"])
    assert parse_datetime("2026-11-28T06:00:00") == parse_datetime("2026-11-28T06:00:00Z")
    with pytest.raises(OperationRefusedError, match="ISO-8601"):
        parse_datetime("yesterday")


def test_without_an_instance_nothing_is_counted_and_it_is_said(
    iceberg: IcebergCatalogResource,
) -> None:
    assert dagster_home(iceberg) == ""
    count, line = count_active_ingestion_runs(SPEC, iceberg)
    assert count == 0
    assert "active runs not counted (no Dagster instance: DAGSTER_HOME is unset)" in line
    cursor, where = audit_cursor(SPEC, iceberg)
    assert cursor is None
    assert where.startswith("the audit's cursor is unknown")


def test_the_embedded_stacks_instance_is_found_next_to_its_catalog(
    iceberg: IcebergCatalogResource, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("{}\n")
    assert dagster_home(iceberg) == ""  # no storage yet: the CLI never creates it
    assert not (home / "history").exists()
    create_storage(home)  # as make dev does before anything opens it
    assert dagster_home(iceberg) == str(home)
    assert count_active_ingestion_runs(SPEC, iceberg) == (
        0,
        f"0 active ingestion run(s) of 'cli_actions' in the Dagster instance {home}",
    )
    assert audit_cursor(SPEC, iceberg) == (
        None,
        "kept the commits after the audit's cursor (none yet)",
    )


def test_dagster_home_wins(
    iceberg: IcebergCatalogResource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    create_storage(tmp_path / "elsewhere")
    assert dagster_home(iceberg) == str(tmp_path / "elsewhere")


def test_maintain_runs_on_the_pipelines_table_and_says_what_it_kept(
    iceberg: IcebergCatalogResource,
) -> None:
    load_or_create_table(iceberg.load_catalog(), SPEC)
    args = argparse.Namespace(
        command="maintain",
        retention_hours=None,
        orphan_window_hours=2.0,
        apply=True,
        steps="compact,expire,orphans",
    )
    kafka = KafkaResource(bootstrap_servers="nowhere:1")
    lines = run_action(args, SPEC, kafka, iceberg)
    assert lines[0].startswith("the audit's cursor is unknown")
    assert lines[1].startswith("compacted 0 files into 0")
    assert lines[-1] == "removed 0 orphan files older than 2.00 h (as requested)"
    dry = run_action(argparse.Namespace(**{**vars(args), "apply": False}), SPEC, kafka, iceberg)
    assert dry[1:] == [
        "would compact 0 files in 0 partition(s)",
        "would expire 0 snapshots, kept 0 for the offsets watermark",
        "would remove 0 orphan files older than 2.00 h (as requested)",
        "dry run: nothing changed (add --apply)",
    ]
    one = run_action(argparse.Namespace(**{**vars(args), "steps": "expire"}), SPEC, kafka, iceberg)
    assert one[1:] == ["expired 0 snapshots, kept 0 for the offsets watermark"]
    with pytest.raises(OperationRefusedError, match="choose among compact, expire, orphans"):
        run_action(argparse.Namespace(**{**vars(args), "steps": "vacuum"}), SPEC, kafka, iceberg)
