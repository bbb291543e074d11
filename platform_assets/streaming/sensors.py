"""The stream sensor of a continuous pipeline: keeps exactly one stream run alive.

It decides, the stream run does: it starts a stream when none is alive and the pipeline is not
blocked, asks a stream to stop when the blocking group check fails or the definitions were
reloaded (a new spec or new code: the next tick starts a stream of the new definitions), and
marks failed a stream whose heartbeat stopped
(``platform_assets.streaming.jobs.supervise_streams``).
The lag sensor records the group check; a stream starts only once its newest evaluation no
longer blocks.

A stream whose pipeline no longer streams (removed from ``pipelines.yaml``, or its freshness
target raised to the floor or above) has no stream sensor any more: one definitions-wide sensor,
``stop_retired_streams``, asks it to stop the same way (the stop tag), or marks it failed when its
heartbeat stopped, so that it frees the pipeline's pool for the runs that replace it.
"""

import time
from collections.abc import Set

from dagster import (
    AssetCheckKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from ingestion.health.checks import GROUP_CHECK, check_group_consistency
from ingestion.health.triggers import MAX_COMMIT_INTERVAL_SECONDS, is_continuous
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, active_operator_runs, count_active_runs
from platform_assets.ingest.sensors import blocked_reason, latest_outcome
from platform_assets.pipelines import ingest_job_name, table_key
from platform_assets.state import read_pipeline_state
from platform_assets.streaming.jobs import (
    GENERATION_TAG,
    HEARTBEAT_TAG,
    STOP_TAG,
    seconds_since_failure,
    stream_job_name_of,
    supervise_streams,
)
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

STREAM_SENSOR_INTERVAL_SECONDS = 10
RESTART_BACKOFF_SECONDS = 30
# A retired stream's spec is gone: it is dead once silent longer than any stream may be
# (platform_assets.streaming.jobs.stale_after_seconds at the longest commit interval).
RETIRED_STALE_AFTER_SECONDS = max(60.0, 10 * MAX_COMMIT_INTERVAL_SECONDS)


def build_stream_sensor(
    spec: PipelineSpec, stream_job: JobDefinition, generation: str
) -> SensorDefinition:
    """Start, stop and replace the pipeline's stream run (see the module docstring)."""
    group_key = AssetCheckKey(table_key(spec), GROUP_CHECK.name)

    @sensor(
        name=f"{spec.name}_stream_sensor",
        # by name: a job object would make Definitions rebind it (a beta code path in 1.13)
        job_name=stream_job.name,
        minimum_interval_seconds=STREAM_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Keeps one stream run of {spec.name!r} alive; none while "
        f"{GROUP_CHECK.name} blocks it.",
    )
    def _sensor(
        context: SensorEvaluationContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        finding = check_group_consistency(read_pipeline_state(spec, kafka, iceberg))
        stop = blocked_reason(spec, finding) if finding.blocks else None
        if supervise_streams(context.instance, spec, generation, stop):
            return SkipReason(stop or f"the stream of {spec.name!r} is alive")
        if stop:
            return SkipReason(stop)
        held = active_operator_runs(context.instance, spec)
        if held:  # the operator job asked the stream to stop (operations.hold_ingestion)
            return SkipReason(
                f"{spec.name!r}: operator action in progress (run {held[0]}); the stream "
                "restarts when it ends"
            )
        if count_active_runs(context.instance, ingest_job_name(spec)):
            return SkipReason(f"a run of {ingest_job_name(spec)} is active; the stream follows")
        failed_ago = seconds_since_failure(context.instance, spec, time.time())
        if failed_ago is not None and failed_ago < RESTART_BACKOFF_SECONDS:
            return SkipReason(
                f"the last stream of {spec.name!r} failed {failed_ago:.0f} s ago; restarting "
                f"{RESTART_BACKOFF_SECONDS} s after a failure (a failure that repeats does "
                "not become a storm of runs)"
            )
        latest = latest_outcome(context.instance, group_key)
        if latest is not None and latest.blocks:
            return SkipReason(f"waiting for the lag sensor's run to record {GROUP_CHECK.name}")
        return RunRequest(tags={"trigger": "stream_sensor", GENERATION_TAG: generation})

    return _sensor


def stop_retired_streams(
    instance: DagsterInstance, streaming: Set[str], now: float, location: str | None = None
) -> tuple[list[str], list[str]]:
    """Stop the stream runs whose pipeline is not in ``streaming`` (the continuous pipelines of
    the current definitions); return what was done now, one line per run, and the ids of the
    runs asked earlier that are still ending.

    A run is a stream when its job is ``stream_<p>_job`` for its ``pipeline`` tag; a run that
    another code location (not ``location``) launched on the same instance is not ours. One still
    beating is asked to stop (the tag ``should_stop`` reads: it ends between commits); one
    silent for :data:`RETIRED_STALE_AFTER_SECONDS` is marked failed (its process died). A
    run already asked is left to finish. Delivery: nothing is consumed or committed here.
    """
    lines, ending = [], []
    for run in instance.get_runs(RunsFilter(statuses=ACTIVE_RUN_STATUSES)):
        pipeline = run.tags.get("pipeline")
        if not pipeline or run.job_name != stream_job_name_of(pipeline) or pipeline in streaming:
            continue
        origin = run.remote_job_origin
        if location is not None and origin is not None and origin.location_name != location:
            continue  # another code location's stream: its own sensor looks after it
        why = (
            f"pipeline {pipeline!r} no longer streams in the current definitions (removed from "
            "the pipelines file, or its freshness_target_seconds is at or above the floor)"
        )
        record = instance.get_run_record_by_id(run.run_id)
        beat = run.tags.get(HEARTBEAT_TAG)
        last = float(beat) if beat else (record.start_time if record is not None else None)
        silent = last is not None and now - last > RETIRED_STALE_AFTER_SECONDS
        if run.status == DagsterRunStatus.STARTED and silent:
            instance.report_run_failed(
                run, message=f"{why}; its stream stopped beating, it is not restarted"
            )
            lines.append(f"marked stream run {run.run_id} failed (no heartbeat): {why}")
            continue
        if STOP_TAG in run.tags:
            ending.append(run.run_id)
            continue
        instance.add_run_tags(run.run_id, {STOP_TAG: why})
        lines.append(f"asked stream run {run.run_id} to stop: {why}")
    return lines, ending


def build_retired_streams_sensor(specs: list[PipelineSpec]) -> SensorDefinition:
    """One sensor for the whole code location: :func:`stop_retired_streams` on every tick."""
    streaming = frozenset(spec.name for spec in specs if is_continuous(spec))

    @sensor(
        name="stop_retired_streams",
        minimum_interval_seconds=STREAM_SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description="Stops the stream runs of pipelines that no longer stream (removed, or "
        "their freshness target raised above the floor): they would hold the pool forever.",
    )
    def _sensor(context: SensorEvaluationContext) -> SkipReason:
        origin = context.code_location_origin
        location = origin.location_name if origin is not None else None
        lines, ending = stop_retired_streams(context.instance, streaming, time.time(), location)
        for line in lines:
            context.log.warning(line)
        if ending:
            lines.append(f"asked earlier, still ending: {', '.join(ending)}")
        return SkipReason("; ".join(lines) or "no stream run of a retired pipeline")

    return _sensor
