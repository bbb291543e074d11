"""Schedules: topic observation, a fallback ingestion and table maintenance per pipeline,
periodic checks."""

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ingestion.health.checks import check_group_consistency
from ingestion.health.triggers import is_continuous
from ingestion.ops.retention import maintenance_cron, orphan_window_hours, snapshot_retention_hours
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, AssetJob
from platform_assets.ingest.sensors import blocked_reason
from platform_assets.operations.jobs import MAINTAIN_JOB, MAINTAIN_OP
from platform_assets.state import read_pipeline_state
from platform_assets.streaming.jobs import active_stream_runs
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


def build_maintenance_schedule(spec: PipelineSpec) -> ScheduleDefinition:
    """Maintain the pipeline's tables on ``maintenance_cron``: compaction, expiry keeping the
    retention of ``snapshot_retention_hours`` and the offsets watermark (rule 7), orphan removal
    (``ingestion.ops.retention``; the ``maintain_tables`` job, as from the UI or the CLI).

    It runs while a stream is alive (a stream never ends by itself, and maintenance takes no
    ingestion pool): every step is a compare-and-set against a concurrent commit (R41, R43).
    It skips while a maintenance run of the pipeline is still queued or in progress, and
    while the table does not exist yet (the pipeline's first run creates it).
    """
    retention, window = snapshot_retention_hours(spec), orphan_window_hours(spec)
    config = {
        "pipeline": spec.name,
        "snapshot_retention_hours": retention,
        "orphan_window_hours": window,
        "compact": True,
    }

    @schedule(
        name=f"{spec.name}_maintenance_schedule",
        job_name=MAINTAIN_JOB,
        cron_schedule=maintenance_cron(spec),
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Compacts {spec.table!r}, expires its snapshots older than {retention:g} h "
        f"(keeping the offsets), removes orphans older than {window:g} h.",
    )
    def _maintenance(
        context: ScheduleEvaluationContext, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        if not iceberg.load_catalog().table_exists(spec.table):
            return SkipReason(f"{spec.table!r} does not exist yet: nothing to maintain")
        active = context.instance.get_runs(
            RunsFilter(
                job_name=MAINTAIN_JOB, statuses=ACTIVE_RUN_STATUSES, tags={"pipeline": spec.name}
            ),
            limit=1,
        )
        if active:
            return SkipReason(f"maintenance of {spec.name!r} is still running ({active[0].run_id})")
        return RunRequest(
            run_config={"ops": {MAINTAIN_OP: {"config": config}}},
            tags={"pipeline": spec.name, "trigger": "maintenance_schedule"},
        )

    return _maintenance


def build_checks_schedule(job: AssetJob) -> ScheduleDefinition:
    """Evaluate the checks every five minutes, so freshness fails even when nothing runs."""
    return ScheduleDefinition(
        name="run_checks_every_5_minutes",
        job=job,
        cron_schedule="*/5 * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )
