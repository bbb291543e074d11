"""Schedules: topic observation on a fixed cadence."""

from __future__ import annotations

from dagster import DefaultScheduleStatus, JobDefinition, ScheduleDefinition


def build_observe_topics_schedule(job: JobDefinition) -> ScheduleDefinition:
    """Observe every pipeline's topics once a minute (partitions, end offsets, newest record)."""
    return ScheduleDefinition(
        name="observe_topics_every_minute",
        job=job,
        cron_schedule="* * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )
