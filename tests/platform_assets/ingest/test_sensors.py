"""A blocked pipeline on the real stack (broker, catalog, Dagster instance; no Spark: small runs
prepare in the driver): the lag sensor requests one check-only run per cause and no ingestion,
the fallback schedule skips, the other checks say they were not evaluated, a blocked run is not
a RUN FAILED alert while any other failed run is, and a missing topic is one flagged
observation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetSelection,
    DagsterInstance,
    RunRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
)

from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.sensors import run_failure_alert_sensor
from platform_assets.definitions import build_definitions
from platform_assets.ingest.jobs import build_observe_topics_job
from platform_assets.ingest.schedules import build_fallback_schedule
from platform_assets.ingest.sensors import build_lag_sensor
from platform_assets.pipelines import table_key
from resources.alerts import AlertResource
from resources.kafka import KafkaResource
from tests.support.dagster_runs import materialize_pipeline
from tests.support.ledger import LedgerProducer
from tests.support.pipelines import NewPipeline, make_spec, records
from tests.support.webhook import WebhookReceiver

pytestmark = pytest.mark.integration
GROUP = "group_id_consistency"
SMALL = {"in_process_max_records": 10_000, "max_lag_records": 1, "max_lag_seconds": 3600}


@pytest.fixture
def alerts(webhook: WebhookReceiver) -> AlertResource:
    return AlertResource(webhook_url=webhook.url, ui_base_url="http://ui.example:3000")


def run(
    spec: PipelineSpec,
    resources: dict[str, Any],
    instance: DagsterInstance,
    selection: AssetSelection | None = None,
) -> Any:
    return materialize_pipeline(spec, resources, selection, instance, tags={"pipeline": spec.name})


def alert_for_run(result: Any, instance: DagsterInstance, alerts: AlertResource) -> None:
    context = build_run_status_sensor_context(
        sensor_name="run_failure_alerts",
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources={"alerts": alerts},
    ).for_run_failure()
    run_failure_alert_sensor(context)


def test_blocked_pipeline_one_check_run_no_ingestion_no_run_alert(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    ledger_producer: LedgerProducer,
    alerts: AlertResource,
    webhook: WebhookReceiver,
) -> None:
    topic, good = new_pipeline("blocked", produce=20, consumer_group_id="cg-good", **SMALL)
    seed = make_spec(topic, "blocked", consumer_group_id="connect-sink-group", **SMALL)
    group_key = AssetCheckKey(table_key(seed), GROUP)
    job = build_definitions([seed]).resolve_job_def(f"ingest_{seed.name}_job")
    sensor = build_lag_sensor(seed, job)  # type: ignore[arg-type]
    sensor_resources = {"kafka": resources["kafka"], "iceberg": resources["iceberg"]}
    with DagsterInstance.ephemeral() as instance:
        assert run(good, resources, instance).success
        ledger_producer.produce(topic, records(20, first=20))

        def tick(cursor: str | None) -> tuple[Any, str | None]:
            context = build_sensor_context(
                instance=instance, resources=sensor_resources, cursor=cursor
            )
            return sensor(context), context.cursor

        first, cursor = tick(None)  # blocked: only the check, once
        assert isinstance(first, RunRequest)
        assert first.asset_selection == []
        assert first.asset_check_keys == [group_key]
        second, cursor = tick(cursor)
        assert isinstance(second, SkipReason)
        assert f"ingestion of 'blocked' is blocked by {GROUP}" in (second.skip_message or "")
        assert "Fix: set consumer_group_id back to 'cg-good'" in (second.skip_message or "")

        # The requested run: the check fails, so Dagster fails the step; nothing is read.
        check_run = run(seed, resources, instance, AssetSelection.checks(group_key))
        assert not check_run.success
        (evaluation,) = check_run.get_asset_check_evaluations()
        assert not evaluation.passed
        assert "but none under 'connect-sink-group'" in (evaluation.description or "")
        third, cursor = tick(None)  # even with a lost cursor: the newest evaluation says it
        assert isinstance(third, SkipReason)

        skipped = build_fallback_schedule(seed, job)(  # type: ignore[arg-type]
            build_schedule_context(resources=sensor_resources)
        )
        assert isinstance(skipped, SkipReason)
        assert "blocked by group_id_consistency" in (skipped.skip_message or "")

        # run_checks: every other check says why it was not evaluated; no group check.
        checks_job = build_definitions([seed]).resolve_job_def("run_checks")
        checked = checks_job.execute_in_process(
            instance=instance, resources=resources, raise_on_error=False
        )
        assert checked.success
        found = {e.check_name: e for e in checked.get_asset_check_evaluations()}
        assert GROUP not in found
        assert len(found) == 5
        for name, other in found.items():
            assert not other.passed, name
            assert other.severity.value == "WARN", name
            assert (other.description or "").startswith("not evaluated: ingestion of 'blocked'")
            assert other.metadata["blocked_by"].value == GROUP

        # A blocked run (launched by hand) and the check-only run: no RUN FAILED alert.
        blocked_run = run(seed, resources, instance)
        assert not blocked_run.success
        for failed in (check_run, blocked_run):
            alert_for_run(failed, instance, alerts)
        assert webhook.received == []
        before = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()

        # Fixed: the same sensor launches ingestion again.
        fixed = build_lag_sensor(good, job)  # type: ignore[arg-type]
        context = build_sensor_context(instance=instance, resources=sensor_resources, cursor=cursor)
        request = fixed(context)
        assert isinstance(request, RunRequest)
        assert request.asset_selection is None
        assert request.tags["lag"] == "20"
    after = resources["iceberg"].load_catalog().load_table(seed.table).current_snapshot()
    assert after.snapshot_id == before.snapshot_id  # nothing was ingested while blocked


def test_any_other_failed_run_alerts_with_its_cause_and_link(
    resources: dict[str, Any],
    new_pipeline: NewPipeline,
    alerts: AlertResource,
    webhook: WebhookReceiver,
) -> None:
    bad = [*records(3), (b"bad", b"{nope", None)]
    topic, spec = new_pipeline("badrecord", produce=bad, **SMALL)
    with DagsterInstance.ephemeral() as instance:
        result = run(spec, resources, instance)
        assert not result.success
        alert_for_run(result, instance, alerts)
    (alert,) = webhook.received
    run_id = result.dagster_run.run_id
    assert alert["kind"] == "run_failed"
    assert alert["title"] == f"pipeline 'badrecord', run {run_id} of __ephemeral_asset_job__"
    assert alert["message"].startswith("ingest_badrecord: ")
    assert f"{topic}" in alert["message"]
    assert alert["link"] == f"http://ui.example:3000/runs/{run_id}"


def test_observe_topics_flags_a_missing_topic_and_observes_the_others(
    kafka: KafkaResource, create_topic: Callable[..., str], ledger_producer: LedgerProducer
) -> None:
    present = create_topic(partitions=2)
    ledger_producer.produce(present, records(5))
    specs = [make_spec(present, "present"), make_spec("no-such-topic-i13", "absent")]
    with DagsterInstance.ephemeral() as instance:
        result = build_observe_topics_job(specs).execute_in_process(
            instance=instance, resources={"kafka": kafka}
        )
    assert result.success
    observations = {
        o.asset_key.path[-1]: o.metadata
        for o in result.asset_observations_for_node("observe_topic_offsets")
    }
    assert observations[present]["end_offsets_total"].value == 5
    assert "problem" not in observations[present]
    problem = str(observations["no-such-topic-i13"]["problem"].value)
    assert problem.startswith("not found: topic 'no-such-topic-i13'")
    assert "Pipeline 'absent' reads nothing from it" in problem
