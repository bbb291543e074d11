"""The stream sensor: one for the code location, keeping one worker run per shard alive and
telling each which pipelines to stream.

It decides, the workers do (``platform_assets/streaming/jobs.py``). On every tick, in one pass
over the instance's active runs (no Kafka or catalog read), it:

- assigns each streaming pipeline to its shard's worker (``shard_of``), unless it must wait: its
  newest ``group_id_consistency`` evaluation blocks (the lag sensor records it; the lane itself
  stops at the first blocked iteration), an operator action holds it, or a run of its ingest job
  is in progress (the stream follows it);
- writes each worker's assignment into its run's tags when it changed: the worker starts,
  stops or restarts that pipeline's lane only, so adding, removing, changing, blocking or
  holding one pipeline never restarts the others;
- starts a worker for a shard that has pipelines and none alive (not within
  ``RESTART_BACKOFF_SECONDS`` of its last failure), asks a worker started from other code (or
  another ``streaming.workers``) to stop (the next tick starts its successor once it ended),
  waits for a worker being terminated (CANCELING: it may still commit) to end, and marks
  failed a worker whose heartbeat stopped (its process was killed), a CANCELING one too;
- asks the runs of the per-pipeline stream jobs of earlier releases (``stream_<p>_job``) to stop;
- alerts once per pipeline and cause when a lane fails (the worker lists it in its tags).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dagster import (
    AssetCheckKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from ingestion.health.checks import GROUP_CHECK
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.alerts.policy import cause_key
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, count_active_runs, operator_holds
from platform_assets.ingest.liveness import RUNNING_STATUSES
from platform_assets.ingest.sensors import blocked_reason, latest_outcome
from platform_assets.pipelines import ingests, table_key
from platform_assets.streaming.jobs import (
    ASSIGNED_TAG,
    FAILURES_TAG,
    GENERATION_TAG,
    RESTART_BACKOFF_SECONDS,
    SERVING_TAG,
    SHARD_TAG,
    STALE_AFTER_SECONDS,
    STOP_TAG,
    STREAM_JOB,
    dump_tag_map,
    is_stale,
    read_tag_map,
    shard_of,
    spec_version,
)
from resources.alerts import Alert, AlertResource

STREAM_SENSOR_INTERVAL_SECONDS = 10


@dataclass
class WorkerPlan:
    """What one tick decided: the runs to start, one line per thing done or waited for, and the
    failing lanes (pipeline -> (worker run id, error))."""

    requests: list[RunRequest] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)


def waiting_reasons(
    instance: DagsterInstance, specs: Sequence[PipelineSpec], runs: Sequence[DagsterRun]
) -> dict[str, str]:
    """The streaming pipelines that must not stream now, each with why (module docstring)."""
    reasons: dict[str, str] = {}
    for name, operator in operator_holds(instance, [s.name for s in specs]).items():
        reasons[name] = f"{name!r}: operator action in progress (run {operator})"
    for spec in specs:
        if spec.name in reasons:
            continue
        latest = latest_outcome(instance, AssetCheckKey(table_key(spec), GROUP_CHECK.name))
        # its own job's runs, and ingest_all's that select it (a fallback run); counted alive
        jobs = {run.job_name for run in runs if ingests(run.job_name, run.asset_selection, spec)}
        if latest is not None and latest.blocks:
            reasons[spec.name] = blocked_reason(spec, latest)
        elif active := [job for job in sorted(jobs) if count_active_runs(instance, job)]:
            reasons[spec.name] = f"a run of {active[0]} is ingesting it; the stream follows"
    return reasons


def plan_workers(
    instance: DagsterInstance,
    specs: Sequence[PipelineSpec],
    generation: str,
    workers: int,
    now: float,
    location: str | None = None,
) -> WorkerPlan:
    """Decide one tick of the stream sensor (module docstring); tags are written here, runs to
    start are returned. Delivery: nothing is consumed or committed here."""
    plan = WorkerPlan()
    runs = [  # oldest first: of two workers of one shard, the older one keeps it
        run
        for run in reversed(instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES)))
        if location is None
        or run.remote_job_origin is None
        or run.remote_job_origin.location_name == location
    ]
    waiting = waiting_reasons(instance, specs, runs)
    plan.lines += [waiting[name] for name in sorted(waiting)]
    wanted: dict[int, dict[str, str]] = {shard: {} for shard in range(workers)}
    owned = set()  # shards with a streaming pipeline, waiting ones included
    for spec in specs:
        home = shard_of(spec.name, workers)
        owned.add(home)
        if spec.name not in waiting:
            wanted[home][spec.name] = spec_version(spec)
    alive: set[int] = set()
    terminating: set[int] = set()  # shards a CANCELING worker may still commit to
    for run in runs:
        if run.job_name != STREAM_JOB:
            stop_legacy_stream(instance, run, now, plan)
            continue
        shard = worker_shard(run, workers)
        record = instance.get_run_record_by_id(run.run_id)
        started_at = record.start_time if record is not None else None
        if run.status in RUNNING_STATUSES and is_stale(run, now, started_at):
            instance.report_run_failed(
                run,
                message=f"stream worker {run.tags.get(SHARD_TAG)} stopped beating for over "
                f"{STALE_AFTER_SECONDS:.0f} s (its process died); the stream sensor starts a "
                "new one, whose lanes re-plan from the tables' offsets",
            )
            plan.lines.append(f"marked stream worker {run.run_id} failed (no heartbeat)")
            continue
        if run.status == DagsterRunStatus.CANCELING:
            # Terminated, it stops its lanes between commits (up to its stop timeout) and keeps
            # beating meanwhile: no successor for its shard, nor for a shard of a pipeline it
            # serves, until it ended or stopped beating (then marked failed above).
            served = read_tag_map(run, SERVING_TAG)
            shards = {shard_of(name, workers) for name in served}
            terminating |= shards | ({shard} if shard is not None else set())
            plan.lines.append(f"stream worker {run.run_id} is terminating (CANCELING): waiting")
            for name, error in read_tag_map(run, FAILURES_TAG).items():
                plan.failures[name] = (run.run_id, error)
            continue
        stop = None
        if run.tags.get(GENERATION_TAG) != generation:
            stop = "the code, the configuration or streaming.workers changed: restarting it"
        elif shard is None or shard not in owned:
            stop = "no streaming pipeline is left for this worker"
        elif shard in alive:  # a second worker of the shard (a re-execution, a manual launch)
            stop = f"another worker already serves shard {run.tags.get(SHARD_TAG)}"
        if shard is not None:
            alive.add(shard)  # a stopping worker too: its successor starts once it ended
        if stop:
            if STOP_TAG not in run.tags:
                instance.add_run_tags(run.run_id, {STOP_TAG: stop})
                plan.lines.append(f"asked stream worker {run.run_id} to stop: {stop}")
            continue
        assigned = dump_tag_map(wanted[shard] if shard is not None else {})
        if run.tags.get(ASSIGNED_TAG) != assigned:
            instance.add_run_tags(run.run_id, {ASSIGNED_TAG: assigned})
            plan.lines.append(f"assigned stream worker {run.run_id}: {assigned}")
        for name, error in read_tag_map(run, FAILURES_TAG).items():
            plan.failures[name] = (run.run_id, error)
    for shard in sorted(owned - alive - terminating):
        if not wanted[shard]:
            continue
        failed_ago = seconds_since_worker_failed(instance, shard, workers, now)
        if failed_ago is not None and failed_ago < RESTART_BACKOFF_SECONDS:
            plan.lines.append(
                f"stream worker {shard}/{workers} failed {failed_ago:.0f} s ago; restarting "
                f"{RESTART_BACKOFF_SECONDS:.0f} s after a failure"
            )
            continue
        plan.requests.append(
            RunRequest(
                tags={
                    "trigger": "stream_sensor",
                    SHARD_TAG: f"{shard}/{workers}",
                    GENERATION_TAG: generation,
                    ASSIGNED_TAG: dump_tag_map(wanted[shard]),
                }
            )
        )
    return plan


def worker_shard(run: DagsterRun, workers: int) -> int | None:
    """The shard of a worker run, or None when it belongs to another worker count."""
    index, _, count = (run.tags.get(SHARD_TAG) or "").partition("/")
    if not index.isdigit() or count != str(workers) or int(index) >= workers:
        return None
    return int(index)


def seconds_since_worker_failed(
    instance: DagsterInstance, shard: int, workers: int, now: float
) -> float | None:
    """Seconds since this shard's newest worker run failed (None if it did not)."""
    records = instance.get_run_records(
        RunsFilter(job_name=STREAM_JOB, tags={SHARD_TAG: f"{shard}/{workers}"}), limit=1
    )
    if not records or records[0].dagster_run.status != DagsterRunStatus.FAILURE:
        return None
    ended = records[0].end_time
    return now - ended if ended is not None else None


