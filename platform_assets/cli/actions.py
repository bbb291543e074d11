"""The operator actions of the ``platform`` CLI: reset, migrate-group, maintain, failover,
complete-failback.

Each commit of an action first counts the pipeline's active Dagster runs (see
:func:`count_active_ingestion_runs`) and refuses while one may be alive, naming them;
``clear-dead-runs`` marks failed those whose process is provably gone. ``reset --apply`` and
``migrate-group`` then hold the pipeline as the operator jobs do (:func:`holding`): a stream
worker serving it stops its lane between two commits, instead of the command racing it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ingestion.exceptions import OperationRefusedError
from ingestion.kafka.ranges import Key
from ingestion.ops.maintenance import MAINTENANCE_STEPS
from ingestion.ops.retention import orphan_window_hours, snapshot_retention_hours
from ingestion.spec.pipeline import PipelineSpec, StartingPosition
from platform_assets.ingest.jobs import (
    OPERATOR_HOLD_LIMIT,
    operator_action_in_progress,
    operator_runs,
)
from platform_assets.ingest.liveness import clear_dead_runs
from platform_assets.operations.actions import (
    hold_ingestion,
    ingestion_runs,
    maintain_pipeline_table,
    migrate_group_offsets,
    refusal_naming_runs,
    reset_offsets,
)
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def dagster_home(iceberg: IcebergCatalogResource) -> str:
    """``$DAGSTER_HOME``, else the embedded stack's instance (``make dev``), else ''; '' too
    while its storage has not been created (the CLI opens an instance, never creates one:
    ``platform_assets.instance``)."""
    from platform_assets.instance import storage_exists

    home = os.environ.get("DAGSTER_HOME") or ""
    if not home:
        default = iceberg.embedded_state_dir() / "dagster_home"
        embedded = iceberg.source() == "embedded" and (default / "dagster.yaml").is_file()
        home = str(default) if embedded else ""
    return home if home and storage_exists(Path(home)) else ""


def audit_cursor(spec: PipelineSpec, iceberg: IcebergCatalogResource) -> tuple[int | None, str]:
    """The exactly-once audit's cursor from the Dagster instance (expiry keeps the commits
    after it, R47), and a line saying where it was read."""
    from dagster import AssetCheckKey, DagsterInstance

    from ingestion.health.checks import AUDIT_CHECK
    from platform_assets.ingest.checks import previous_audit_memory
    from platform_assets.pipelines import table_key

    home = dagster_home(iceberg)
    if not home:
        return None, (
            "the audit's cursor is unknown (no Dagster instance: DAGSTER_HOME is unset): "
            "commits it has not recounted yet may be expired"
        )
    with DagsterInstance.from_config(home) as instance:
        key = AssetCheckKey(table_key(spec), AUDIT_CHECK.name)
        memory = previous_audit_memory(instance, key)
    cursor = memory.cursor if memory else None
    return cursor, f"kept the commits after the audit's cursor ({cursor or 'none yet'})"


CLI_ACTION_JOB = "platform_cli"
"""The job name of the run record a CLI action adds while it holds a pipeline: it is listed
among the instance's runs while the command acts and deleted when it ends."""
CLI_HOLD_WAIT_SECONDS = 120.0  # as the operator jobs' wait_for_runs_seconds


