"""A scrape of the metrics endpoint during `make dev`, its figures checked
against the table (read with pyiceberg) and Kafka (watermarks read around the scrape).

The stack is the session's shared one (tests/support/dev_stack.py); the demo producer keeps
writing and the stream keeps committing while the test reads, so each figure is checked either
exactly against the commit the scrape names (``last_commit_snapshot``) or between what Kafka and
the table said just before and just after the scrape.
"""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import pytest
from dagster import AssetCheckKey, DagsterInstance
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from ingestion.health.state import commits_of
from ingestion.table.offsets import (
    OFFSETS_PREFIX,
    RUN_DURATION_MS,
    VALID_THROUGH_MS,
    decode_offsets,
    flatten,
    snapshot_properties,
)
from platform_assets.alerts.sensors import read_new_evaluations
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.metrics import CHECK_STATES, PREFIX, metric_names
from platform_assets.pipelines import load_pipelines
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from tests.support.dev_stack import DevStack, wait_for

pytestmark = pytest.mark.integration
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
WINDOW_S = 300.0  # platform metrics' default, as make dev starts it
FIRST_COMMIT_S = 240  # from the stack's start: the stream worker's first commit


def scrape(url: str) -> dict[str, list[Any]]:
    """The endpoint's samples by metric name, as Prometheus asks for them (OpenMetrics)."""
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def one(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    matching = [
        s.value for s in samples.get(PREFIX + name, []) if labels.items() <= s.labels.items()
    ]
    assert len(matching) == 1, (name, labels, samples.get(PREFIX + name))
    return float(matching[0])


def watermarks(kafka: KafkaResource, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    consumer = kafka.get_consumer()
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def test_a_scrape_during_make_dev_matches_the_table_and_kafka(dev_stack: DevStack) -> None:
    banner = dev_stack.banner
    url = re.search(r"Metrics:\s+(http://\S+/metrics)", banner)
    bootstrap = re.search(r"Kafka:\s+(\S+)", banner)
    assert url, banner
    assert bootstrap, banner
    spec = next(s for s in load_pipelines(dev_stack.pipelines) if s.name == "orders")
    kafka = KafkaResource(bootstrap_servers=bootstrap[1])

    def committed() -> dict[str, list[Any]] | None:
        try:
            samples = scrape(url[1])
        except OSError:  # the exporter is still starting
            return None
        return samples if samples.get(PREFIX + "last_commit_snapshot") else None

    wait_for("a commit in the metrics", committed, FIRST_COMMIT_S, every_s=3)

    started_ms = int(time.time() * 1000)
    before = watermarks(kafka, "orders", 4)
    samples = scrape(url[1])
    after = watermarks(kafka, "orders", 4)
    ended_ms = int(time.time() * 1000)

    assert set(samples) <= metric_names()  # every sample is a documented metric
    assert one(samples, "pipeline_up", pipeline="orders") == 1
    snapshot_id = int(
        next(
            s.labels["snapshot_id"]
            for s in samples[PREFIX + "last_commit_snapshot"]
            if s.labels["pipeline"] == "orders"
        )
    )

    # The table: the commit the scrape names, read with pyiceberg.
    catalog = IcebergCatalogResource(state_dir=str(dev_stack.state_dir)).load_catalog()
    table = catalog.load_table(spec.table)
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    properties = snapshot_properties(snapshot)
    offsets = flatten(decode_offsets(properties[OFFSETS_PREFIX + spec.consumer_group_id]))
    assert set(offsets) == {("orders", p) for p in range(4)}
    assert one(samples, "last_commit_timestamp_seconds", pipeline="orders") == (
        snapshot.timestamp_ms / 1000
    )
    if RUN_DURATION_MS in properties:  # an ingestion commit (not an operator action)
        assert one(samples, "last_commit_duration_seconds", pipeline="orders") == (
            int(properties[RUN_DURATION_MS]) / 1000
        )
    rows = len(table.scan(snapshot_id=snapshot_id).to_arrow())
    assert one(samples, "table_records", pipeline="orders") == rows > 0

    # Kafka: each partition's end between the watermarks before and after the scrape; the lag
    # is that end minus the commit's offset.
    planned_ms = int(properties.get(VALID_THROUGH_MS, snapshot.timestamp_ms))
    lag = 0.0
    for (topic, partition), next_offset in offsets.items():
        labels = {"pipeline": "orders", "topic": topic, "partition": str(partition)}
        end = one(samples, "end_offset", **labels)
        assert before[partition] <= end <= after[partition]
        assert one(samples, "committed_offset", **labels) == next_offset
        assert one(samples, "lag_records", **labels) == end - next_offset
        seconds = one(samples, "lag_seconds", **labels)
        assert (seconds == 0) == (end == next_offset)
        # a record waiting reached Kafka after the commit planned (the run was not capped)
        assert 0 <= seconds <= (ended_ms - planned_ms) / 1000 + 1
        lag += end - next_offset

    # The rates: the commits of the group up to that one, inside the window of a scrape made
    # between started_ms and ended_ms (a later start of the window counts fewer).
    ancestry = [
        c
        for c in commits_of(table, spec.consumer_group_id, limit=1_000_000)
        if c.timestamp_ms <= snapshot.timestamp_ms
    ]

    def window(now_ms: int, field: str) -> tuple[int, int]:
        inside = [c for c in ancestry if c.timestamp_ms > now_ms - WINDOW_S * 1000]
        if field == "records":
            return len(inside), sum(c.records for c in inside)
        return len(inside), sum(int(c.properties.get("added-files-size", "0")) for c in inside)

    for name, field in (("records_per_second", "records"), ("bytes_per_second", "bytes")):
        measured = one(samples, name, pipeline="orders") * WINDOW_S
        least, most = window(ended_ms, field)[1], window(started_ms, field)[1]
        assert least - 0.01 <= measured <= most + 0.01, (name, least, measured, most)
    commits = one(samples, "commits_per_second", pipeline="orders") * WINDOW_S
    assert window(ended_ms, "records")[0] - 0.01 <= commits <= window(started_ms, "records")[0]
    assert commits >= 1

    # Dead letters: the demo's records are all valid, and the figure is the quarantine table's.
    dead = one(samples, "dead_letters", pipeline="orders")
    if catalog.table_exists(spec.quarantine_table):
        quarantine = catalog.load_table(spec.quarantine_table)
        assert dead == len(quarantine.scan().to_arrow())
    else:
        assert dead == 0

    # The checks: one state each, the newest completed evaluation's in the Dagster instance.
    with DagsterInstance.from_config(str(dev_stack.state_dir / "dagster_home")) as instance:
        keys = pipeline_check_keys(spec)
        newest = {e.check: e for e in read_new_evaluations(instance, keys, None)[0]}
    for key in keys:
        assert isinstance(key, AssetCheckKey)
        states = {
            state
            for state in CHECK_STATES
            if one(samples, "check_state", pipeline="orders", check=key.name, state=state)
        }
        assert len(states) == 1, (key.name, states)
        if key.name not in newest:
            continue  # evaluated after the scrape, maybe: nothing to compare
        evaluation = newest[key.name]
        stamp = one(samples, "check_timestamp_seconds", pipeline="orders", check=key.name)
        if stamp == evaluation.timestamp:  # the same evaluation (not a newer one since)
            expected = "passed" if evaluation.passed else evaluation.severity.lower()
            assert states == {"blocked" if evaluation.blocked_by else expected}
    print(
        f"scrape: snapshot {snapshot_id}, lag {lag:.0f} records, "
        f"{one(samples, 'records_per_second', pipeline='orders'):.1f} records/s, "
        f"{one(samples, 'bytes_per_second', pipeline='orders'):.0f} B/s, "
        f"{rows} rows, dead letters {dead:.0f}, checks "
        + ", ".join(
            f"{s.labels['check']}={s.labels['state']}"
            for s in samples[PREFIX + "check_state"]
            if s.value == 1
        )
    )
