"""Operator actions shared by the CLI and the Dagster operation jobs: reset, migrate, maintain.

Each returns the lines that describe what it did; the caller prints or records them."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from dagster import DagsterInstance

from ingestion.exceptions import OperationRefusedError
from ingestion.ops.maintenance import MAINTENANCE_STEPS, maintain_pipeline
from ingestion.ops.reset import apply_reset, migrate_group, plan_reset
from ingestion.spec.pipeline import PipelineSpec
from ingestion.table.offsets import find_committed_state, flatten
from platform_assets.ingest.jobs import ACTIVE_RUN_STATUSES, OPERATOR_TAG
from platform_assets.ingest.liveness import ActiveRun, active_runs
from platform_assets.pipelines import INGEST_ALL_JOB, ingest_job_name, ingests
from platform_assets.route import PRIMARY, active_route
from platform_assets.streaming.jobs import active_stream_runs
from resources.iceberg import IcebergCatalogResource
from resources.kafka import KafkaResource


def ingestion_runs(instance: DagsterInstance, spec: PipelineSpec) -> list[ActiveRun]:
    """Runs queued or in progress that may ingest ``spec`` (its own job, and ``ingest_all``
    unless the run selected other pipelines only, as ``fallback_schedule``'s do), each judged
    alive or provably dead (``platform_assets.ingest.liveness``)."""
    runs = active_runs(instance, [ingest_job_name(spec), INGEST_ALL_JOB], list(ACTIVE_RUN_STATUSES))
    return [run for run in runs if ingests(run.job_name, run.assets, spec)]


def count_ingestion_runs(instance: DagsterInstance, spec: PipelineSpec) -> int:
    """Runs queued or in progress that may ingest ``spec``, but those whose process is provably
    gone (killed): a run that may be alive counts."""
    return sum(1 for run in ingestion_runs(instance, spec) if not run.dead)


def refusal_naming_runs(spec: PipelineSpec, runs: list[ActiveRun], action: str) -> str:
    """Why ``action`` is refused while ``runs`` may be alive: each run, and how to clear it."""
    alive = [run for run in runs if not run.dead]
    named = "; ".join(run.describe() for run in alive)
    return (
        f"pipeline {spec.name!r}: {len(alive)} ingestion run(s) in progress ({named}); nothing "
        f"was changed. Wait for them, or stop them (a stream run: stop its stream sensor "
        f"first), then {action} again. A run whose process was killed (SIGKILL, OOM) stays "
        "STARTED in Dagster: `platform clear-dead-runs "
        f"{spec.name}` marks it failed when it can prove its process is gone (a run on this "
        "host); otherwise, once you know it is gone, mark it failed in the Dagster UI (the "
        "run's Terminate, then 'Force termination immediately'), and turn on run_monitoring "
        "in dagster.yaml (docs/production.md)"
    )


def hold_ingestion(
    instance: DagsterInstance, run_id: str, spec: PipelineSpec, wait_s: float, poll_s: float = 1.0
) -> int:
    """Mark operator run ``run_id`` as acting on ``spec`` and wait up to ``wait_s`` for the
    pipeline's ingestion to pause; return 0, or refuse (``OperationRefusedError``, nothing
    changed) when something still ingests it after the wait.

    The mark holds the pipeline (``platform_assets.ingest.jobs.operator_holds``): its lag sensor
    launches no ingestion run, the stream sensor assigns it to no worker, and a stream worker
    serving it stops its lane between two commits and starts none while the mark lasts (the
    other pipelines of the worker keep streaming). This waits for the runs in progress to end and
    for no worker to serve the pipeline (``stream/serving``). An action racing a stream would
    otherwise lose to its next commit (a failover re-reads offsets the stream keeps moving).

    The order closes the race with a lane about to start: the worker publishes a lane in
    ``stream/serving`` before it reads the holds and starts it, this marks before it reads
    ``stream/serving``; so either this sees the lane and waits, or the worker sees the mark. A
    run that slips in after the wait (a request the lag sensor made before the mark) meets the
    compare-and-set of the offsets: one of the two commits fails, nothing lands twice (rule 1).
    """
    instance.add_run_tags(run_id, {OPERATOR_TAG: spec.name})
    deadline = time.monotonic() + wait_s
    streams = active_stream_runs(instance, spec)
    runs = ingestion_runs(instance, spec)
    while (any(not run.dead for run in runs) or streams) and time.monotonic() < deadline:
        time.sleep(poll_s)
        runs = ingestion_runs(instance, spec)
        streams = active_stream_runs(instance, spec)
    if any(not run.dead for run in runs):  # the same list counts and names them
        raise OperationRefusedError(
            f"after waiting {wait_s:g} s (config wait_for_runs_seconds): "
            + refusal_naming_runs(spec, runs, "run the action")
        )
    if streams:
        raise OperationRefusedError(
            f"pipeline {spec.name!r}: stream worker run(s) {[r.run_id for r in streams]} still "
            f"stream it {wait_s:g} s after this action held it (config "
            "wait_for_runs_seconds); nothing was changed. A lane stops between two commits: "
            "raise the wait above one catch-up iteration, or, if the worker's process is gone, "
            "wait for the stream sensor to mark it failed (its heartbeat stops), then run the "
            "action again. The pipeline streams again once no operator action holds it."
        )
    return 0


def refuse_off_route(
    spec: PipelineSpec, kafka: KafkaResource, iceberg: IcebergCatalogResource, action: str
) -> None:
    """Refuse ``action`` on a pipeline that a failover moved off its configured cluster or
    topics: reset and migration address the spec's own topics on the primary, so on a moved
    route they would silently switch it back without a failback plan (records produced only on
    the replica skipped) or stall on topics the route no longer reads."""
    route = active_route(spec, kafka, iceberg)
    if route.cluster != PRIMARY or route.spec.source_topics != spec.source_topics:
        way_back = (
            f"`platform complete-failback {spec.name} --reason ...` once its reverse copies are "
            "drained to end the route"
            if route.cluster == PRIMARY
            else f"`platform failover {spec.name} --to ...` to move it"
        )
        raise OperationRefusedError(
            f"pipeline {spec.name!r} reads {route.spec.source_topics} on {route.cluster!r} since "
            f"a failover; {action} is not supported on a moved route. Use {way_back}, then "
            f"{action}."
        )


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
    """Plan (and with ``apply``, commit) a reset, then move the Kafka group to the table's
    offsets; return the lines describing it."""
    refuse_off_route(spec, kafka, iceberg, "reset")
    catalog = iceberg.load_catalog()
    consumer = kafka.get_consumer()
    admin = kafka.get_admin_client()
    try:
        reset = plan_reset(spec, catalog.load_table(spec.table), admin, consumer, position)
    finally:
        consumer.close()
    lines = reset.describe()
    if not apply:
        return [*lines, "dry run: nothing committed (add --apply)"]
    outcome = apply_reset(
        catalog,
        spec,
        reset,
        kafka.get_cluster_id(),
        requested_by,
        reason,
        active_runs,
        admin=admin,
        kafka_config=kafka.client_config(),
    )
    assert outcome.mirror is not None
    committed = f"committed in snapshot {outcome.snapshot_id}"
    return [*lines, *outcome.notes, committed, outcome.mirror.describe()]


def migrate_group_offsets(
    spec: PipelineSpec,
    kafka: KafkaResource,
    iceberg: IcebergCatalogResource,
    new_group: str,
    requested_by: str,
    reason: str,
    active_runs: int = 0,
    apply: bool = True,
) -> list[str]:
    """Carry the offsets to ``new_group`` (one commit); return the lines describing it. A dry
    run (``apply`` false) says what it would carry and commits nothing."""
    refuse_off_route(spec, kafka, iceberg, "migrate-group")
    if not apply:
        table = iceberg.load_catalog().load_table(spec.table)
        committed = find_committed_state(table, spec.consumer_group_id)
        if committed is None:
            raise OperationRefusedError(
                f"pipeline {spec.name!r}: group {spec.consumer_group_id!r} has no offsets in "
                f"{spec.table} to carry"
            )
        offsets = ", ".join(
            f"{t}[{p}]={o}" for (t, p), o in sorted(flatten(committed.offsets).items())
        )
        return [
            f"would carry {spec.consumer_group_id!r}'s offsets ({offsets}) to {new_group!r} in "
            f"one commit and retire {spec.consumer_group_id!r}",
            "dry run: nothing committed (add --apply)",
        ]
    migration = migrate_group(
        iceberg.load_catalog(),
        spec,
        new_group,
        kafka.get_admin_client(),
        requested_by,
        reason,
        active_runs,
        kafka_config=kafka.client_config(),
    )
    return [
        f"offsets carried to {new_group!r} in snapshot {migration.snapshot_id}; "
        f"{spec.consumer_group_id!r} is retired (runs under it are refused)",
        migration.mirror.describe(),
        f"old Kafka group {spec.consumer_group_id!r} left as is: {migration.old_group_offsets}",
        f"now set consumer_group_id: {new_group} for pipeline {spec.name!r}",
    ]


def maintain_pipeline_table(
    spec: PipelineSpec,
    iceberg: IcebergCatalogResource,
    retention_s: float,
    orphan_window_s: float,
    keep_after: int | None = None,
    yield_to: Callable[[], str | None] | None = None,
    steps: Collection[str] = MAINTENANCE_STEPS,
    dry_run: bool = False,
) -> list[str]:
    """Compact, expire and remove orphans on the pipeline's table (keeping the current group's
    watermark and the commits after the audit's cursor ``keep_after``; compaction stops when
    ``yield_to`` gives a reason); return the lines describing what was done and what failed."""
    catalog = iceberg.load_catalog()
    report = maintain_pipeline(
        catalog,
        spec,
        retention_s,
        orphan_window_s,
        keep_after=keep_after,
        yield_to=yield_to,
        steps=steps,
        dry_run=dry_run,
    )
    return report.describe()
