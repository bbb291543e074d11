"""Operator actions shared by the CLI and the Dagster operation jobs: reset, migrate, maintain.

Each returns the lines that describe what it did; the caller prints or records them."""

from __future__ import annotations

from typing import Any

from ingestion.maintenance import maintain_pipeline
from ingestion.operations import apply_reset, migrate_group, plan_reset
from ingestion.spec import PipelineSpec
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def reset_offsets(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    position: Any,
    apply: bool,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
) -> list[str]:
    """Plan (and with ``apply``, commit) a reset; return the lines describing it."""
    catalog = iceberg.load_catalog()
    consumer = kafka.get_consumer()
    try:
        reset = plan_reset(
            spec, catalog.load_table(spec.table), kafka.get_admin_client(), consumer, position
        )
    finally:
        consumer.close()
    lines = reset.describe()
    if not apply:
        return [*lines, "dry run: nothing committed (add --apply)"]
    snapshot = apply_reset(
        catalog, spec, reset, kafka.get_cluster_id(), requested_by, reason, active_runs
    )
    return [*lines, f"committed in snapshot {snapshot}"]


def migrate_group_offsets(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    new_group: str,
    requested_by: str,
    reason: str,
) -> list[str]:
    """Carry the offsets to ``new_group`` (one commit); return the lines describing it."""
    migration = migrate_group(
        iceberg.load_catalog(), spec, new_group, kafka.get_admin_client(), requested_by, reason
    )
    return [
        f"offsets carried to {new_group!r} in snapshot {migration.snapshot_id}",
        f"Kafka group {new_group!r} mirror: {migration.mirror.error or 'ok'}",
        f"old Kafka group {spec.consumer_group_id!r} left as is: {migration.old_group_offsets}",
        f"now set consumer_group_id: {new_group} for pipeline {spec.name!r}",
    ]


def maintain_pipeline_table(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, retention_s: float, orphan_window_s: float
) -> list[str]:
    """Compact, expire and remove orphans on the pipeline's table (keeping the current group's
    watermark); return the lines describing what was done and what failed."""
    return maintain_pipeline(iceberg.load_catalog(), spec, retention_s, orphan_window_s).describe()
