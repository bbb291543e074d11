"""Operator jobs in the Dagster UI, with typed run config, on the same code as the CLI."""

from typing import Any, Literal

from dagster import (
    AssetCheckKey,
    Config,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)

from ingestion.exceptions import IngestionError
from ingestion.health.checks import AUDIT_CHECK
from ingestion.ops.maintenance import MaintenanceReport, maintain_pipeline
from ingestion.ops.reset import migrate_group
from ingestion.ops.retention import orphan_window_hours, snapshot_retention_hours
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from platform_assets.ingest.checks import previous_audit_memory
from platform_assets.ingest.jobs import operator_action_in_progress
from platform_assets.ingest.liveness import record_run_process
from platform_assets.operations.actions import count_ingestion_runs, hold_ingestion, reset_offsets
from platform_assets.pipelines import table_key
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource

# The maintenance job and its op, named by the maintenance schedules.
MAINTAIN_JOB = "maintain_tables"
MAINTAIN_OP = "maintain_pipeline_tables"


class ResetConfig(Config):
    """Where to move the pipeline's offsets; a dry run unless ``apply``."""

    pipeline: str
    to: Literal["earliest", "latest", "timestamp"]
    timestamp_ms: int | None = None
    apply: bool = False
    reason: str = ""
    # Seconds to wait for the pipeline's ingestion runs in progress to end (its lag sensor
    # launches none meanwhile); the action is refused if one is still active after them.
    wait_for_runs_seconds: float = 120.0


class MigrateConfig(Config):
    """The new group id for a pipeline, and why."""

    pipeline: str
    new_group_id: str
    reason: str
    # Seconds to wait for the pipeline's ingestion runs in progress to end (its lag sensor
    # launches none meanwhile); the action is refused if one is still active after them.
    wait_for_runs_seconds: float = 120.0


class MaintainConfig(Config):
    """The pipeline to maintain (or ``pipelines``: several, one after the other, as the
    maintenance schedules ask); retention of snapshots and the orphan safety window, in hours
    (unset: each pipeline's own, ``ingestion.ops.retention``, as the schedules use)."""

    pipeline: str = ""
    pipelines: list[str] = []  # noqa: RUF012 - a pydantic field: each instance gets a copy
    snapshot_retention_hours: float | None = None
    orphan_window_hours: float | None = None
    compact: bool = True


def pick_pipeline(specs: list[PipelineSpec], name: str) -> PipelineSpec:
    """The spec named ``name``; a ``Failure`` naming the known ones otherwise."""
    by_name = {spec.name: spec for spec in specs}
    if name not in by_name:
        raise Failure(f"unknown pipeline {name!r}; known: {sorted(by_name)}")
    return by_name[name]


def hold_for_action(
    context: OpExecutionContext, spec: PipelineSpec, wait_s: float, apply: bool = True
) -> int:
    """The pipeline's ingestion runs in progress once an applied action may go on
    (``hold_ingestion``; a dry run commits nothing and only counts them)."""
    if not apply:
        return count_ingestion_runs(context.instance, spec)
    try:
        return hold_ingestion(context.instance, context.run_id, spec, wait_s)
    except IngestionError as exc:
        raise Failure(str(exc)) from None