@contextmanager
def holding(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, command: str
) -> Iterator[tuple[int, str]]:
    """Count the pipeline's active runs (refusing while one may be alive:
    :func:`count_active_ingestion_runs`), then, with a Dagster instance, hold the pipeline
    while the body acts, as the operator jobs do (``hold_ingestion``): a run record of
    :data:`CLI_ACTION_JOB` marked as acting on it, so no run is launched for it and a stream
    worker stops its lane between two commits (waiting up to 120 s for it); the record is
    deleted when the body ends (SIGTERM too: it ends the body first). Without it a stream
    commits every few seconds and the command's compare-and-set loses to it again and again
    (measured: 10 attempts in a row on ``make dev``, scripts/dev_chaos.py). A command killed
    with SIGKILL leaves the record: it holds the pipeline for at most 20 minutes
    (``OPERATOR_HOLD_LIMIT``), and the next CLI action marks it failed."""
    from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

    active, counted = count_active_ingestion_runs(spec, iceberg)
    home = dagster_home(iceberg)
    if not home:
        yield active, counted
        return
    with DagsterInstance.from_config(home) as instance, terminating_cleanly():
        fail_stale_records(instance)
        record = instance.add_run(
            DagsterRun(
                job_name=CLI_ACTION_JOB,
                status=DagsterRunStatus.STARTED,
                tags={"platform/cli": command, "pipeline": spec.name},
            )
        )
        try:
            hold_ingestion(instance, record.run_id, spec, CLI_HOLD_WAIT_SECONDS)
            if record.run_id not in {r.run_id for r in operator_runs(instance, [spec.name])}:
                raise OperationRefusedError(  # its age is judged by this host's clock
                    f"pipeline {spec.name!r}: this command's hold (run record {record.run_id}) "
                    "is not seen as recent: this host's clock differs from the Dagster "
                    "instance's by more than 20 minutes; nothing was changed. Fix the clock, "
                    "or run the Dagster job instead"
                )
            yield active, f"{counted}; held it while acting (run record {record.run_id})"
        finally:
            try:
                instance.delete_run(record.run_id)
            except Exception as exc:  # the action's own outcome stands; say what is left
                print(
                    f"warning: run record {record.run_id} could not be deleted ({exc}); it "
                    "holds the pipeline for at most 20 minutes, or delete it in the UI"
                )


