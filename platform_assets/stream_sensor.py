"""The stream sensor of a continuous pipeline: keeps exactly one stream run alive.

It decides, the stream run does: it starts a stream when none is alive and the pipeline is not
blocked, asks a stream to stop when the blocking group check fails or the definitions were
reloaded (a new spec or new code: the next tick starts a stream of the new definitions), and
marks failed a stream whose heartbeat stopped (``platform_assets.stream.supervise_streams``).
The lag sensor records the group check; a stream starts only once its newest evaluation no
longer blocks.
"""

import time

from dagster import (
    AssetCheckKey,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from ingestion.checks import GROUP_CHECK, check_group_consistency
from ingestion.spec import PipelineSpec
from platform_assets.jobs import count_active_runs, ingest_job_name
from platform_assets.pipelines import table_key
from platform_assets.sensors import blocked_reason, latest_outcome
from platform_assets.state import read_pipeline_state
from platform_assets.stream import GENERATION_TAG, seconds_since_failure, supervise_streams
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

STREAM_SENSOR_INTERVAL_SECONDS = 10
RESTART_BACKOFF_SECONDS = 30


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
