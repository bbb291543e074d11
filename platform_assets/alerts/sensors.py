"""The alert sensors: failed checks and failed runs become alerts, once per change.

``check_alerts`` alerts once per state change of a check (:mod:`platform_assets.alerts.policy`),
with a recovery message and optional reminders; ``run_failure_alerts`` leaves a run that failed
only because the pipeline is blocked to that check's alert. The lag sensor, which launches the
runs, is in ``platform_assets.ingest.sensors``.
"""

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogEntry,
    RunFailureSensorContext,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from ingestion.health.checks import Finding
from platform_assets.alerts.policy import (
    Evaluation,
    Notice,
    apply_evaluations,
    cause_key,
    dump_cursor,
    failed_only_because_blocked,
    format_duration,
    load_cursor,
)
from platform_assets.ingest.sensors import COMPLETED_STATUSES
from resources.alerts import Alert, AlertResource

ALERT_SENSOR = "check_alerts"
"""The check alert sensor's name (the UI's Automation tab)."""

if TYPE_CHECKING:
    from dagster_shared.error import SerializableErrorInfo  # dagster's own error record


def read_new_evaluations(
    instance: DagsterInstance,
    keys: Sequence[AssetCheckKey],
    read: Mapping[str, float] | None,
    limit: int = 50,
) -> tuple[list[Evaluation], dict[str, float]]:
    """Completed evaluations of ``keys`` newer than ``read`` (check name -> timestamp of the
    newest one read), oldest first, and the new ``read``.

    A check not read before (``read=None``: the sensor's first tick) gives only its newest
    evaluation, so starting the sensor on an old instance does not replay its history. The
    asset-check index is read, not the event log: the default SQLite event log is sharded per
    run, and its storage ids cannot serve as one cursor.
    """
    new_read = dict(read or {})
    found: list[Evaluation] = []
    for key in keys:
        name = f"{key.asset_key.to_user_string()} / {key.name}"
        after = (read or {}).get(name)
        records = instance.event_log_storage.get_asset_check_execution_history(
            key,
            limit=limit if after is not None else 1,
            status=set(COMPLETED_STATUSES),
        )
        for record in records:
            evaluation = to_evaluation(record.event) if record.event else None
            if evaluation is not None and (after is None or evaluation.timestamp > after):
                found.append(evaluation)
                new_read[name] = max(new_read.get(name, 0.0), evaluation.timestamp)
    return sorted(found, key=lambda e: e.timestamp), new_read


def to_evaluation(entry: EventLogEntry) -> Evaluation | None:
    """The alert policy's view of one stored check evaluation."""
    data = entry.dagster_event.event_specific_data if entry.dagster_event else None
    if not isinstance(data, AssetCheckEvaluation):
        return None
    blocked_by = data.metadata.get("blocked_by")
    return Evaluation(
        asset=data.asset_key.to_user_string(),
        check=data.check_name,
        passed=data.passed,
        severity=data.severity.value,
        message=data.description or "",
        timestamp=entry.timestamp,
        run_id=entry.run_id,
        blocking=bool(data.blocking),
        blocked_by=str(blocked_by.value) if blocked_by is not None else "",
    )


def check_alert(notice: Notice, pipeline: str | None, alerts: AlertResource, now: float) -> Alert:
    """The alert of one notice: the pipeline, the check, the cause and the fix, and a link."""
    owner = f"pipeline {pipeline!r}, " if pipeline else ""
    title = f"{owner}check {notice.check} on {notice.asset}"
    since = format_duration(max(0.0, now - notice.failing_since))
    if notice.kind == "check_failed":
        title = f"{owner}check {notice.check} ({notice.severity}) on {notice.asset}"
        message = notice.message
    elif notice.kind == "check_recovered":
        message = f"passes again after {since} failing: {notice.message}"
    else:
        message = f"still failing after {since}: {notice.message}"
    return Alert(
        notice.kind,
        title,
        message,
        notice.severity,
        {
            "pipeline": pipeline or "",
            "asset": notice.asset,
            "check": notice.check,
            "run_id": notice.run_id,
            "failing_since": notice.failing_since,
        },
        link=alerts.asset_link(AssetKey.from_user_string(notice.asset).path, notice.check),
    )


