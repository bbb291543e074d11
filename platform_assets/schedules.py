"""Schedules: topic observation, a fallback ingestion per pipeline, periodic checks."""

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    ScheduleDefinition,
)

from ingestion.spec import PipelineSpec
from platform_assets.jobs import AssetJob


def build_observe_topics_schedule(job: JobDefinition) -> ScheduleDefinition:
    """Observe every pipeline's topics once a minute (partitions, end offsets, newest record)."""
    return ScheduleDefinition(
        name="observe_topics_every_minute",
        job=job,
        cron_schedule="* * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )


def build_fallback_schedule(spec: PipelineSpec, job: AssetJob) -> ScheduleDefinition:
    """Ingest on ``fallback_cron`` even if the lag sensor is off (an idle run commits nothing)."""
    return ScheduleDefinition(
        name=f"{spec.name}_fallback_schedule",
        job=job,
        cron_schedule=spec.fallback_cron,
        default_status=DefaultScheduleStatus.RUNNING,
    )


def build_checks_schedule(job: AssetJob) -> ScheduleDefinition:
    """Evaluate every check every five minutes, so freshness fails even when nothing runs."""
    return ScheduleDefinition(
        name="run_checks_every_5_minutes",
        job=job,
        cron_schedule="*/5 * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )
