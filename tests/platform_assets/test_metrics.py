"""The metrics collector on the real test stack (the session broker, an embedded catalog of the
test's own, a Dagster instance): every figure is checked against Kafka's watermarks and the
table, then scraped over HTTP in the OpenMetrics format Prometheus asks for."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetMaterialization,
    DagsterInstance,
    MetadataValue,
)
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families

from ingestion.health.checks import AUDIT_CHECK, GROUP_CHECK
from ingestion.pipeline.run import run_pipeline
from ingestion.table.offsets import RUN_DURATION_MS, snapshot_properties
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.metrics import (
    CHECK_STATES,
    METRICS,
    PREFIX,
    PlatformCollector,
    metric_names,
    serve,
)
from platform_assets.pipelines import table_key
from resources.embedded import find_free_port
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.ledger import Ledger, LedgerProducer
from tests.support.pipelines import NewPipeline, records

pytestmark = pytest.mark.integration
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples_of(families: object) -> Samples:
    """(metric name, sorted labels) -> value, from parsed or collected families."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families  # type: ignore[attr-defined]
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(PREFIX + name, tuple(sorted(labels.items())))]


def test_the_figures_are_kafkas_and_the_tables(
    new_pipeline: NewPipeline,
    kafka: KafkaResource,
    tmp_path: Path,
    ledger: Ledger,
    ledger_producer: LedgerProducer,
) -> None:
    """Lag per partition is Kafka's high watermark minus the table's committed offset, with its
    age; the rates and row counts are the commits'; the dead letters the quarantine table's; the
    checks' states and the commit's phases the Dagster instance's; and the endpoint serves them
    in OpenMetrics (and Prometheus) text."""
    topic, spec = new_pipeline(
        "metrics_figures", partitions=2, in_process_max_records=10_000, errors_tolerance="all"
    )
    producer = ledger_producer
    producer.produce(topic, records(12, partition=0) + records(8, first=12, partition=1))
    producer.produce(topic, [(b"bad", b"{not json", 1)])
    iceberg = IcebergCatalogResource(state_dir=str(tmp_path))
    catalog = iceberg.load_catalog()
    report = run_pipeline(spec, kafka.client_config(), catalog, None, "test")
    assert (report.records, report.quarantined) == (20, 1)
    producer.produce(topic, records(5, first=100, partition=0))  # waiting: lag on partition 0

    with DagsterInstance.ephemeral() as instance:
        key = table_key(spec)
        instance.report_runless_asset_event(
            AssetCheckEvaluation(
                asset_key=key,
                check_name=GROUP_CHECK.name,
                passed=True,
                severity=AssetCheckSeverity.ERROR,
            )
        )
        instance.report_runless_asset_event(
            AssetCheckEvaluation(
                asset_key=key,
                check_name=AUDIT_CHECK.name,
                passed=False,
                severity=AssetCheckSeverity.WARN,
            )
        )
        timings = {"plan": 0.5, "prepare": 1.25, "commit": 0.125, "total": 1.875}
        instance.report_runless_asset_event(
            AssetMaterialization(key, metadata={"timings_s": MetadataValue.json(timings)})
        )
        collector = PlatformCollector(kafka, iceberg, instance, specs=lambda: [spec])
        try:
            collected = samples_of(collector.collect())
            port = find_free_port()
            server = serve(collector, "127.0.0.1", port)
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/metrics", headers={"Accept": OPENMETRICS}
                )
                with urllib.request.urlopen(request, timeout=30) as response:
                    assert response.headers["Content-Type"].startswith("application/openmetrics")
                    text = response.read().decode()
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=30
                ) as response:
                    plain = response.read().decode()  # a scraper without OpenMetrics
            finally:
                server.shutdown()
                server.server_close()
        finally:
            collector.close()

    scraped_at = time.time()
    scraped = samples_of(text_string_to_metric_families(text))
    assert {name for name, _ in samples_of(prometheus_families(plain))} >= {
        PREFIX + "lag_records",
        PREFIX + "check_state",
    }

    table = catalog.load_table(spec.table)
    head = table.current_snapshot()
    assert head is not None
    committed = {(topic, 0): 12, (topic, 1): 9}  # the bad record's offset is consumed too
    consumer = kafka.get_consumer()
    try:
        from confluent_kafka import TopicPartition

        high = {
            (topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in (0, 1)
        }
    finally:
        consumer.close()
    assert high == {(topic, 0): 17, (topic, 1): 9}
    for samples in (collected, scraped):
        for (t, p), end in high.items():
            labels = {"pipeline": spec.name, "topic": t, "partition": str(p)}
            assert value(samples, "end_offset", **labels) == end
            assert value(samples, "committed_offset", **labels) == committed[(t, p)]
            assert value(samples, "lag_records", **labels) == end - committed[(t, p)]
        waiting = value(samples, "lag_seconds", pipeline=spec.name, topic=topic, partition="0")
        oldest = next(e.timestamp_ms for e in ledger.entries if e.key == b"k100")
        assert 0 < waiting <= scraped_at - oldest / 1000 + 0.01
        assert value(samples, "lag_seconds", pipeline=spec.name, topic=topic, partition="1") == 0
        assert value(samples, "pipeline_up", pipeline=spec.name) == 1
        rows = len(table.scan().to_arrow())
        assert rows == 20
        assert value(samples, "table_records", pipeline=spec.name) == rows
        window = 300.0
        assert value(samples, "records_per_second", pipeline=spec.name) * window == 20
        assert value(samples, "commits_per_second", pipeline=spec.name) * window == 1
        summary = dict(head.summary.additional_properties)  # type: ignore[union-attr]
        size = int(summary["added-files-size"])
        assert value(samples, "bytes_per_second", pipeline=spec.name) * window == size
        assert value(samples, "dead_letters_per_second", pipeline=spec.name) * window == 1
        assert len(catalog.load_table(spec.quarantine_table).scan().to_arrow()) == 1
        assert value(samples, "dead_letters", pipeline=spec.name) == 1
        assert value(samples, "last_commit_timestamp_seconds", pipeline=spec.name) == (
            head.timestamp_ms / 1000
        )
        duration = int(snapshot_properties(head)[RUN_DURATION_MS]) / 1000
        assert value(samples, "last_commit_duration_seconds", pipeline=spec.name) == duration
        snapshot = str(head.snapshot_id)
        assert value(samples, "last_commit_snapshot", pipeline=spec.name, snapshot_id=snapshot)
        for phase, seconds in timings.items():
            assert (
                value(samples, "last_commit_phase_seconds", pipeline=spec.name, phase=phase)
                == seconds
            )
        states = {
            check.name: {
                state
                for state in CHECK_STATES
                if value(samples, "check_state", pipeline=spec.name, check=check.name, state=state)
            }
            for check in pipeline_check_keys(spec)
        }
        assert states[GROUP_CHECK.name] == {"passed"}
        assert states[AUDIT_CHECK.name] == {"warn"}
        assert {name: s for name, s in states.items() if s != {"unknown"}}.keys() == {
            GROUP_CHECK.name,
            AUDIT_CHECK.name,
        }
    assert {name for name, _ in scraped} <= metric_names() | {
        PREFIX + name + "_total" for name in METRICS
    }


def test_an_unreadable_pipeline_is_down_and_the_scrape_still_answers(
    new_pipeline: NewPipeline, kafka: KafkaResource, tmp_path: Path
) -> None:
    """A catalog that cannot be read gives ``pipeline_up 0`` for the pipeline, not a failed
    scrape (Prometheus would then lose every other pipeline's figures too)."""
    _, spec = new_pipeline("metrics_down")
    unreadable = tmp_path / "file"
    unreadable.write_text("")  # a file where the catalog's folder should be
    iceberg = IcebergCatalogResource(state_dir=str(unreadable / "below"))
    collector = PlatformCollector(kafka, iceberg, specs=lambda: [spec])
    try:
        samples = samples_of(collector.collect())
    finally:
        collector.close()
    assert value(samples, "pipeline_up", pipeline=spec.name) == 0
    assert (PREFIX + "scrape_duration_seconds", ()) in samples
    assert not any(name == PREFIX + "lag_records" for name, _ in samples)


ROOT = Path(__file__).resolve().parent.parent.parent
DASHBOARD = ROOT / "docs" / "dashboards" / "kafka-iceberg.json"
METRIC_NAME = re.compile(r"\b" + PREFIX + r"[a-z_]+\b")


def test_the_dashboard_and_the_docs_name_only_exported_metrics() -> None:
    """The Grafana dashboard queries only metrics the exporter exports (and most of them), and
    docs/production.md's table lists exactly those: a renamed metric fails here, not on a
    Grafana screen showing "No data"."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries.append(dashboard["templating"]["list"][0]["query"]["query"])
    queried = {name for query in queries for name in METRIC_NAME.findall(query)}
    assert queried <= metric_names(), queried - metric_names()
    unused = metric_names() - queried
    uncharted = {"pipeline_info", "last_commit_snapshot", "end_offset", "committed_offset"}
    uncharted |= {"check_timestamp_seconds", "scrape_duration_seconds"}  # for queries, tests
    assert unused == {PREFIX + name for name in uncharted}
    rows = re.findall(
        r"^\| `(" + PREFIX + r"[a-z_]+)`", (ROOT / "docs" / "production.md").read_text(), re.M
    )
    assert sorted(rows) == sorted(metric_names())
    assert len(rows) == len(set(rows))