def build_ops_jobs(specs: list[PipelineSpec]) -> list[JobDefinition]:
    """reset_offsets, migrate_group and maintain_tables jobs for the given pipelines (the
    failover job of pipelines with replicas: ``platform_assets.dr.jobs``)."""

    @op(name="reset_pipeline_offsets")
    def _reset(
        context: OpExecutionContext,
        config: ResetConfig,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
    ) -> None:
        spec = pick_pipeline(specs, config.pipeline)
        active = hold_for_action(context, spec, config.wait_for_runs_seconds, config.apply)
        position = StartingPosition(mode=config.to, timestamp_ms=config.timestamp_ms)
        requested_by = f"dagster run {context.run_id}"
        lines = reset_offsets(
            spec, kafka, iceberg, position, config.apply, requested_by, config.reason, active
        )
        context.add_output_metadata(
            {"changes": MetadataValue.md("\n".join(f"- {x}" for x in lines))}
        )

    @op(name="migrate_pipeline_group")
    def _migrate(
        context: OpExecutionContext,
        config: MigrateConfig,
        kafka: KafkaResource,
        iceberg: IcebergCatalogResource,
    ) -> None:
        spec = pick_pipeline(specs, config.pipeline)
        migration = migrate_group(
            iceberg.load_catalog(),
            spec,
            config.new_group_id,
            kafka.get_admin_client(),
            f"dagster run {context.run_id}",
            config.reason,
            hold_for_action(context, spec, config.wait_for_runs_seconds),
            kafka_config=kafka.client_config(),
        )
        context.log.info(
            f"{spec.consumer_group_id!r} is retired; now set consumer_group_id: "
            f"{config.new_group_id} for {spec.name!r}"
        )
        context.add_output_metadata(
            {
                "snapshot_id": MetadataValue.text(str(migration.snapshot_id)),
                "new_group_mirror": MetadataValue.text(migration.mirror.describe()),
            }
        )

    # No pool: a stream holds its pipeline's pool ``ingest_<p>`` for as long as it lives, so
    # maintenance in that pool would never run. It needs none: every step is a compare-and-set
    # or provably safe against a concurrent commit (R41, R43, R44).
    @op(name=MAINTAIN_OP)
    def _maintain(
        context: OpExecutionContext, config: MaintainConfig, iceberg: IcebergCatalogResource
    ) -> None:
        """Delivery: safe to repeat and to run beside ingestion (``maintain_pipeline``). Each
        pipeline is maintained on its own: one that fails does not stop the others, and the
        run then fails naming it (so that it alerts)."""
        record_run_process(context.instance, context.run.run_id)  # a killed run is told dead
        names = [*([config.pipeline] if config.pipeline else []), *config.pipelines]
        if not names:
            raise Failure(
                f"maintain_tables: set `pipeline` (one of {sorted(s.name for s in specs)})"
            )
        chosen = [pick_pipeline(specs, name) for name in dict.fromkeys(names)]
        catalog = iceberg.load_catalog()
        reports: dict[str, MaintenanceReport] = {}
        failed: list[str] = []
        for spec in chosen:
            try:
                report = reports[spec.name] = maintain_one(context, catalog, spec, config)
            except Exception as exc:
                failed.append(f"{spec.name!r}: {exc}")
                context.log.error(f"maintenance of {spec.name!r} failed: {exc}")
                continue
            context.log.info(f"maintained {spec.name!r}: " + "; ".join(report.describe()))
            if report.errors:  # every step ran; the run still fails so that it alerts
                failed.append(f"{spec.table}: " + "; ".join(report.errors))
        if len(chosen) == 1 and reports:
            context.add_output_metadata(describe_maintenance(next(iter(reports.values()))))
        else:
            context.add_output_metadata(describe_many(reports))
        if failed:
            raise Failure("maintenance of " + " | ".join(failed))

    @job(name="reset_offsets", description="Reset a pipeline's offsets (dry run by default).")
    def reset_job() -> None:
        _reset()

    @job(name="migrate_group", description="Carry a pipeline's offsets to a new group id.")
    def migrate_job() -> None:
        _migrate()

    # In the run's own process: its op records that process, so a killed run is told dead.
    @job(
        name=MAINTAIN_JOB,
        description="Compact, expire (keeping offsets), drop orphans.",
        executor_def=in_process_executor,
    )
    def maintain_job() -> None:
        _maintain()

    return [reset_job, migrate_job, maintain_job]


def maintain_one(
    context: OpExecutionContext, catalog: Any, spec: PipelineSpec, config: MaintainConfig
) -> MaintenanceReport:
    """Maintain one pipeline's tables with the run's retention (or the pipeline's own)."""
    retention, window = config.snapshot_retention_hours, config.orphan_window_hours
    # The commits after the audit's cursor are kept until it has recounted them (R47).
    memory = previous_audit_memory(
        context.instance, AssetCheckKey(table_key(spec), AUDIT_CHECK.name)
    )

    def yield_to() -> str | None:  # an operator action's commit goes first (R41)
        return operator_action_in_progress(context.instance, spec)

    return maintain_pipeline(
        catalog,
        spec,
        (snapshot_retention_hours(spec) if retention is None else retention) * 3600,
        (orphan_window_hours(spec) if window is None else window) * 3600,
        config.compact,
        keep_after=memory.cursor if memory else None,
        yield_to=yield_to,
    )


def describe_maintenance(report: MaintenanceReport) -> dict[str, Any]:
    """The run metadata of one pipeline's maintenance."""
    return {
        "summary": MetadataValue.md("\n".join(f"- {x}" for x in report.describe())),
        "files_compacted": report.files_compacted,
        "files_written": report.files_written,
        "rows_rewritten": report.rows_rewritten,
        "compaction_commits_retried": report.groups_retried,
        "snapshots_expired": report.expired_snapshots,
        "snapshots_kept_for_watermark": report.kept_for_watermark,
        "orphan_window_hours": round(report.orphan_window_s / 3600, 3),
        "orphans_removed": len(report.orphans_removed),
        **(
            {
                "quarantine_files_compacted": report.quarantine.files_compacted,
                "quarantine_snapshots_expired": report.quarantine.expired_snapshots,
                "quarantine_orphans_removed": len(report.quarantine.orphans_removed),
            }
            if report.quarantine is not None
            else {}
        ),
    }


def describe_many(reports: dict[str, MaintenanceReport]) -> dict[str, Any]:
    """The run metadata of several pipelines' maintenance: totals, and each one's summary."""
    return {
        "pipelines_maintained": len(reports),
        "files_compacted": sum(r.files_compacted for r in reports.values()),
        "snapshots_expired": sum(r.expired_snapshots for r in reports.values()),
        "orphans_removed": sum(len(r.orphans_removed) for r in reports.values()),
        **{
            name: MetadataValue.md("\n".join(f"- {x}" for x in r.describe()))
            for name, r in reports.items()
        },
    }