def stop_legacy_stream(
    instance: DagsterInstance, run: DagsterRun, now: float, plan: WorkerPlan
) -> None:
    """Stop a run of an earlier release's per-pipeline stream job (``stream_<p>_job``): its
    pipeline now streams on a shared worker. One still beating is asked to stop (it ends between
    commits); one silent past :data:`STALE_AFTER_SECONDS` is marked failed."""
    pipeline = run.tags.get("pipeline")
    if not pipeline or run.job_name != f"stream_{pipeline}_job":
        return
    record = instance.get_run_record_by_id(run.run_id)
    started_at = record.start_time if record is not None else None
    why = f"pipeline {pipeline!r} now streams on a shared stream worker ({STREAM_JOB})"
    # An earlier release's stream beat every minute or so: silent for 10 minutes, it is gone.
    if run.status in RUNNING_STATUSES and is_stale(run, now, started_at, 10 * 60):
        instance.report_run_failed(run, message=f"{why}; this run stopped beating")
        plan.lines.append(f"marked stream run {run.run_id} failed (no heartbeat): {why}")
    elif STOP_TAG not in run.tags:
        instance.add_run_tags(run.run_id, {STOP_TAG: why})
        plan.lines.append(f"asked stream run {run.run_id} to stop: {why}")


def alert_lane_failures(
    failures: dict[str, tuple[str, str]],
    alerted: dict[str, str],
    alerts: AlertResource,
) -> dict[str, str]:
    """Alert each pipeline whose lane failed, once per cause (its error without the numbers and
    ids that change between attempts: ``cause_key``); return what is alerted now (the cursor).
    A pipeline whose lane committed again leaves the failures and may alert anew."""
    now_alerted = {}
    for name, (run_id, error) in sorted(failures.items()):
        cause = cause_key([error])
        now_alerted[name] = cause
        if alerted.get(name) == cause:
            continue
        alerts.send(
            Alert(
                "stream_failed",
                f"pipeline {name!r}: its stream lane failed",
                f"{error}. Nothing past its last commit was committed; the worker restarts the "
                f"lane every {RESTART_BACKOFF_SECONDS:.0f} s and the other pipelines keep "
                "streaming",
                "ERROR",
                {"pipeline": name, "run_id": run_id, "job": STREAM_JOB},
                link=alerts.run_link(run_id),
            )
        )
    return now_alerted


