"""Sensors decide, assets do: the lag sensor reads offsets and requests runs (it never consumes
or commits); the alert sensors (``platform_assets.alerts.sensors``) turn failed checks and runs
into alerts, once per change.

A misconfigured pipeline raises one alert, not a storm of failed runs: the lag sensor evaluates
the blocking group-id check on the state it reads anyway and launches no ingestion while it
fails; it requests at most one run per cause that records the check's evaluation (so the
Checks tab and ``check_alerts`` see it).
"""

import json
import time
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    DagsterInstance,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

# Private Dagster API, the only one used at run time: dagster 1.13.27 (pinned) does not export
# the set of *completed* check-execution statuses; the alert and lag sensors must ignore planned
# (in-progress) evaluations, which the public "latest evaluation" call returns.
from dagster._core.storage.asset_check_execution_record import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES as COMPLETED_STATUSES,
)

from ingestion.health.checks import GROUP_CHECK, Finding, check_group_consistency
from ingestion.health.lag import measure_with_sightings
from ingestion.health.triggers import decide, decide_group_check, is_continuous
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import AssetJob, active_operator_runs, count_active_runs
from platform_assets.pipelines import table_key
from platform_assets.state import read_pipeline_state
from platform_assets.streaming.jobs import active_stream_runs
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    pass  # dagster's own error record


def latest_outcome(instance: DagsterInstance, key: AssetCheckKey) -> Finding | None:
    """The newest *completed* evaluation of ``key`` (planned-only ones are ignored)."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=1, status=set(COMPLETED_STATUSES)
    )
    evaluation = records[0].evaluation if records else None
    if not isinstance(evaluation, AssetCheckEvaluation):
        return None
    return Finding(
        passed=evaluation.passed,
        severity=evaluation.severity.value,
        message=evaluation.description or "",
    )


def blocked_reason(spec: PipelineSpec, outcome: Finding) -> str:
    """The skip message of a sensor or schedule tick while the pipeline is blocked."""
    return f"ingestion of {spec.name!r} is blocked by {GROUP_CHECK.name}: {outcome.message}"


def build_lag_sensor(spec: PipelineSpec, job: AssetJob) -> SensorDefinition:
    """Launch an ingestion run when the pipeline's lag or its age crosses the spec's bounds,
    unless the blocking group-id check fails on the state just read.

    The age is lag in seconds as the checks compute it (``ingestion.health.lag``, R53): a producer
    timestamp in the future is bounded by the last commit, or before any commit by the tick
    that first saw it (``future_seen`` in the cursor), and named in ``future_timestamps``.

    A continuous pipeline (``ingestion.health.triggers.is_continuous``) launches no ingestion run
    here: its stream sensor keeps one stream run alive (``platform_assets/streaming/sensors.py``);
    this sensor still requests the runs that record the group check, once no stream is active.
    """
    group_key = AssetCheckKey(table_key(spec), GROUP_CHECK.name)

    @sensor(
        name=f"{spec.name}_lag_sensor",
        job=job,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Reads {spec.name!r} lag from offsets (no consumption) and requests runs; "
        f"none while {GROUP_CHECK.name} blocks it.",
    )
    def _sensor(
        context: SensorEvaluationContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        state = read_pipeline_state(spec, kafka, iceberg, with_oldest=True)
        finding = check_group_consistency(state)
        outcome = finding
        cursor = json.loads(context.cursor) if context.cursor else {}
        busy = count_active_runs(context.instance, job.name) > 0
        continuous = is_continuous(spec)
        if continuous:  # a stream stops itself, or is stopped, before the check is recorded
            busy = busy or bool(active_stream_runs(context.instance, spec))
        requested = cursor.get("group_check_requested")
        evaluate, _ = decide_group_check(
            outcome, latest_outcome(context.instance, group_key), requested, busy
        )
        lag = sum(state.lag().values())
        now_ms = int(time.time() * 1000)
        waited, seen = measure_with_sightings(state, now_ms, cursor.get("future_seen") or {})
        age = waited.seconds
        if outcome.blocks:  # no ingestion: it would fail, or re-read everything
            launch, reason = False, blocked_reason(spec, outcome)
        elif continuous:
            launch, reason = False, f"{spec.name!r} streams on a shared worker: see stream_sensor"
        else:
            launch, reason = decide(lag, age, spec, busy)
        held = active_operator_runs(context.instance, spec) if launch or evaluate else []
        if held:  # an operator job waits for a gap between runs (operations.hold_ingestion)
            launch, evaluate = False, False
            reason = (
                f"{spec.name!r}: operator action in progress (run {held[0]}); no run until it ends"
            )
        if launch or evaluate:  # an ingestion run evaluates the group check first
            requested = outcome.fingerprint
        context.update_cursor(
            json.dumps(
                {
                    "lag": lag,
                    "lag_seconds": age,
                    "future_timestamps": waited.describe_future(),
                    "future_seen": seen,
                    "group_check_requested": requested,
                }
            )
        )
        if launch:
            return RunRequest(tags={"trigger": "lag_sensor", "lag": str(lag)})
        if evaluate:  # only the check: nothing is read or committed
            return RunRequest(
                asset_selection=[],
                asset_check_keys=[group_key],
                tags={"trigger": "lag_sensor", "evaluates": GROUP_CHECK.name},
            )
        return SkipReason(reason)

    return _sensor
