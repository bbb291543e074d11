"""Sensors decide, assets do: one lag sensor reads every pipeline's offsets and requests runs
(it never consumes or commits); the alert sensors (``platform_assets.alerts.sensors``) turn
failed checks and runs into alerts, once per change.

A misconfigured pipeline raises one alert, not a storm of failed runs: the lag sensor evaluates
the blocking group-id check on the state it reads anyway and launches no ingestion while it
fails; it requests at most one run per cause that records the check's evaluation (so the
Checks tab and ``check_alerts`` see it).
"""

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    DagsterInstance,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
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
from ingestion.health.state import PipelineState
from ingestion.health.triggers import decide, decide_group_check, is_continuous
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.policy import cause_key
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, AssetJob, active_operator_runs
from platform_assets.ingest.liveness import ActiveRun, active_runs, clear_dead_runs
from platform_assets.pipelines import INGEST_ALL_JOB, ingest_job_name, ingests, table_key
from platform_assets.state import StateReader
from platform_assets.streaming.jobs import active_stream_runs
from resources.alerts import Alert, AlertResource
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


LAG_SENSOR = "lag_sensor"
LAG_SENSOR_INTERVAL_SECONDS = 15
PASS_BUDGET_SECONDS = 20.0
"""A tick reads pipelines' states until this much time has passed, then stops; the next tick
starts with the first pipeline it did not reach. With many pipelines each is still read every
few ticks, and a tick stays within Dagster's sensor timeout (60 s) even when its last read
waits out a Kafka timeout (10 s per call)."""


@dataclass(frozen=True)
class Busy:
    """Which pipelines a run is ingesting now: read once per tick for every pipeline."""

    runs: list[ActiveRun]  # ingestion runs queued or in progress that may be alive

    @classmethod
    def read(cls, instance: DagsterInstance, specs: Sequence[PipelineSpec]) -> "Busy":
        """One query for every pipeline's ingest job and ``ingest_all``. A run whose process is
        provably gone (killed on this machine) is marked failed here instead
        (``count_active_runs``)."""
        jobs = [ingest_job_name(spec) for spec in specs] + [INGEST_ALL_JOB]
        runs = active_runs(instance, jobs, list(ACTIVE_RUN_STATUSES))
        clear_dead_runs(instance, [run for run in runs if run.dead], by="a sensor of the platform")
        return cls([run for run in runs if not run.dead])

    def ingesting(self, instance: DagsterInstance, spec: PipelineSpec) -> bool:
        """Whether a run (its own job's, or an ``ingest_all`` run selecting it), or a stream
        worker serving it, is ingesting the pipeline."""
        if any(ingests(run.job_name, run.assets, spec) for run in self.runs):
            return True
        return is_continuous(spec) and bool(active_stream_runs(instance, spec))


def decide_pipeline(
    instance: DagsterInstance,
    spec: PipelineSpec,
    state: PipelineState,
    entry: dict[str, Any],
) -> tuple[RunRequest | None, str, dict[str, Any]]:
    """One pipeline's part of a tick on the state just read: a run to request (ingestion, or
    only the group check's evaluation), the reason for none, and its new cursor entry."""
    finding = check_group_consistency(state)
    group_key = AssetCheckKey(table_key(spec), GROUP_CHECK.name)
    requested = entry.get("group_check_requested")
    evaluate, _ = decide_group_check(finding, latest_outcome(instance, group_key), requested, False)
    lag = sum(state.lag().values())
    now_ms = int(time.time() * 1000)
    waited, seen = measure_with_sightings(state, now_ms, entry.get("future_seen") or {})
    age = waited.seconds
    if finding.blocks:  # no ingestion: it would fail, or re-read everything
        launch, reason = False, blocked_reason(spec, finding)
    elif is_continuous(spec):  # its stream is waiting (a check, a hold, a restart backoff)
        launch, reason = False, f"{spec.name!r} streams on a shared worker: see stream_sensor"
    else:
        launch, reason = decide(lag, age, spec, False)
    held = active_operator_runs(instance, spec) if launch or evaluate else []
    if held:  # an operator job waits for a gap between runs (operations.hold_ingestion)
        launch, evaluate = False, False
        reason = f"{spec.name!r}: operator action in progress (run {held[0]}); no run until it ends"
    if launch or evaluate:  # an ingestion run evaluates the group check first
        requested = finding.fingerprint
    entry = {
        "lag": lag,
        "lag_seconds": age,
        "future_timestamps": waited.describe_future(),
        "future_seen": seen,
        "group_check_requested": requested,
    }
    job_name = ingest_job_name(spec)
    if launch:
        tags = {"trigger": LAG_SENSOR, "lag": str(lag)}
        return RunRequest(job_name=job_name, tags=tags), reason, entry
    if evaluate:  # only the check: nothing is read or committed
        return (
            RunRequest(
                job_name=job_name,
                asset_selection=[],
                asset_check_keys=[group_key],
                tags={"trigger": LAG_SENSOR, "evaluates": GROUP_CHECK.name},
            ),
            reason,
            entry,
        )
    return None, reason, entry