def build_stream_sensor(
    specs: Sequence[PipelineSpec], generation: str, workers: int
) -> SensorDefinition:
    """Keep the stream workers alive and assigned (see the module docstring)."""
    streaming = list(specs)

    @sensor(
        name="stream_sensor",
        # by name: a job object would make Definitions rebind it (a beta code path in 1.13)
        job_name=STREAM_JOB,
        minimum_interval_seconds=STREAM_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Keeps {workers} stream worker run(s) alive, each streaming the pipelines "
        "assigned to it; none for a pipeline blocked by group_id_consistency or held by an "
        "operator action.",
    )
    def _sensor(context: SensorEvaluationContext, alerts: AlertResource) -> SensorResult:
        origin = context.code_location_origin
        location = origin.location_name if origin is not None else None
        plan = plan_workers(context.instance, streaming, generation, workers, time.time(), location)
        cursor = json.loads(context.cursor) if context.cursor else {}
        alerted = alert_lane_failures(plan.failures, cursor.get("alerted", {}), alerts)
        for line in plan.lines:
            context.log.info(line)
        summary = "; ".join(plan.lines) or f"{len(streaming)} pipeline(s) streaming"
        return SensorResult(
            run_requests=plan.requests,
            skip_reason=None if plan.requests else SkipReason(summary),
            cursor=json.dumps({"alerted": alerted}),
        )

    return _sensor
