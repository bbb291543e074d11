"""The CLI's disaster-recovery actions: ``failover``, ``complete-failback`` and
``release-late-copies``, on the same code as the ``failover`` job (``platform_assets.dr.jobs``).

Loaded by ``platform_assets.cli.actions`` only when one of these commands runs. Delivery: each
applied action is a compare-and-set commit (``ingestion.dr.switch``,
``ingestion.dr.failback.complete``, ``ingestion.dr.late_copies.release``); a dry run commits
nothing. An applied switch first counts the pipeline's active ingestion runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ingestion.dr.late_copies.release import count_guard, release_guard
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.dr.failover import complete_failback, failover_pipeline
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def run_dr_action(
    args: argparse.Namespace,
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    count_runs: Callable[[PipelineSpec, IcebergCatalogResource], tuple[int, str]],
) -> list[str]:
    """Run one disaster-recovery command; return the lines to print (``count_runs``: the
    pipeline's active ingestion runs and a line saying so, for an applied switch)."""
    if args.command == "failover" and not args.apply:
        return failover_pipeline(
            spec,
            kafka,
            iceberg,
            args.to,
            dry_run=True,
            requested_by=args.by,
            reason=args.reason,
            source_lost=args.source_lost,
        )
    if args.command == "complete-failback" and not args.apply:
        return complete_failback(
            spec, kafka, iceberg, dry_run=True, requested_by=args.by, reason=args.reason
        )
    if args.command == "release-late-copies" and not args.apply:
        held, clusters = count_guard(iceberg.load_catalog(), spec)
        read_on = ", ".join(f"{n} read on {name!r}" for name, n in sorted(clusters.items()))
        return [
            f"would release the {held} uncopied record(s) of {spec.name!r}'s route ({read_on})",
            "dry run: nothing committed (add --apply)",
        ]
    if args.command == "release-late-copies":
        released, clusters = release_guard(iceberg.load_catalog(), spec, args.by, args.reason)
        read_on = ", ".join(f"{n} read on {name!r}" for name, n in sorted(clusters.items()))
        return [
            f"released the {released} uncopied record(s) of {spec.name!r}'s route ({read_on}; "
            f"by {args.by!r}, reason {args.reason!r}): runs no longer skip or wait for the "
            "late copies of any of them"
        ]
    active, counted = count_runs(spec, iceberg)
    if args.command == "failover":
        lines = failover_pipeline(
            spec,
            kafka,
            iceberg,
            args.to,
            dry_run=False,
            requested_by=args.by,
            reason=args.reason,
            active_runs=active,
            source_lost=args.source_lost,
        )
    else:
        lines = complete_failback(
            spec,
            kafka,
            iceberg,
            dry_run=False,
            requested_by=args.by,
            reason=args.reason,
            active_runs=active,
        )
    return [counted, *lines]
