"""The code location as `dagster dev` loads it: asset graph, jobs, schedules, observations."""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DefaultScheduleStatus, Definitions

from platform_assets.demo import encode_event, make_order_event
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import PIPELINE_CHECKS

ROOT = Path(__file__).resolve().parents[2]


def load_workspace_definitions() -> Definitions:
    """Import the Definitions object that workspace.yaml points at."""
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    (target,) = workspace["load_from"]
    module = importlib.import_module(target["python_module"]["module_name"])
    defs = getattr(module, target["python_module"]["attribute"])
    assert isinstance(defs, Definitions)
    return defs


def test_asset_graph() -> None:
    """Topic -> table -> commit state, plus the quarantine table, for the demo pipeline."""
    defs = load_workspace_definitions()
    graph = defs.resolve_asset_graph()
    topic, table = AssetKey(["kafka", "orders"]), AssetKey(["iceberg", "demo", "orders"])
    commits = AssetKey(["ingestion", "orders", "commit_state"])
    quarantine = AssetKey(["iceberg", "demo", "orders_quarantine"])
    staging, mart = AssetKey(["stg_orders"]), AssetKey(["daily_revenue"])
    incremental = AssetKey(["orders_incremental"])
    assert graph.get_all_asset_keys() == {
        topic,
        table,
        commits,
        quarantine,
        staging,
        mart,
        incremental,
    }
    assert graph.get(staging).parent_keys == {table}  # lineage: topic -> table -> dbt
    assert graph.get(mart).parent_keys == {staging}
    assert graph.get(topic).is_external
    assert not graph.get(topic).is_materializable
    assert graph.get(table).parent_keys == {topic}
    assert graph.get(commits).parent_keys == {table}
    assert graph.get(quarantine).parent_keys == {topic}
    assert {key.name for key in graph.asset_check_keys if key.asset_key == table} == PIPELINE_CHECKS
    assert AssetCheckKey(staging, "unique_stg_orders_order_id") in graph.asset_check_keys


def test_jobs_schedules_and_resources() -> None:
    defs = load_workspace_definitions()
    assert defs.resolve_job_def("observe_topics").name == "observe_topics"
    schedule = defs.resolve_schedule_def("observe_topics_every_minute")
    assert schedule.default_status == DefaultScheduleStatus.RUNNING
    assert set(defs.resources or {}) == {"kafka", "iceberg", "spark", "alerts", "dbt"}
    assert defs.resolve_sensor_def("orders_lag_sensor").job_name == "ingest_orders_job"
    assert defs.resolve_sensor_def("analytics_automation").default_status.value == "RUNNING"


@pytest.mark.integration
def test_observe_topics_reports_end_offsets(
    kafka: KafkaResource, demo_topic: str, ledger_producer: LedgerProducer
) -> None:
    from ingestion.kafka.topics import describe_topic

    consumer = kafka.get_consumer()
    try:
        before = sum(
            describe_topic(kafka.get_admin_client(), consumer, demo_topic).end_offsets.values()
        )
    finally:
        consumer.close()
    # Valid demo orders: the topic is shared with later tests that ingest it (test_cli).
    rng = random.Random(40)
    events = [make_order_event(rng, i) for i in range(40)]
    ledger_producer.produce(
        demo_topic, [(e["order_id"].encode(), encode_event(e), None) for e in events]
    )
    job = load_workspace_definitions().resolve_job_def("observe_topics")
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, resources={"kafka": kafka})
    assert result.success
    (observation,) = result.asset_observations_for_node("observe_topic_offsets")
    assert observation.asset_key == AssetKey(["kafka", "orders"])
    metadata: dict[str, Any] = {key: value.value for key, value in observation.metadata.items()}
    assert metadata["partitions"] == 4
    assert metadata["end_offsets_total"] == before + 40
    assert metadata["records_in_log"] == before + 40
    assert sum(p["end"] for p in metadata["end_offsets"].values()) == before + 40
    newest = max(e.timestamp_ms for e in ledger_producer.ledger.entries) / 1000
    assert metadata["newest_record_time"] == pytest.approx(newest)
