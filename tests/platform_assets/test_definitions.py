"""The code location as `dagster dev` loads it: asset graph, jobs, schedules, observations; and
what `build_definitions` makes of any list of specs (each pipeline's surface, streams, the
failover job only with replicas)."""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DefaultScheduleStatus,
    Definitions,
    ScheduleDefinition,
)

from ingestion.ops.retention import maintenance_cron
from platform_assets.definitions import build_definitions, operator_jobs
from platform_assets.demo import encode_event, make_order_event
from platform_assets.pipelines import commit_state_key, quarantine_key, table_key
from resources.kafka import KafkaResource
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import PIPELINE_CHECKS, make_spec

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
    lag = defs.resolve_sensor_def("lag_sensor")
    assert "ingest_orders_job" in {target.job_name for target in lag.targets}
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


def test_definitions_walk_every_spec_yields_its_surface() -> None:
    specs = [
        make_spec("orders", "walk_orders", errors_tolerance="all"),
        make_spec("x", "walk_pattern", topic_pattern=r"clicks-.*"),
    ]
    defs = build_definitions(specs)
    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key, k.name) for k in graph.asset_check_keys}
    lag_sensor = defs.resolve_sensor_def("lag_sensor")
    # R52: one lag sensor, one fallback and one maintenance schedule for every pipeline.
    assert defs.resolve_schedule_def("fallback_schedule").job_name == "ingest_all"
    maintenance = defs.resolve_schedule_def("daily_maintenance_schedule")
    assert maintenance.job_name == "maintain_tables"
    assert maintenance.cron_schedule == maintenance_cron(specs[0]) == maintenance_cron(specs[1])
    for spec in specs:
        assert table_key(spec) in graph.get_all_asset_keys()
        assert commit_state_key(spec) in graph.get_all_asset_keys()
        assert {name for key, name in checks if key == table_key(spec)} == PIPELINE_CHECKS
        assert f"ingest_{spec.name}_job" in {t.job_name for t in lag_sensor.targets}
        upstream = graph.get(table_key(spec)).parent_keys
        assert upstream
        assert all(key.path[0] == "kafka" for key in upstream)
    assert quarantine_key(specs[0]) in graph.get_all_asset_keys()
    assert AssetKey(["kafka", "walk_pattern_topics"]) in graph.get_all_asset_keys()
    for name in ("ingest_all", "observe_topics", "run_checks"):
        assert defs.resolve_job_def(name)
    assert defs.resolve_sensor_def("check_alerts")
    assert defs.resolve_sensor_def("run_failure_alerts")
    assert defs.resolve_sensor_def("stream_sensor").job_name == "stream_pipelines_job"


def test_a_target_below_the_floor_streams_and_one_above_runs() -> None:
    fast = make_spec("fast", "walk_fast", freshness_target_seconds=15)
    slow = make_spec("slow", "walk_slow", freshness_target_seconds=600)
    more = [make_spec(f"m{i}", f"walk_more{i}", freshness_target_seconds=15) for i in range(8)]
    defs = build_definitions([fast, slow, *more])
    # R52: one worker job and one stream sensor however many pipelines stream.
    assert defs.resolve_sensor_def("stream_sensor").job_name == "stream_pipelines_job"
    jobs = {job.name for job in defs.jobs or []}
    assert "stream_pipelines_job" in jobs
    assert not [name for name in jobs if name.startswith("stream_walk")]
    names = {s.name for s in defs.sensors or []}
    assert not [name for name in names if name.endswith("_stream_sensor")]
    assert "walk_slow_lag_sensor" not in names
    assert {n for n in names if "lag" in n} == {"lag_sensor"}
    schedules = {s.name: s for s in defs.schedules or [] if isinstance(s, ScheduleDefinition)}
    # With a target the retention is a commit budget: history expired every 15 min, for every
    # such pipeline in one run; one fallback schedule on the default cron.
    assert set(schedules) == {
        "maintenance_schedule",
        "fallback_schedule",
        "observe_topics_every_minute",
        "run_checks_every_5_minutes",
    }
    assert str(schedules["maintenance_schedule"].cron_schedule).endswith(" * * * *")
    plain = make_spec("plain", "walk_plain")  # no target: a week's history, expired daily
    hourly = make_spec("hourly", "walk_hourly", fallback_cron="0 * * * *")
    plain_defs = build_definitions([plain, hourly])
    plain_cron = plain_defs.resolve_schedule_def("daily_maintenance_schedule").cron_schedule
    assert str(plain_cron).endswith(" 3 * * *")
    fallbacks = {
        s.name: s
        for s in plain_defs.schedules or []
        if isinstance(s, ScheduleDefinition) and "fallback" in s.name
    }
    assert len(fallbacks) == 2
    assert {str(s.cron_schedule) for s in fallbacks.values()} == {"*/15 * * * *", "0 * * * *"}


def test_the_failover_job_comes_only_with_a_pipeline_that_declares_replicas() -> None:
    """Disaster recovery is an add-on: without replicas no failover job (nor its module)."""
    plain = make_spec("orders", "ops_plain")
    with_dr = make_spec("orders", "ops_dr", replicas=[{"name": "dr", "source_alias": "primary"}])
    assert {job.name for job in operator_jobs([plain])} == {
        "reset_offsets",
        "migrate_group",
        "maintain_tables",
    }
    assert "failover" in {job.name for job in operator_jobs([plain, with_dr])}