def alert_unreadable(
    errors: list[tuple[str, Exception]],
    alerted: dict[str, str],
    read: set[str],
    alerts: AlertResource,
) -> dict[str, str]:
    """Alert each pipeline whose state could not be read, once per cause (its error without
    the numbers that change between ticks); return what stays alerted (the cursor). A pipeline
    read since (``read``: those read this tick) may alert anew."""
    now_alerted = {name: cause for name, cause in alerted.items() if name not in read}
    for name, error in errors:
        cause = cause_key([str(error)])
        if now_alerted.get(name) == cause:
            continue
        now_alerted[name] = cause
        alerts.send(
            Alert(
                "state_unreadable",
                f"pipeline {name!r}: its offsets and Kafka metadata cannot be read",
                f"{type(error).__name__}: {error}. No run is launched for it until they can be "
                "(the other pipelines are decided as usual); fix the cause, usually its table's "
                "catalog entry, its topics' cluster or a replica missing from the configuration",
                "ERROR",
                {"pipeline": name, "sensor": LAG_SENSOR},
            )
        )
    return now_alerted


def in_turn(names: list[str], first: str | None) -> list[str]:
    """``names`` starting with ``first`` (where the last tick stopped), then around.

    Example:
        >>> in_turn(["a", "b", "c"], "b")
        ['b', 'c', 'a']
        >>> in_turn(["a", "b"], "gone")
        ['a', 'b']
    """
    if first not in names:
        return names
    at = names.index(first)
    return names[at:] + names[:at]


def build_lag_sensor(
    specs: Sequence[PipelineSpec],
    jobs: "Sequence[AssetJob | JobDefinition]",
    budget_s: float = PASS_BUDGET_SECONDS,
) -> SensorDefinition:
    """One sensor for every pipeline: each tick is one pass that reads the pipelines' states
    with one catalog and one Kafka admin client and consumer per cluster, and launches an
    ingestion run of a pipeline whose lag or age crosses its spec's bounds, unless the
    blocking group-id check fails on the state just read.

    A pipeline a run or a stream worker is ingesting is not read at all (nothing could be
    requested for it), so a streaming pipeline costs this sensor nothing while it streams. A
    pass stops after ``budget_s`` and the next tick resumes there. A pipeline whose state
    cannot be read is skipped, named in the tick's log and alerted once per cause
    (``state_unreadable``) while the others are decided; the tick fails when no pipeline could
    be read (the broker or the catalog is down).

    The age is lag in seconds as the checks compute it (``ingestion.health.lag``, R53): a producer
    timestamp in the future is bounded by the last commit, or before any commit by the tick
    that first saw it (``future_seen`` in the pipeline's cursor entry), and named in
    ``future_timestamps``.

    A continuous pipeline (``ingestion.health.triggers.is_continuous``) launches no ingestion run
    here: the stream sensor assigns it to a worker (``platform_assets/streaming/sensors.py``);
    this sensor still requests the runs that record the group check, once no worker serves it.
    """
    by_name = {spec.name: spec for spec in specs}
    names = sorted(by_name)

    @sensor(
        name=LAG_SENSOR,
        jobs=list(jobs),
        minimum_interval_seconds=LAG_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description="Reads every pipeline's lag from offsets (no consumption) and requests "
        f"ingestion runs; none for a pipeline while {GROUP_CHECK.name} blocks it.",
    )
    def _sensor(
        context: SensorEvaluationContext,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
        alerts: AlertResource,
    ) -> SensorResult:
        cursor = json.loads(context.cursor) if context.cursor else {}
        entries: dict[str, Any] = {
            n: e for n, e in (cursor.get("pipelines") or {}).items() if n in by_name
        }
        busy = Busy.read(context.instance, list(by_name.values()))
        requests, lines, errors, fresh = [], [], [], set()
        resume, read = None, 0
        deadline = time.monotonic() + budget_s
        with StateReader(kafka, iceberg) as reader:
            for name in in_turn(names, cursor.get("resume")):
                spec = by_name[name]
                if busy.ingesting(context.instance, spec):
                    lines.append(f"{name}: a run or a stream worker is ingesting it")
                    continue
                if read and time.monotonic() > deadline:
                    resume = resume or name  # the next tick starts with the first not reached
                    lines.append(f"{name}: not reached in {budget_s:.0f} s; next tick")
                    continue
                read += 1
                try:
                    state = reader.read(spec, with_oldest=True)
                except Exception as exc:
                    errors.append((name, exc))
                    context.log.error(f"{name}: its state could not be read: {exc}")
                    lines.append(f"{name}: state unreadable ({exc}); the others were read")
                    continue
                fresh.add(name)
                request, reason, entries[name] = decide_pipeline(
                    context.instance, spec, state, entries.get(name, {})
                )
                if request is not None:
                    requests.append(request)
                lines.append(f"{name}: {reason}")
        if errors and len(errors) == read:  # nothing read at all: fail the tick loudly (the
            raise errors[0][1]  # broker or the catalog is down), as the run's would
        unreadable = alert_unreadable(errors, cursor.get("unreadable") or {}, fresh, alerts)
        for line in lines:
            context.log.info(line)
        new_cursor = json.dumps(
            {"pipelines": entries, "resume": resume, "unreadable": unreadable}, sort_keys=True
        )
        if requests:
            return SensorResult(run_requests=requests, cursor=new_cursor)
        return SensorResult(skip_reason="\n".join(lines) or "no pipeline", cursor=new_cursor)

    return _sensor
