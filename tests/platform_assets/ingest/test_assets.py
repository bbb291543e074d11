"""The Dagster surface on the real stack: assets materialize, checks pass and fail with a fix,
the seed misconfiguration blocks ingestion, sensors decide, alerts fire once per change."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from dagster import (
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    DagsterInstance,
    build_sensor_context,
)

from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import read_position
from platform_assets.alerts.sensors import build_check_alert_sensor
from platform_assets.definitions import build_definitions
from platform_assets.ingest.assets import build_pipeline_assets, observe_topic
from platform_assets.ingest.checks import pipeline_check_keys
from platform_assets.ingest.jobs import ingestion_selection
from platform_assets.pipelines import commit_state_key, quarantine_key, table_key
from resources.alerts import AlertResource
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource
from resources.spark import SparkResource
from tests.support.dagster_runs import materialize_pipeline
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import PIPELINE_CHECKS, CreateTopic, NewPipeline, make_spec, records
from tests.support.registry import EmbeddedSchemaRegistry
from tests.support.webhook import WebhookReceiver

pytestmark = pytest.mark.integration


@pytest.fixture
def resources(
    kafka: KafkaResource, catalog_resource: IcebergCatalogResource, spark_resource: SparkResource
) -> dict[str, Any]:
    return {
        "kafka": kafka,
        "iceberg": catalog_resource,
        "spark": spark_resource,
        "alerts": AlertResource(),
    }


def run_pipeline_assets(
    spec: PipelineSpec,
    resources: dict[str, Any],
    checks_only: bool = False,
    instance: DagsterInstance | None = None,
) -> Any:
    selection = AssetSelection.checks_for_assets(table_key(spec)) if checks_only else None
    return materialize_pipeline(spec, resources, selection, instance)


def evaluations(result: Any) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_each_pipeline_has_its_topics_and_one_multi_asset_with_its_blocking_check() -> None:
    """The surface of ``build_pipeline_assets``: an external asset per topic (one for a
    pattern), and the table, its commit log and (with dead letters) its quarantine table
    materialized by one run behind the blocking group check."""
    spec = make_spec("x", "surface", topics=["orders", "payments"], errors_tolerance="all")
    *topics, ingestion = build_pipeline_assets(spec)
    assert [t.key for t in topics] == [
        AssetKey(["kafka", "orders"]),
        AssetKey(["kafka", "payments"]),
    ]
    assert all(isinstance(t, AssetSpec) and t.metadata["pipeline"] == "surface" for t in topics)
    assert isinstance(ingestion, AssetsDefinition)
    assert ingestion.keys == {table_key(spec), commit_state_key(spec), quarantine_key(spec)}
    assert {k.name for k in ingestion.check_keys} == {"group_id_consistency"}
    plain = make_spec("x", "surface_plain", topic_pattern="clicks-.*")
    (pattern, plain_ingestion) = build_pipeline_assets(plain)
    assert isinstance(pattern, AssetSpec)
    assert isinstance(plain_ingestion, AssetsDefinition)
    assert pattern.key == AssetKey(["kafka", "surface_plain_topics"])
    assert "pattern 'clicks-.*'" in str(pattern.description)
    assert quarantine_key(plain) not in plain_ingestion.keys  # no dead letters: no quarantine


def test_a_missing_topic_is_observed_as_a_problem_not_a_failure(kafka: KafkaResource) -> None:
    spec = make_spec("no-such-topic-observed", "observe_missing")
    observation = observe_topic(kafka, spec, AssetKey(["kafka", "no-such-topic-observed"]))
    assert observation.metadata["partitions"].value == 0
    assert "not found: topic 'no-such-topic-observed'" in str(observation.metadata["problem"].value)


def test_a_run_that_ingests_nothing_reports_no_materialization(
    resources: dict[str, Any], new_pipeline: NewPipeline
) -> None:
    """R10 on the Dagster surface: downstream (dbt, eager) is not rebuilt by an idle run."""
    _, spec = new_pipeline("dg_idle", produce=20)
    first = run_pipeline_assets(spec, resources)
    assert first.success
    materialized = {e.asset_key for e in first.get_asset_materialization_events()}
    assert table_key(spec) in materialized
    idle = run_pipeline_assets(spec, resources)
    assert idle.success
    assert idle.get_asset_materialization_events() == []
    assert evaluations(idle)["group_id_consistency"].passed


def test_materialize_ingests_and_every_check_passes(
    resources: dict[str, Any], new_pipeline: NewPipeline
) -> None:
    _, spec = new_pipeline("dg_happy", partitions=2, produce=300, errors_tolerance="all")
    result = run_pipeline_assets(spec, resources)
    assert result.success
    table = result.asset_materializations_for_node(f"ingest_{spec.name}")
    by_key = {m.asset_key: m.metadata for m in table}
    metadata = by_key[table_key(spec)]
    assert metadata["records"].value == 300
    assert metadata["lag_after"].value == 0
    assert metadata["committed"].value is True
    assert metadata["files"].value >= 2
    log = by_key[commit_state_key(spec)]["commit_log"].value
    assert len(log.records) == 1
    assert log.records[0].data["records"] == 300
    assert quarantine_key(spec) in by_key
    found = evaluations(result)
    assert set(found) == PIPELINE_CHECKS
    assert all(e.passed for e in found.values()), {n: e.description for n, e in found.items()}


def test_ingestion_run_leaves_the_audit_to_run_checks(
    resources: dict[str, Any], new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    """An ingestion run evaluates the metadata-only checks; the exactly-once audit (a Kafka
    recount and a read of each new commit's files) runs in ``run_checks``, from its cursor, so
    it still audits every commit the runs made, once (R47)."""
    topic, spec = new_pipeline("dg_no_audit", produce=40, in_process_max_records=10_000)
    defs = build_definitions([spec])
    run_checks = defs.resolve_job_def("run_checks")
    with DagsterInstance.ephemeral() as instance:
        for batch in range(2):
            ingest = materialize_pipeline(spec, resources, ingestion_selection(spec), instance)
            assert ingest.success
            found = evaluations(ingest)
            assert "exactly_once_audit" not in found
            assert {"group_id_consistency", "commit_freshness"} <= set(found)
            ledger_producer.produce(topic, records(10, first=40 + batch * 10))
        checks = run_checks.execute_in_process(
            instance=instance, resources={**resources, "dbt": None}, raise_on_error=False
        )
        assert checks.success
        audit = evaluations(checks)["exactly_once_audit"]
        assert audit.passed, audit.description
        assert audit.metadata["commits_recounted"].value == 2  # both runs' commits, once


def test_seed_misconfiguration_fails_the_check_and_blocks_ingestion(
    resources: dict[str, Any], create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """Offsets live under the old default commit group; the pipeline now says
    ``connect-sink-group``: the blocking check names both ids and the fix; nothing is read."""
    topic = create_topic(partitions=1)
    ledger_producer.produce(topic, records(20))
    old = make_spec(topic, "seed", consumer_group_id="cg-control")
    assert run_pipeline_assets(old, resources).success
    ledger_producer.produce(topic, records(20, first=20))
    seed = make_spec(topic, "seed", consumer_group_id="connect-sink-group")
    before = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()
    result = run_pipeline_assets(seed, resources)
    assert not result.success
    check = evaluations(result)["group_id_consistency"]
    assert not check.passed
    assert "'cg-control'" in check.description
    assert "'connect-sink-group'" in check.description
    assert "Fix: set consumer_group_id back to 'cg-control'" in check.description
    after = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()
    assert after.snapshot_id == before.snapshot_id  # ingestion was blocked


def test_failing_checks_say_what_and_how(
    resources: dict[str, Any], create_topic: CreateTopic, ledger_producer: LedgerProducer
) -> None:
    """commit_freshness (lag + old commit), dead_letter_rate, exactly_once_audit (a duplicate
    appended behind the pipeline's back) and offsets_watermark_reachable (expired, and the
    position's witness row deleted) fail."""
    import time

    topic = create_topic(partitions=1)
    spec = make_spec(
        topic,
        "dg_bad",
        errors_tolerance="all",
        freshness_bound_seconds=1,
        max_dead_letter_ratio=0.05,
    )
    ledger_producer.produce(topic, [*records(10), (b"bad", b"{nope", None)])
    assert run_pipeline_assets(spec, resources).success
    ledger_producer.produce(topic, records(5, first=10))
    time.sleep(1.5)
    found = evaluations(run_pipeline_assets(spec, resources, checks_only=True))
    assert not found["commit_freshness"].passed
    assert "5 records are waiting" in found["commit_freshness"].description
    assert not found["dead_letter_rate"].passed
    assert "1 of 11 records" in found["dead_letter_rate"].description
    assert found["exactly_once_audit"].passed

    table = resources["iceberg"].load_catalog().load_table(spec.table)
    duplicate = table.scan(limit=1).to_arrow()
    table.append(pa.Table.from_pylist(duplicate.to_pylist(), schema=table.schema().as_arrow()))
    table = resources["iceberg"].load_catalog().load_table(spec.table)
    current = table.current_snapshot()
    older = [
        s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id
    ]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    found = evaluations(run_pipeline_assets(spec, resources, checks_only=True))
    assert not found["exactly_once_audit"].passed
    assert "a writer outside the pipeline" in found["exactly_once_audit"].description
    # R56: no snapshot with the offsets is left, but the position table property is proven by
    # its witness row; once another writer deletes that row, nothing proves it (R31).
    watermark = found["offsets_watermark_reachable"]
    assert watermark.passed
    assert "position table property" in watermark.description
    position = read_position(table.properties, spec.consumer_group_id)
    assert position is not None
    assert position.witness is not None
    table = resources["iceberg"].load_catalog().load_table(spec.table)
    table.delete(f"_kafka_offset = {position.witness.offset}")
    found = evaluations(run_pipeline_assets(spec, resources, checks_only=True))
    assert not found["offsets_watermark_reachable"].passed
    assert "reset the offsets explicitly" in found["offsets_watermark_reachable"].description


def test_lag_sensor_requests_runs_only_over_threshold(
    resources: dict[str, Any], new_pipeline: NewPipeline, ledger_producer: LedgerProducer
) -> None:
    topic, spec = new_pipeline("dg_sensor", max_lag_records=50, max_lag_seconds=3600)
    sensor = build_definitions([spec]).resolve_sensor_def("lag_sensor")
    sensor_resources = {
        "kafka": resources["kafka"],
        "iceberg": resources["iceberg"],
        "alerts": AlertResource(),
    }
    with DagsterInstance.ephemeral() as instance:

        def tick(cursor: str | None = None) -> Any:
            context = build_sensor_context(
                instance=instance, resources=sensor_resources, cursor=cursor
            )
            return sensor.evaluate_tick(context)

        idle = tick()
        assert not idle.run_requests
        assert "dg_sensor: idle" in (idle.skip_message or "")
        ledger_producer.produce(topic, records(10))
        small = tick(idle.cursor)
        assert not small.run_requests
        assert "lag 10 < 50 records" in (small.skip_message or "")
        ledger_producer.produce(topic, records(60, first=10))
        (launched,) = tick().run_requests
        assert launched.job_name == f"ingest_{spec.name}_job"
        assert launched.tags["lag"] == "70"


def test_alert_sensor_one_webhook_per_state_change_and_recovery(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    webhook: WebhookReceiver,
) -> None:
    topic, spec = new_pipeline("dg_alerts", errors_tolerance="all", max_dead_letter_ratio=0.05)
    alerts = {"alerts": AlertResource(webhook_url=webhook.url)}
    check_alert_sensor = build_check_alert_sensor(pipeline_check_keys(spec))
    with DagsterInstance.ephemeral() as instance:
        ledger_producer.produce(topic, [*records(5), (b"bad", b"{nope", None)])
        assert run_pipeline_assets(spec, resources, instance=instance).success
        context = build_sensor_context(instance=instance, resources=alerts)
        check_alert_sensor(context)
        failed = [a for a in webhook.received if a["kind"] == "check_failed"]
        assert len(failed) == 1
        assert "dead_letter_rate" in failed[0]["title"]
        assert "went to tests.dg_alerts_quarantine" in failed[0]["message"]
        run_pipeline_assets(spec, resources, checks_only=True, instance=instance)  # still failing
        check_alert_sensor(
            build_sensor_context(instance=instance, resources=alerts, cursor=context.cursor)
        )
        assert len(webhook.received) == 1
        ledger_producer.produce(topic, records(200, first=5))
        assert run_pipeline_assets(spec, resources, instance=instance).success
        check_alert_sensor(
            build_sensor_context(instance=instance, resources=alerts, cursor=context.cursor)
        )
    kinds = [a["kind"] for a in webhook.received]
    assert kinds == ["check_failed", "check_recovered"]


def test_run_failure_alert_leaves_a_blocked_run_to_the_check(
    resources: dict[str, Any],
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    webhook: WebhookReceiver,
) -> None:
    """A blocked run (renamed group) fails; its cause is the failed blocking check, which
    check_alerts reports once: the run failure sensor sends nothing for it (any other failed
    run alerts: tests/platform_assets/ingest/test_sensors.py)."""
    from dagster import build_run_status_sensor_context

    from platform_assets.alerts.sensors import run_failure_alert_sensor

    topic = create_topic(partitions=1)
    ledger_producer.produce(topic, records(5))
    assert run_pipeline_assets(
        make_spec(topic, "dg_runfail", consumer_group_id="a"), resources
    ).success
    renamed = make_spec(topic, "dg_runfail", consumer_group_id="b")
    with DagsterInstance.ephemeral() as instance:
        result = run_pipeline_assets(renamed, resources, instance=instance)
        assert not result.success
        context = build_run_status_sensor_context(
            sensor_name="run_failure_alerts",
            dagster_event=result.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": AlertResource(webhook_url=webhook.url)},
        ).for_run_failure()
        run_failure_alert_sensor(context)
    assert webhook.received == []


def test_an_avro_pipeline_materializes_through_the_configured_schema_registry(
    resources: dict[str, Any],
    kafka: KafkaResource,
    create_topic: CreateTopic,
    ledger_producer: LedgerProducer,
    schema_registry: EmbeddedSchemaRegistry,
) -> None:
    """An Avro pipeline through the ingestion asset on a real Schema Registry: the Kafka
    resource's ``schema_registry_url`` (the configuration's ``schema_registry.url``) is used
    before the pipeline's own (here a port nothing listens on), the table's schema is derived
    from the subject, and the run's registry client is closed after it (a leaked one is a
    ResourceWarning, an error in this suite)."""
    topic = create_topic(partitions=2)
    spec = make_spec(
        topic,
        "dg_avro",
        value_format="avro",
        schema=None,
        schema_registry_url="http://127.0.0.1:9/not-this-one",
    )
    fields = [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}]
    schema = {"type": "record", "name": "Order", "fields": fields}
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        serializer = AvroSerializer(client, json.dumps(schema))
        context = SerializationContext(topic, MessageField.VALUE)
        values = [serializer({"id": i, "note": f"n{i}"}, context) for i in range(20)]
    ledger_producer.produce(topic, [(f"k{i}".encode(), v, None) for i, v in enumerate(values)])
    configured = KafkaResource(
        bootstrap_servers=kafka.bootstrap_servers, schema_registry_url=schema_registry.url
    )
    result = run_pipeline_assets(spec, {**resources, "kafka": configured})
    assert result.success
    (materialized,) = [
        m
        for m in result.asset_materializations_for_node(f"ingest_{spec.name}")
        if m.asset_key == table_key(spec)
    ]
    assert materialized.metadata["records"].value == 20
    table = resources["iceberg"].load_catalog().load_table(spec.table)
    rows = table.scan(selected_fields=("id", "note")).to_arrow().sort_by("id").to_pylist()
    assert rows == [{"id": i, "note": f"n{i}"} for i in range(20)]
