"""Operator actions shared by the CLI (and the Dagster operation jobs): reset, migrate, maintain."""

from __future__ import annotations

import argparse
from typing import Any

from ingestion.maintenance import maintain_table
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


def run_command(
    args: argparse.Namespace,
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
) -> int:
    """Run ``reset``, ``migrate-group`` or ``maintain`` for the CLI."""
    from platform_assets.cli import parse_position

    if args.command == "reset":
        for line in reset_offsets(
            spec, kafka, iceberg, parse_position(args.to), args.apply, args.by, args.reason
        ):
            print(line)
    elif args.command == "migrate-group":
        migration = migrate_group(
            iceberg.load_catalog(),
            spec,
            args.new_group,
            kafka.get_admin_client(),
            args.by,
            args.reason,
        )
        print(f"offsets carried to {args.new_group!r} in snapshot {migration.snapshot_id}")
        print(f"Kafka group {args.new_group!r} mirror: {migration.mirror.error or 'ok'}")
        print(
            f"old Kafka group {spec.consumer_group_id!r} left as is: {migration.old_group_offsets}"
        )
        print(f"now set consumer_group_id: {args.new_group} for pipeline {spec.name!r}")
    else:
        table = iceberg.load_catalog().load_table(spec.table)
        report = maintain_table(table, args.retention_hours * 3600, args.orphan_window_hours * 3600)
        print(
            f"compacted {report.files_compacted} files into {report.files_written} "
            f"({report.rows_rewritten} rows); expired {report.expired_snapshots} snapshots, kept "
            f"{report.kept_for_watermark} for the offsets watermark; removed "
            f"{len(report.orphans_removed)} orphan files"
        )
    return 0