@contextmanager
def terminating_cleanly() -> Iterator[None]:
    """SIGTERM raises ``SystemExit`` here, so ``finally`` blocks run (a hold is released)."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (a test): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def fail_stale_records(instance: Any) -> None:
    """Mark failed the CLI hold records older than ``OPERATOR_HOLD_LIMIT`` still STARTED (their
    command was killed with SIGKILL): they no longer hold anything, but would keep a run slot."""
    from dagster import DagsterRunStatus, RunsFilter

    since = dt.datetime.now(dt.UTC) - OPERATOR_HOLD_LIMIT
    stale = instance.get_runs(
        RunsFilter(
            job_name=CLI_ACTION_JOB, statuses=[DagsterRunStatus.STARTED], created_before=since
        )
    )
    for run in stale:
        instance.report_run_failed(run, "a platform CLI command's hold whose command was killed")


def yield_to_operators(
    spec: PipelineSpec, iceberg: IcebergCatalogResource
) -> Callable[[], str | None] | None:
    """With a Dagster instance: what stops ``maintain``'s compaction while an operator action
    holds the pipeline (its commit goes first); None without one."""
    home = dagster_home(iceberg)
    if not home:
        return None

    def acting() -> str | None:
        from dagster import DagsterInstance

        with DagsterInstance.from_config(home) as instance:
            return operator_action_in_progress(instance, spec)

    return acting


def count_active_ingestion_runs(
    spec: PipelineSpec, iceberg: IcebergCatalogResource
) -> tuple[int, str]:
    """The pipeline's active ingestion runs in the Dagster instance, and a line saying where
    they were counted (0 without an instance: the action's compare-and-set is then the guard).

    Runs whose process is provably gone (``platform_assets.ingest.liveness``) do not count, and
    the line names them.

    Raises:
        OperationRefusedError: a run may still be alive; the message names each run (id, job,
            start) and the command that clears a dead one.
    """
    from dagster import DagsterInstance

    home = dagster_home(iceberg)
    if not home:
        return 0, (
            "active runs not counted (no Dagster instance: DAGSTER_HOME is unset); a run in "
            "flight aborts at its own commit instead (compare-and-set)"
        )
    with DagsterInstance.from_config(home) as instance:
        runs = ingestion_runs(instance, spec)
    if any(not run.dead for run in runs):
        raise OperationRefusedError(refusal_naming_runs(spec, runs, "run this command"))
    line = f"0 active ingestion run(s) of {spec.name!r} in the Dagster instance {home}"
    dead = [run.describe() for run in runs]
    if dead:
        line += (
            f"; ignored {len(dead)} run(s) whose process is gone ({'; '.join(dead)}): "
            f"`platform clear-dead-runs {spec.name}` marks them failed"
        )
    return 0, line


def clear_dead_ingestion_runs(
    spec: PipelineSpec, iceberg: IcebergCatalogResource, apply: bool = True
) -> list[str]:
    """``platform clear-dead-runs``: mark failed the pipeline's active ingestion runs whose
    process is provably gone; name the others, which are left alone. Without ``apply``, name
    the runs it would mark failed and change nothing."""
    from dagster import DagsterInstance

    home = dagster_home(iceberg)
    if not home:
        raise OperationRefusedError("no Dagster instance: set DAGSTER_HOME to the instance's")
    with DagsterInstance.from_config(home) as instance:
        runs = ingestion_runs(instance, spec)
        cleared = clear_dead_runs(instance, runs) if apply else [r for r in runs if r.dead]
    marked = "marked failed" if apply else "would mark failed"
    lines = [f"{marked}: {run.describe()}" for run in cleared]
    lines += [
        f"left alone (it may be alive: another host, no process record, or running): "
        f"{run.describe()}"
        for run in runs
        if not run.dead
    ]
    lines = lines or [f"no active ingestion run of {spec.name!r} in the Dagster instance {home}"]
    return lines if apply else [*lines, "dry run: nothing changed (add --apply)"]


def parse_position(text: str) -> StartingPosition:
    """``earliest``, ``latest`` or ``timestamp:<ms>`` (``--to``, the older spelling)."""
    if text.startswith("timestamp:"):
        return StartingPosition(mode="timestamp", timestamp_ms=int(text.split(":", 1)[1]))
    if text not in ("earliest", "latest"):
        raise OperationRefusedError(f"--to {text!r}: use earliest, latest or timestamp:<epoch-ms>")
    return StartingPosition(mode=text)  # type: ignore[arg-type]


def parse_datetime(text: str) -> int:
    """Epoch milliseconds of an ISO-8601 date-time (``Z`` or an offset; none: UTC), as
    kafka-consumer-groups' ``--to-datetime`` takes it.

    Example:
        >>> parse_datetime("2026-11-28T06:00:00Z"), parse_datetime("2026-11-28T07:00+01:00")
        (1795845600000, 1795845600000)
    """
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OperationRefusedError(
            f"--to-datetime {text!r} is not an ISO-8601 date-time, e.g. 2026-11-28T06:00:00Z"
        ) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_partitions(values: list[str] | None) -> frozenset[Key] | None:
    """``--topic t`` (every partition of t: resolved against Kafka by ``partitions_of``) or
    ``--topic t:0,2``, as kafka-consumer-groups takes them; None: every partition."""
    if not values:
        return None
    chosen: set[Key] = set()
    for value in values:
        topic, _, parts = value.rpartition(":") if ":" in value else (value, "", "")
        if not parts:
            chosen.add((value, -1))  # every partition of the topic
            continue
        try:
            chosen |= {(topic, int(part)) for part in parts.split(",")}
        except ValueError:
            raise OperationRefusedError(
                f"--topic {value!r}: use TOPIC or TOPIC:PARTITION[,PARTITION...]"
            ) from None
    return frozenset(chosen)


def reset_request(args: argparse.Namespace, spec: PipelineSpec, kafka: KafkaResource) -> Any:
    """The :class:`~ingestion.ops.reset.ResetRequest` of ``platform reset``'s options (or the
    one ``rollback`` resolved)."""
    from ingestion.ops.reset import ResetRequest

    if getattr(args, "request", None) is not None:
        return args.request

    chosen = parse_partitions(args.topic)
    if chosen is not None and any(p < 0 for _, p in chosen):  # whole topics: their partitions
        metadata = kafka.get_admin_client().list_topics(timeout=10).topics
        whole = {t for t, p in chosen if p < 0}
        missing = sorted(t for t in whole if t not in metadata)
        if missing:
            raise OperationRefusedError(f"--topic {missing}: no such topic in Kafka")
        chosen = frozenset(
            {(t, p) for t, p in chosen if p >= 0}
            | {(t, p) for t in whole for p in metadata[t].partitions}
        )
    if args.to_earliest or args.to_latest:
        position = StartingPosition(mode="earliest" if args.to_earliest else "latest")
    elif args.to_datetime:
        position = StartingPosition(mode="timestamp", timestamp_ms=parse_datetime(args.to_datetime))
    elif args.to:
        position = parse_position(args.to)
    else:
        position = StartingPosition()
    return ResetRequest(position, args.to_offset, args.shift_by, chosen)


# Commands of the disaster-recovery add-on (platform_assets.dr.actions).
DR_COMMANDS = ("failover", "complete-failback", "release-late-copies")


def run_action(
    args: argparse.Namespace,
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
) -> list[str]:
    """Run ``reset``, ``rollback``, ``migrate-group``, ``maintain``, ``failover``,
    ``complete-failback``, ``release-late-copies`` or ``clear-dead-runs``; return the lines to
    print. Each is a dry run
    (it changes nothing and says what it would do) unless ``args.apply``."""
    if args.command == "maintain":
        retention = args.retention_hours
        window = args.orphan_window_hours
        steps = [step.strip() for step in args.steps.split(",") if step.strip()]
        unknown = sorted(set(steps) - set(MAINTENANCE_STEPS))
        if unknown or not steps:
            raise OperationRefusedError(
                f"--steps {args.steps!r}: choose among {', '.join(MAINTENANCE_STEPS)}"
            )
        cursor, where = audit_cursor(spec, iceberg)
        lines = maintain_pipeline_table(
            spec,
            iceberg,
            (snapshot_retention_hours(spec) if retention is None else retention) * 3600,
            (orphan_window_hours(spec) if window is None else window) * 3600,
            keep_after=cursor,
            yield_to=yield_to_operators(spec, iceberg),
            steps=steps,
            dry_run=not args.apply,
        )
        return [where, *lines]
    if args.command == "clear-dead-runs":
        return clear_dead_ingestion_runs(spec, iceberg, apply=args.apply)
    if args.command in DR_COMMANDS:  # the disaster-recovery add-on, loaded when asked for
        from platform_assets.dr.actions import run_dr_action

        return run_dr_action(args, spec, kafka, iceberg, count_active_ingestion_runs)
    if args.command == "rollback":  # a reset to where one of its commits left the offsets
        from ingestion.ops.reset import rollback_request

        table = iceberg.load_catalog().load_table(spec.table)
        args.request = rollback_request(table, spec.consumer_group_id, args.to_snapshot)
        args.command = "reset"
    if args.command == "reset" and not args.apply:
        request = reset_request(args, spec, kafka)
        return reset_offsets(spec, kafka, iceberg, request, False, args.by, args.reason)
    if args.command == "migrate-group" and not args.apply:
        return migrate_group_offsets(
            spec, kafka, iceberg, args.new_group, args.by, args.reason, apply=False
        )
    with holding(spec, iceberg, args.command) as (active, counted):
        if args.command == "reset":
            request = reset_request(args, spec, kafka)
            lines = reset_offsets(
                spec, kafka, iceberg, request, True, args.by, args.reason, active_runs=active
            )
        else:
            lines = migrate_group_offsets(
                spec, kafka, iceberg, args.new_group, args.by, args.reason, active_runs=active
            )
    return [counted, *lines]