def build_check_alert_sensor(
    check_keys: Sequence[AssetCheckKey], pipelines: Mapping[AssetKey, str] | None = None
) -> SensorDefinition:
    """Alert once when a check starts failing, once when it passes again, and optionally
    remind while it keeps failing (``AlertResource.reminder_hours``).

    It reads every completed evaluation once (the cursor keeps the storage id read up to and
    each check's alert state); planned evaluations never count. ``pipelines`` names the
    pipeline of each table asset in the alert.
    """
    wanted = list(check_keys)
    owners = {key.to_user_string(): name for key, name in (pipelines or {}).items()}

    @sensor(
        name=ALERT_SENSOR,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description="Turns check evaluations into alerts: once per state change, a recovery "
        "message, a reminder every reminder_hours while failing.",
    )
    def _alerts(context: SensorEvaluationContext, alerts: AlertResource) -> SkipReason:
        now = time.time()
        read, states = load_cursor(context.cursor, now)
        evaluations, read = read_new_evaluations(context.instance, wanted, read)
        states, notices = apply_evaluations(states, evaluations, now, alerts.reminder_hours * 3600)
        for notice in notices:
            alerts.send(check_alert(notice, owners.get(notice.asset), alerts, now))
        context.update_cursor(dump_cursor(read, states))
        return SkipReason(
            f"{len(evaluations)} new evaluations of {len(wanted)} checks; "
            f"{len(notices)} alerts sent"
        )

    return _alerts


def blocked_steps(instance: DagsterInstance, run_id: str) -> tuple[set[str], dict[str, str]]:
    """The run's failed steps, and its steps whose blocking check failed (step -> check)."""
    failed: set[str] = set()
    blocked: dict[str, str] = {}
    types = {DagsterEventType.STEP_FAILURE, DagsterEventType.ASSET_CHECK_EVALUATION}
    for entry in instance.all_logs(run_id, of_type=types):
        event = entry.dagster_event
        if event is None or entry.step_key is None:
            continue
        data = event.event_specific_data
        if event.event_type == DagsterEventType.STEP_FAILURE:
            failed.add(entry.step_key)
        elif (
            isinstance(data, AssetCheckEvaluation)
            and data.blocking
            and Finding(passed=data.passed, severity=data.severity.value, message="").blocks
        ):
            blocked[entry.step_key] = data.check_name
    return failed, blocked


def failure_causes(instance: DagsterInstance, run_id: str) -> list[str]:
    """``step: innermost error`` of each failed step of the run."""
    causes = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        event = entry.dagster_event
        error = event.step_failure_data.error if event is not None else None
        if error is not None:
            causes.append(f"{entry.step_key}: {root_cause(error)}")
    return causes


def previous_completed_run(instance: DagsterInstance, run: DagsterRun) -> DagsterRun | None:
    """The newest run of the same job that finished (succeeded or failed) before ``run``."""
    record = instance.get_run_record_by_id(run.run_id)
    if record is None:
        return None
    finished = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE]
    earlier = instance.get_runs(
        filters=RunsFilter(
            job_name=run.job_name, statuses=finished, created_before=record.create_timestamp
        ),
        limit=1,
    )
    return earlier[0] if earlier else None


def root_cause(error: "SerializableErrorInfo") -> str:
    """The innermost error of a step failure (Dagster wraps the op's own exception)."""
    while error.cause is not None:
        error = error.cause
    return error.message.strip()


@run_failure_sensor(name="run_failure_alerts", default_status=DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: RunFailureSensorContext, alerts: AlertResource) -> None:
    """Alert once per failed run, with the failure message and a link to the run; a run that
    failed only because a blocking check failed is left to that check's alert."""
    run = context.dagster_run
    failed, blocked = blocked_steps(context.instance, run.run_id)
    if failed_only_because_blocked(failed, set(blocked)):
        context.log.info(
            f"run {run.run_id} failed because {sorted(set(blocked.values()))} blocked it; "
            "check_alerts reports that check"
        )
        return
    pipeline = run.tags.get("pipeline")
    owner = f"pipeline {pipeline!r}, " if pipeline else ""
    causes = failure_causes(context.instance, run.run_id)
    previous = previous_completed_run(context.instance, run)
    if (
        causes
        and previous is not None
        and previous.status == DagsterRunStatus.FAILURE
        and cause_key(failure_causes(context.instance, previous.run_id)) == cause_key(causes)
    ):
        context.log.info(
            f"run {run.run_id} failed like the run before it ({previous.run_id}): not alerted "
            "again (one alert per cause; the next different failure or a success resets it)"
        )
        return
    alerts.send(
        Alert(
            "run_failed",
            f"{owner}run {run.run_id} of {run.job_name}",
            "; ".join(causes) or context.failure_event.message or "run failed",
            "ERROR",
            {"run_id": run.run_id, "pipeline": pipeline or "", "job": run.job_name},
            link=alerts.run_link(run.run_id),
        )
    )
