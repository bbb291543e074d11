"""Lag in seconds and freshness on the real stack (R53): a producer clock ahead cannot make
waiting records look fresh to the check, the lag sensor or ``platform status``; an idle table
is fresh, a table with records waiting past the bound is not."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from dagster import AssetSelection, DagsterInstance, build_sensor_context

from platform_assets.cli.main import pipeline_status
from platform_assets.definitions import build_definitions
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.ingest.jobs import ingestion_selection
from platform_assets.pipelines import table_key
from resources.alerts import AlertResource
from resources.kafka import KafkaResource
from tests.support.dagster_runs import materialize_pipeline
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import NewPipeline, records

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def produce_stamped(kafka: KafkaResource, topic: str, count: int, timestamp_ms: int) -> None:
    """Produce ``count`` records to partition 0 with CreateTime ``timestamp_ms`` (a producer
    whose clock is wrong), one batch each so the broker's end offset is exact."""
    # librdkafka logs through Python logging: no reconnect noise once the broker has stopped.
    producer = kafka.get_producer(logger=logging.getLogger("tests.stamped_producer"))
    for key, value, _ in records(count, first=1000):
        producer.produce(topic, value=value, key=key, partition=0, timestamp=timestamp_ms)
        assert producer.flush(30) == 0


def check_evaluations(spec: Any, resources: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    selection = AssetSelection.checks_for_assets(table_key(spec)) - AssetSelection.checks(
        *[k for k in pipeline_check_keys(spec) if k.name == "exactly_once_audit"]
    )
    result = materialize_pipeline(spec, resources, selection, **kwargs)
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_a_producer_clock_ahead_does_not_make_waiting_records_fresh(
    resources: dict[str, Any], new_pipeline: NewPipeline, kafka: KafkaResource
) -> None:
    """Records stamped an hour ahead wait past the bound: commit_freshness fails naming the
    partition and offset, the lag sensor launches on its seconds threshold, ``platform status``
    shows their wait (bounded by the last commit), never zero."""
    topic, spec = new_pipeline(
        "lag_future",
        produce=10,
        max_lag_records=1000,
        max_lag_seconds=2,
        freshness_bound_seconds=2,
        in_process_max_records=10_000,
    )
    assert materialize_pipeline(spec, resources, ingestion_selection(spec)).success
    produce_stamped(kafka, topic, 3, int(time.time() * 1000) + HOUR_MS)
    time.sleep(3.0)

    freshness = check_evaluations(spec, resources)["commit_freshness"]
    assert not freshness.passed, freshness.description
    assert "3 records are waiting" in freshness.description
    assert f"{topic}[0] offset 10" in freshness.description
    assert f"{topic}[0] offset 10" in freshness.metadata["future_timestamps"].value
    assert freshness.metadata["lag_seconds"].value >= 3.0

    sensor = build_definitions([spec]).resolve_sensor_def("lag_sensor")
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(
            instance=instance,
            resources={"kafka": kafka, "iceberg": resources["iceberg"], "alerts": AlertResource()},
        )
        tick = sensor.evaluate_tick(context)
    assert tick.run_requests, tick.skip_message
    assert tick.run_requests[0].tags["lag"] == "3"

    status = pipeline_status(spec, kafka, resources["iceberg"], audit=False)
    assert status.oldest_uncommitted_age_s is not None
    assert status.oldest_uncommitted_age_s >= 3.0
    assert f"{topic}[0] offset 10" in (status.future_timestamps or "")
    assert "commit_freshness" in status.failing


def test_an_idle_table_is_fresh_and_a_waiting_one_is_not(
    resources: dict[str, Any], new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """The table's freshness is commit_freshness alone (no Dagster FreshnessPolicy, which
    judges the last materialization and would call an idle table stale): idle past the bound
    it passes; with records waiting past the bound it fails."""
    topic, spec = new_pipeline(
        "idle_fresh", produce=10, freshness_bound_seconds=1, in_process_max_records=10_000
    )
    graph = build_definitions([spec]).resolve_asset_graph()
    assert graph.get(table_key(spec)).freshness_policy is None
    with DagsterInstance.ephemeral() as instance:
        assert materialize_pipeline(spec, resources, ingestion_selection(spec), instance).success
        idle = materialize_pipeline(spec, resources, ingestion_selection(spec), instance)
        assert idle.get_asset_materialization_events() == []  # R10: nothing new, no event
        time.sleep(1.5)  # past the bound since the last materialization
        fresh = check_evaluations(spec, resources, instance=instance)["commit_freshness"]
        assert fresh.passed, fresh.description
        assert "table is current" in fresh.description
        ledger_producer.produce(topic, records(4, first=10))
        time.sleep(1.5)
        stale = check_evaluations(spec, resources, instance=instance)["commit_freshness"]
    assert not stale.passed
    assert "4 records are waiting" in stale.description
