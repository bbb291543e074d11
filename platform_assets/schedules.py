"""Schedules: topic observation, a fallback ingestion per pipeline, periodic checks."""

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ingestion.checks import check_group_consistency
from ingestion.spec import PipelineSpec
from ingestion.triggers import is_continuous
from platform_assets.jobs import AssetJob
from platform_assets.sensors import blocked_reason
from platform_assets.state import read_pipeline_state
from platform_assets.stream import active_stream_runs
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def build_observe_topics_schedule(job: JobDefinition) -> ScheduleDefinition:
    """Observe every pipeline's topics once a minute (partitions, end offsets, newest record)."""
    return ScheduleDefinition(
        name="observe_topics_every_minute",
        job=job,
        cron_schedule="* * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )


def build_fallback_schedule(spec: PipelineSpec, job: AssetJob) -> ScheduleDefinition:
    """Ingest on ``fallback_cron`` even if the lag sensor is off (an idle run commits nothing);
    skip while the blocking group-id check fails (the run could only fail)."""

    @schedule(
        name=f"{spec.name}_fallback_schedule",
        job=job,
        cron_schedule=spec.fallback_cron,
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Ingests {spec.name!r} on {spec.fallback_cron!r} unless it is blocked.",
    )
    def _fallback(
        context: ScheduleEvaluationContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        if is_continuous(spec) and active_stream_runs(context.instance, spec):
            return SkipReason(f"{spec.name!r} streams: its stream run is ingesting")
        finding = check_group_consistency(read_pipeline_state(spec, kafka, iceberg))
        if finding.blocks:
            return SkipReason(blocked_reason(spec, finding))
        return RunRequest(tags={"trigger": "fallback_schedule"})

    return _fallback


def build_checks_schedule(job: AssetJob) -> ScheduleDefinition:
    """Evaluate the checks every five minutes, so freshness fails even when nothing runs."""
    return ScheduleDefinition(
        name="run_checks_every_5_minutes",
        job=job,
        cron_schedule="*/5 * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )
