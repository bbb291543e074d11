"""``platform``: the operator's command line, on the same code as the Dagster jobs.

    platform status [--json]            committed/end offsets, lag, last commit, mirror, checks
    platform validate                   specs + Kafka + catalog + group-id consistency
    platform reset PIPELINE --to earliest|latest|timestamp:MS [--apply --by WHO --reason WHY]
    platform migrate-group PIPELINE NEW_GROUP --by WHO --reason WHY
    platform maintain PIPELINE [--retention-hours H] [--orphan-window-hours H]

Connection settings come from the environment when the command runs, as for Dagster:
``KAFKA_BOOTSTRAP_SERVERS`` and ``PLATFORM_STATE_DIR`` (the embedded catalog).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ingestion.health import (
    check_commit_freshness,
    check_group_consistency,
    check_retention_risk,
    check_watermark_reachable,
)
from ingestion.spec import PipelineSpec, StartingPosition
from platform_assets.pipelines import load_pipelines
from platform_assets.state import read_pipeline_state
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def connect() -> tuple[KafkaResource, IcebergCatalogResource]:
    """The resources, from the environment (read now, at run time)."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set (make dev prints the broker address)")
    state_dir = os.environ.get("PLATFORM_STATE_DIR", ".platform")
    return KafkaResource(bootstrap_servers=bootstrap), IcebergCatalogResource(state_dir=state_dir)


def pipeline_status(
    spec: PipelineSpec, kafka: KafkaResource, iceberg: IcebergCatalogResource
) -> dict[str, Any]:
    """One pipeline's status as data."""
    state = read_pipeline_state(spec, kafka, iceberg)
    now_ms = int(time.time() * 1000)
    last = state.commits[0] if state.commits else None
    findings = {
        "group_id_consistency": check_group_consistency(state),
        "commit_freshness": check_commit_freshness(state, now_ms),
        "retention_risk": check_retention_risk(state),
        "offsets_watermark_reachable": check_watermark_reachable(state),
    }

    def key(partition: tuple[str, int]) -> str:
        return f"{partition[0]}:{partition[1]}"

    return {
        "pipeline": spec.name, "table": spec.table, "group_id": spec.effective_commit_group_id,
        "committed": {key(k): o for k, o in sorted(state.committed_offsets.items())},
        "end": {key(k): o for k, o in sorted(state.end_offsets.items())},
        "mirrored": {key(k): o for k, o in sorted(state.group_offsets.items())},
        "lag_records": sum(state.lag().values()),
        "last_commit_age_s": round((now_ms - last.timestamp_ms) / 1000, 1) if last else None,
        "valid_through_ms": int(last.properties.get("kafka.valid-through-ms", 0)) if last else None,
        "failing_checks": {n: f.message for n, f in findings.items() if not f.passed},
    }  # fmt: skip


def print_status(status: dict[str, Any]) -> None:
    print(f"{status['pipeline']}  table={status['table']}  group={status['group_id']}")
    print(
        f"  lag: {status['lag_records']} records   last commit: {status['last_commit_age_s']} s ago"
    )
    for partition, end in status["end"].items():
        committed, mirrored = status["committed"].get(partition), status["mirrored"].get(partition)
        print(
            f"  {partition:<20} committed {committed!s:>10}  end {end:>10}  mirror {mirrored!s:>10}"
        )
    for name, message in status["failing_checks"].items():
        print(f"  FAILING {name}: {message}")
    if not status["failing_checks"]:
        print("  checks: group ids, freshness, retention and watermark all pass")


def parse_position(text: str) -> StartingPosition:
    """``earliest``, ``latest`` or ``timestamp:<ms>``."""
    if text.startswith("timestamp:"):
        return StartingPosition(mode="timestamp", timestamp_ms=int(text.split(":", 1)[1]))
    return StartingPosition(mode=text)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="platform", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status")
    status.add_argument("--json", action="store_true")
    commands.add_parser("validate")
    reset = commands.add_parser("reset")
    reset.add_argument("pipeline")
    reset.add_argument("--to", required=True)
    reset.add_argument("--apply", action="store_true", help="commit it (default: dry run)")
    reset.add_argument("--by", default=os.environ.get("USER", "operator"))
    reset.add_argument("--reason", default="")
    migrate = commands.add_parser("migrate-group")
    migrate.add_argument("pipeline")
    migrate.add_argument("new_group")
    migrate.add_argument("--by", default=os.environ.get("USER", "operator"))
    migrate.add_argument("--reason", required=True)
    maintain = commands.add_parser("maintain")
    maintain.add_argument("pipeline")
    maintain.add_argument("--retention-hours", type=float, default=24 * 7)
    maintain.add_argument("--orphan-window-hours", type=float, default=72)
    args = parser.parse_args(argv)
    specs = {spec.name: spec for spec in load_pipelines()}
    kafka, iceberg = connect()
    if args.command in ("status", "validate"):
        statuses = [pipeline_status(spec, kafka, iceberg) for spec in specs.values()]
        if args.command == "status" and args.json:
            print(json.dumps(statuses, indent=2))
        elif args.command == "status":
            for item in statuses:
                print_status(item)
        blocking = [s for s in statuses if "group_id_consistency" in s["failing_checks"]]
        for item in blocking if args.command == "validate" else []:
            print(f"{item['pipeline']}: {item['failing_checks']['group_id_consistency']}")
        if args.command == "validate" and not blocking:
            print(f"{len(statuses)} pipeline(s) valid: specs, Kafka, catalog and group ids agree")
        return 1 if args.command == "validate" and blocking else 0
    from platform_assets import operations

    return operations.run_command(args, specs[args.pipeline], kafka, iceberg)


if __name__ == "__main__":
    sys.exit(main())
