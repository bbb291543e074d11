"""Sensors decide, assets do: the lag sensor reads offsets and requests runs (it never consumes
or commits); the alert sensors turn failed checks and runs into alerts, once per change.

A misconfigured pipeline raises one alert, not a storm of failed runs: the lag sensor evaluates
the blocking group-id check on the state it reads anyway and launches no ingestion while it
fails; it requests at most one run per cause that records the check's evaluation (so the
Checks tab and ``check_alerts`` see it); ``check_alerts`` alerts once per state change
(:mod:`platform_assets.alert_policy`); ``run_failure_alerts`` leaves a run that failed only
because the pipeline is blocked to that check alert.
"""

import json
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
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    sensor,
)

# Private Dagster API, the only one used at run time: dagster 1.13.27 (pinned) does not export
# the set of *completed* check-execution statuses; the alert and lag sensors must ignore planned
# (in-progress) evaluations, which the public "latest evaluation" call returns.
from dagster._core.storage.asset_check_execution_record import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES as COMPLETED_STATUSES,
)

from ingestion.checks import GROUP_CHECK, Finding, check_group_consistency
from ingestion.lag import measure_with_sightings
from ingestion.spec import PipelineSpec
from ingestion.triggers import decide, decide_group_check, is_continuous
from platform_assets.alert_policy import (
    Evaluation,
    Notice,
    apply_evaluations,
    cause_key,
    dump_cursor,
    failed_only_because_blocked,
    format_duration,
    load_cursor,
)
from platform_assets.jobs import AssetJob, count_active_runs
from platform_assets.pipelines import table_key
from platform_assets.state import read_pipeline_state
from platform_assets.stream import active_stream_runs
from resources.alerts import Alert, AlertResource
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

if TYPE_CHECKING:
    from dagster_shared.error import SerializableErrorInfo  # dagster's own error record


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

    The age is lag in seconds as the checks compute it (``ingestion.lag``, R53): a producer
    timestamp in the future is bounded by the last commit, or before any commit by the tick
    that first saw it (``future_seen`` in the cursor), and named in ``future_timestamps``.

    A continuous pipeline (``ingestion.triggers.is_continuous``) launches no ingestion run
    here: its stream sensor keeps one stream run alive (``platform_assets/stream_sensor.py``);
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
            launch, reason = False, f"{spec.name!r} streams: see {spec.name}_stream_sensor"
        else:
            launch, reason = decide(lag, age, spec, busy)
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
        name="check_alerts",
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
