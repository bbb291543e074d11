"""Sensors decide, assets do: the lag sensor reads offsets and requests runs (it never consumes
or commits); the alert sensors turn failed checks and runs into alerts, once per change."""

import json
import time
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from ingestion.spec import PipelineSpec
from ingestion.triggers import decide
from platform_assets.jobs import AssetJob, count_active_runs
from platform_assets.state import read_pipeline_state
from resources.alerts import Alert, AlertResource
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def build_lag_sensor(spec: PipelineSpec, job: AssetJob) -> SensorDefinition:
    """Launch an ingestion run when the pipeline's lag or its age crosses the spec's bounds."""

    @sensor(
        name=f"{spec.name}_lag_sensor",
        job=job,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Reads {spec.name!r} lag from offsets (no consumption) and requests runs.",
    )
    def _sensor(
        context: SensorEvaluationContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        lag = sum(read_pipeline_state(spec, kafka, iceberg).lag().values())
        cursor = json.loads(context.cursor) if context.cursor else {}
        busy = count_active_runs(context.instance, job.name) > 0
        launch, reason, first = decide(lag, cursor.get("first_lag_at"), time.time(), spec, busy)
        context.update_cursor(json.dumps({"first_lag_at": None if launch else first, "lag": lag}))
        if launch:
            return RunRequest(tags={"trigger": "lag_sensor", "lag": str(lag)})
        return SkipReason(reason)

    return _sensor


def build_check_alert_sensor(check_keys: list[AssetCheckKey]) -> SensorDefinition:
    """Alert once when a check starts failing, and once when it passes again.

    It reads the newest evaluation of each check; the cursor keeps each check's last state.
    """

    @sensor(
        name="check_alerts", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING
    )
    def _alerts(context: SensorEvaluationContext, alerts: AlertResource) -> SkipReason:
        states: dict[str, dict[str, Any]] = json.loads(context.cursor) if context.cursor else {}
        sent = 0
        for key in check_keys:
            record = context.instance.get_latest_asset_check_evaluation_record(key)
            name = f"{key.asset_key.to_user_string()} / {key.name}"
            event = record.event.dagster_event if record and record.event else None
            evaluation = event.event_specific_data if event else None
            if record is None or not isinstance(evaluation, AssetCheckEvaluation):
                continue  # never evaluated, or planned and not yet done
            previous = states.get(name, {})
            if previous.get("id") == record.id:
                continue
            message, details = evaluation.description or "", {"run_id": record.run_id}
            if not evaluation.passed and previous.get("passed", True):
                severity = evaluation.severity.value
                alerts.send(Alert("check_failed", name, message, severity, details))
                sent += 1
            elif evaluation.passed and previous.get("passed") is False:
                alerts.send(Alert("check_recovered", name, message, "INFO", details))
                sent += 1
            states[name] = {"id": record.id, "passed": evaluation.passed}
        context.update_cursor(json.dumps(states))
        return SkipReason(f"{len(check_keys)} checks read, {sent} alerts sent")

    return _alerts


@run_failure_sensor(name="run_failure_alerts", default_status=DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: RunFailureSensorContext, alerts: AlertResource) -> None:
    """Alert once per failed run, with the failure message."""
    run = context.dagster_run
    alerts.send(
        Alert(
            "run_failed",
            f"run {run.run_id} of {run.job_name}",
            context.failure_event.message or "run failed",
            "ERROR",
            {"run_id": run.run_id},
        )
    )
