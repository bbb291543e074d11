"""Schedules: topic observation, fallback ingestion and table maintenance for every pipeline
(one schedule per cron, not per pipeline), periodic checks."""

import hashlib
from collections.abc import Sequence

from dagster import (
    DagsterInstance,
    DefaultScheduleStatus,
    JobDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ingestion.health.checks import check_group_consistency
from ingestion.ops.retention import FREQUENT_MAINTENANCE_CRON, maintenance_cron
from ingestion.spec.pipeline import PipelineSpec
from platform_assets.ingest.jobs import (
    ACTIVE_RUN_STATUSES,
    AssetJob,
    ingestion_check_keys,
    operator_holds,
)
from platform_assets.ingest.liveness import active_runs, clear_dead_runs
from platform_assets.ingest.sensors import Busy, blocked_reason
from platform_assets.operations.jobs import MAINTAIN_JOB, MAINTAIN_OP
from platform_assets.pipelines import ingestion_keys
from platform_assets.state import StateReader
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


def schedule_suffix(cron: str) -> str:
    """A stable name part for a cron string (schedule names allow letters, digits and ``_``).

    Example:
        >>> schedule_suffix("*/15 * * * *") == schedule_suffix("*/15 * * * *")
        True
        >>> len(schedule_suffix("0 3 * * *"))
        8
    """
    return hashlib.sha256(cron.encode()).hexdigest()[:8]


def build_fallback_schedules(
    specs: Sequence[PipelineSpec], job: AssetJob
) -> list[ScheduleDefinition]:
    """One schedule per distinct ``fallback_cron`` (usually one: ``fallback_schedule``): on its
    cron, a run of ``ingest_all`` (``job``) selecting one pipeline, for each pipeline on that
    cron, even if the lag sensor is off (an idle pipeline commits nothing). A pipeline is left
    out while a run or a stream worker ingests it, an operator action holds it, or its blocking
    group-id check fails (its step could only fail). Each tick reads the pipelines' states in
    one pass (``StateReader``); one whose state cannot be read is left out and named in the
    tick's log (the lag sensor alerts it: ``state_unreadable``).

    One run per pipeline, not one for all: a run holds a slot of each pool it uses until it
    ends (``pools: granularity: run``), so a run of many pipelines would hold every one of them
    behind the slowest, and wait until all their pools are free at once."""
    by_cron: dict[str, list[PipelineSpec]] = {}
    for spec in specs:
        by_cron.setdefault(spec.fallback_cron, []).append(spec)
    default = PipelineSpec.model_fields["fallback_cron"].default
    return [
        build_fallback_schedule(
            "fallback_schedule"
            if cron == default
            else f"fallback_schedule_{schedule_suffix(cron)}",
            cron,
            group,
            job,
        )
        for cron, group in sorted(by_cron.items())
    ]


def build_fallback_schedule(
    name: str, cron: str, specs: Sequence[PipelineSpec], job: AssetJob
) -> ScheduleDefinition:
    """The fallback schedule of the pipelines on ``cron`` (``build_fallback_schedules``)."""
    names = ", ".join(sorted(spec.name for spec in specs))

    @schedule(
        name=name,
        job=job,
        cron_schedule=cron,
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Ingests {names} on {cron!r} (a run each), but those blocked, held or "
        "already being ingested.",
    )
    def _fallback(
        context: ScheduleEvaluationContext, kafka: KafkaResource, iceberg: IcebergCatalogResource
    ) -> list[RunRequest] | SkipReason:
        busy = Busy.read(context.instance, specs)
        held = operator_holds(context.instance, [spec.name for spec in specs])
        due, lines = [], []
        with StateReader(kafka, iceberg) as reader:
            for spec in specs:
                if busy.ingesting(context.instance, spec):
                    lines.append(f"{spec.name!r} is being ingested (a run or a stream worker)")
                    continue
                if spec.name in held:
                    lines.append(
                        f"{spec.name!r}: operator action in progress (run {held[spec.name]})"
                    )
                    continue
                try:
                    finding = check_group_consistency(reader.read(spec))
                except Exception as exc:
                    context.log.error(f"{spec.name}: its state could not be read: {exc}")
                    lines.append(f"{spec.name!r}: state unreadable ({exc})")
                    continue
                if finding.blocks:
                    lines.append(blocked_reason(spec, finding))
                    continue
                due.append(spec)
        for line in lines:
            context.log.info(line)
        if not due:
            return SkipReason("\n".join(lines) or "no pipeline")
        return [
            RunRequest(
                run_key=spec.name,  # one run per pipeline and tick (Dagster scopes it per tick)
                asset_selection=ingestion_keys(spec),
                asset_check_keys=ingestion_check_keys(spec),
                tags={"trigger": name, "pipeline": spec.name},
            )
            for spec in due
        ]

    return _fallback


def build_maintenance_schedules(specs: Sequence[PipelineSpec]) -> list[ScheduleDefinition]:
    """Maintain the tables of every pipeline in one run per ``maintenance_cron``: compaction,
    expiry keeping the retention of ``snapshot_retention_hours`` and the offsets watermark
    (rule 7), orphan removal (``ingestion.ops.retention``; the ``maintain_tables`` job, as from
    the UI or the CLI). Two schedules at most: ``maintenance_schedule`` every 15 minutes for the
    streams and the pipelines with a freshness target, ``daily_maintenance_schedule`` for the
    others; the run maintains its pipelines one after the other, each on its own.

    It runs while a stream is alive (a stream never ends by itself, and maintenance takes no
    ingestion pool): every step is a compare-and-set against a concurrent commit (R41, R43).
    It skips while its previous run is still queued or in progress, and leaves out a pipeline
    whose table does not exist yet (the pipeline's first run creates it).
    """
    by_cron: dict[str, list[PipelineSpec]] = {}
    for spec in specs:
        by_cron.setdefault(maintenance_cron(spec), []).append(spec)
    return [
        build_maintenance_schedule(
            "maintenance_schedule"
            if cron == FREQUENT_MAINTENANCE_CRON
            else "daily_maintenance_schedule",
            cron,
            group,
        )
        for cron, group in sorted(by_cron.items())
    ]


def build_maintenance_schedule(
    name: str, cron: str, specs: Sequence[PipelineSpec]
) -> ScheduleDefinition:
    """One maintenance schedule (``build_maintenance_schedules``)."""
    names = ", ".join(sorted(spec.name for spec in specs))

    @schedule(
        name=name,
        job_name=MAINTAIN_JOB,
        cron_schedule=cron,
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Maintains the tables of {names} in one run: compaction, expiry of "
        "snapshots past each one's retention (keeping the offsets), orphan removal.",
    )
    def _maintenance(
        context: ScheduleEvaluationContext, iceberg: IcebergCatalogResource
    ) -> RunRequest | SkipReason:
        if previous := active_maintenance(context.instance, name):
            return SkipReason(f"{name}'s previous run is still running ({previous})")
        catalog = iceberg.load_catalog()
        due = [spec.name for spec in specs if catalog.table_exists(spec.table)]
        if not due:
            return SkipReason(f"no table of {names} exists yet: nothing to maintain")
        config = {"pipelines": due, "compact": True}
        return RunRequest(
            run_config={"ops": {MAINTAIN_OP: {"config": config}}},
            tags={"trigger": name, "pipelines": ", ".join(due)[:1000]},
        )

    return _maintenance


def active_maintenance(instance: DagsterInstance, trigger: str) -> str | None:
    """The id of a ``maintain_tables`` run ``trigger`` launched that is queued or in progress
    and may be alive; a run whose process is provably gone (killed: it records its process,
    ``platform_assets.ingest.liveness``) is marked failed instead, so one killed run does not
    stop the schedule for good."""
    runs = active_runs(instance, [MAINTAIN_JOB], list(ACTIVE_RUN_STATUSES))
    clear_dead_runs(instance, [run for run in runs if run.dead], by=f"the {trigger} schedule")
    for run in runs:
        found = None if run.dead else instance.get_run_by_id(run.run_id)
        if found is not None and found.tags.get("trigger") == trigger:
            return run.run_id
    return None


CHECKS_SCHEDULE = "run_checks_every_5_minutes"
CHECKS_INTERVAL_SECONDS = 300
"""How often :data:`CHECKS_SCHEDULE` evaluates the checks (the exactly-once audit among them);
``platform status`` calls a recorded audit verdict older than twice this stale."""


def build_checks_schedule(job: AssetJob) -> ScheduleDefinition:
    """Evaluate the checks every five minutes, so freshness fails even when nothing runs."""
    return ScheduleDefinition(
        name=CHECKS_SCHEDULE,
        job=job,
        cron_schedule=f"*/{CHECKS_INTERVAL_SECONDS // 60} * * * *",
        default_status=DefaultScheduleStatus.RUNNING,
    )
