"""Continuous mode (ingestion/pipeline/stream.py) keeps run-per-commit's guarantees, judged by the
oracle:
a stream SIGKILLed mid-commit loses and duplicates nothing; a commit that lands first (a run,
an operator's action: all compare-and-set) makes the stream re-plan, never overwrite."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ingestion.health.state import commits_of
from ingestion.pipeline.hooks import FailureHooks
from ingestion.pipeline.run import RunReport
from ingestion.pipeline.stream import stream_pipeline
from resources.iceberg import IcebergCatalogResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import Harness, NewPipeline, records

pytestmark = pytest.mark.integration
PROJECT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("point", ["before_catalog_call", "after_catalog_call", "before_mirror"])
def test_stream_killed_mid_commit_then_restarted(
    point: str,
    harness: Harness,
    catalog_resource: IcebergCatalogResource,
    tmp_path: Path,
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    ledger: Ledger,
) -> None:
    """SIGKILL of a stream at its third commit, while records keep arriving; a new stream (and
    a run) then ingest the rest: every record exactly once."""
    topic, spec = new_pipeline(f"stream_killed_{point}", partitions=2, produce=40)
    config = tmp_path / "stream.json"
    config.write_text(
        json.dumps(
            {
                "spec": spec.model_dump(mode="json", by_alias=True),
                "point": point,
                "hit": 3,
                "bootstrap_servers": harness.kafka.bootstrap_servers,
                "state_dir": catalog_resource.state_dir,
            }
        )
    )
    stream = subprocess.Popen(
        [sys.executable, "-m", "tests.support.killed_stream", str(config)],
        cwd=PROJECT,
        stderr=subprocess.PIPE,
        text=True,
    )
    produced = 40
    deadline = time.monotonic() + 240
    while stream.poll() is None and time.monotonic() < deadline:
        ledger_producer.produce(topic, records(20, first=produced))
        produced += 20
        time.sleep(0.3)
    if stream.poll() is None:
        stream.kill()
    _, stderr = stream.communicate(timeout=30)
    assert stream.returncode == -signal.SIGKILL, stderr[-4000:]
    killed_commits = len(commits_of(harness.table(spec), spec.consumer_group_id))
    assert killed_commits >= 1  # the stream committed before it died

    ledger_producer.produce(topic, records(30, first=produced))
    reports: list[RunReport] = []
    iterations = iter(range(3))
    stream_pipeline(
        spec,
        harness.kafka.client_config(),
        harness.catalog,
        harness.cluster_id,
        0.1,
        should_stop=lambda: None if next(iterations, None) is not None else "done",
        on_report=reports.append,
    )
    assert reports[0].committed
    assert reports[0].records > 0
    assert not any(r.committed for r in reports[1:])  # nothing new: no commit, no snapshot
    harness.assert_exactly_once(spec, ledger)
    harness.assert_mirror_matches_table(spec)


def test_stream_replans_when_another_commit_lands_first(
    harness: Harness, new_pipeline: NewPipeline, ledger_producer: LedgerProducer, ledger: Ledger
) -> None:
    """A run commits the stream's planned range first: the stream's compare-and-set fails, it
    deletes its files, plans again from the new offsets and commits only what is new."""
    topic, spec = new_pipeline("stream_conflict", partitions=2, produce=100)
    raced = threading.Event()

    def commit_first(point: str, **context: Any) -> None:
        if not raced.is_set():
            raced.set()
            harness.run(spec, use_spark=False)
            ledger_producer.produce(topic, records(25, first=100))

    reports: list[RunReport] = []
    iterations = iter(range(3))
    summary = stream_pipeline(
        spec,
        harness.kafka.client_config(),
        harness.catalog,
        harness.cluster_id,
        0.1,
        should_stop=lambda: None if next(iterations, None) is not None else "done",
        on_report=reports.append,
        hooks=FailureHooks({"before_commit": commit_first}),
    )
    assert summary.conflicts == 1, summary
    assert summary.commits == 1, summary
    assert summary.records == 25, summary
    assert summary.stopped_because == "done"
    harness.assert_exactly_once(spec, ledger)


def test_a_switch_landing_after_should_stop_stops_the_stream_not_fails_it(
    harness: Harness, new_pipeline: NewPipeline
) -> None:
    """A failover commits between the stream's route check (``should_stop``) and its commit:
    the commit loses its compare-and-set, the next plan is refused (the table's route reads
    'dr'), nothing committed, and the stream goes on to ``should_stop``, which sees the route
    moved and stops it (the sensor starts the next stream there). Before, the refusal failed
    the stream with developer advice an operator could not follow. The switch is an empty
    commit carrying a failover's properties (a real switch needs two clusters:
    tests/platform_assets/dr/test_failover.py)."""
    from ingestion.table.offsets import (
        FAILOVER_TO,
        RESET_BY,
        TopicOffsets,
        commit_properties,
        snapshot_properties,
    )

    dr = {"name": "dr", "source_alias": "primary"}
    topic, spec = new_pipeline("stream_switched", partitions=1, produce=10, replicas=[dr])

    def fail_over_first(point: str, **context: Any) -> None:
        table = harness.catalog.load_table(spec.table)
        if any(FAILOVER_TO in snapshot_properties(s) for s in table.snapshots()):
            return
        offsets = {f"primary.{topic}": TopicOffsets("i", {0: 0})}
        properties = commit_properties(
            group_id=spec.consumer_group_id,
            offsets=offsets,
            commit_id="switch",
            cluster_id="k-dr",
            pipeline=spec.name,
        )
        properties |= {FAILOVER_TO: "dr", RESET_BY: "ops"}
        with (
            table.transaction() as transaction,
            transaction.update_snapshot(snapshot_properties=properties).fast_append(),
        ):
            pass

    conflicts: list[str] = []
    checks = iter([None, None, None])
    summary = stream_pipeline(
        spec,
        harness.kafka.client_config(),
        harness.catalog,
        harness.cluster_id,
        0.1,
        should_stop=lambda: next(checks, "route moved"),
        on_report=lambda report: None,
        hooks=FailureHooks({"before_commit": fail_over_first}),
        on_conflict=conflicts.append,
    )
    assert (summary.commits, summary.stopped_because) == (0, "route moved"), summary
    assert any("the table's route reads 'dr'" in message for message in conflicts), conflicts
    # A caller whose should_stop never notices (it passes the wrong cluster): the stream
    # fails on the third refused plan instead of looping without committing.
    from ingestion.exceptions import RouteClusterError

    with pytest.raises(RouteClusterError, match="the table's route reads 'dr'"):
        stream_pipeline(
            spec,
            harness.kafka.client_config(),
            harness.catalog,
            harness.cluster_id,
            0.1,
            should_stop=lambda: None,
            on_report=lambda report: None,
            sleep=lambda s: None,
        )
